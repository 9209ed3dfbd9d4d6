"""The shipped PBS and Slurm launch scripts, run as they are, with small stand-ins for the
scheduler's launcher (``srun``, ``mpiexec``), for ``vllm serve`` (swarm-sim) and for
``hostname``. What is tested is the scripts' own logic: one worker per node against that node's
endpoints, the hostfile filters, and a job that outlives an allocation cut short by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from swarm_queue.common.embedded import free_port
from swarm_queue.common.store.resultfields import split_chunk
from swarm_queue.sim.launch import launch
from swarm_queue.sim.text import completion_for
from tests.harness import BIN
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent

STUBS = {
    # Slurm's srun on a one-node allocation: drop srun's own options, run the task once.
    "srun": """
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
exec "$@"
""",
    # PBS's mpiexec: -n tasks of the command, all at once; fails if any task fails.
    "mpiexec": """
n=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in -n) n=$2; shift 2 ;; --ppn) shift 2 ;; *) shift ;; esac
done
pids=()
for ((i = 0; i < n; i++)); do "$@" & pids+=($!); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
""",
    # `vllm serve MODEL --port P ...`: swarm-sim serving MODEL on port P.
    "vllm": f"""
model=$2; shift 2; port=
while [[ $# -gt 0 ]]; do case $1 in --port) port=$2; shift 2 ;; *) shift ;; esac; done
exec {sys.executable} -m swarm_queue.sim --ports "$port" --model "$model" $SIM_ARGS
""",
    # Every "node" of these allocations is this machine, under a name that resolves anywhere.
    "hostname": "echo localhost\n",
}


@pytest.fixture
def hpc_env(tmp_path: Path, redis_url: str, prefix: str) -> dict[str, str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        path = stubs / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    return {
        **e,
        "PATH": f"{stubs}:{e['PATH']}",
        "SWARM_REDIS_URL": redis_url,
        "SWARM_PREFIX": prefix,
        "SWARM_VENV": str(VENV),
        "SWARM_BACKOFF_CAP_S": "0.5",
    }


def _enqueue(env: dict[str, str], tmp_path: Path, job: str, n: int, max_tokens: int) -> None:
    src = tmp_path / f"{job}.txt"
    src.write_text("".join(f"question {i} for {job}\n" for i in range(n)))
    subprocess.run(
        [BIN / "swarm-enqueue", src, "--job", job, "--max-tokens", str(max_tokens)],
        env=env,
        check=True,
        capture_output=True,
    )


def _collect(env: dict[str, str], tmp_path: Path, job: str) -> list[dict[str, Any]]:
    out = tmp_path / f"{job}.jsonl"
    run = subprocess.run(
        [BIN / "swarm-collect", job, "--out", out],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_slurm_job_outlives_an_allocation_cut_short(
    hpc_env: dict[str, str], tmp_path: Path, client: redis.Redis, prefix: str
) -> None:
    meta = f"{prefix}:{{long}}:meta"

    def done() -> int:
        return int(client.hget(meta, "done") or 0)

    n, max_tokens = 3000, 32
    _enqueue(hpc_env, tmp_path, "long", n, max_tokens)
    env = {
        **hpc_env,
        "MODEL": "org/served-model",
        "SIM_ARGS": "--step-ms 4",  # slow enough that the first allocation cannot finish
    }
    script = REPO / "examples" / "slurm" / "swarm-workers.sbatch"

    first = subprocess.Popen(
        ["bash", script], env=env, cwd=tmp_path, start_new_session=True, stderr=subprocess.PIPE
    )
    wait_until("first results", lambda: done() > 0)
    os.killpg(first.pid, signal.SIGTERM)  # the walltime: Slurm signals every process of the job
    _, first_log = first.communicate(timeout=60)
    assert b"SIGTERM received: stopping the worker" in first_log
    worker_log = (tmp_path / "logs" / "localhost" / "worker.log").read_text()
    assert "stopping: finishing batches in flight" in worker_log  # a graceful stop, no crash
    cut_at = done()
    assert 0 < cut_at < n

    second = subprocess.run(
        ["bash", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert done() == n  # each prompt counted once
    lines = _collect(hpc_env, tmp_path, "long")
    assert [x["index"] for x in lines] == list(range(n))
    assert all(
        x["text"] == completion_for(f"question {x['index']} for long", max_tokens)[0] for x in lines
    )
    # The script's model reached the server, and its log went where the script says.
    assert (tmp_path / "logs" / "localhost" / "engine-0.log").exists()
    results, chunk = f"{prefix}:{{long}}:results", int(client.hget(meta, "chunk") or 1)
    raw = client.hget(results, "0")  # (its own field, or its chunk's)
    sample = msgspec.msgpack.decode(raw or split_chunk(client.hget(results, "c0"), chunk)[0])
    assert sample["model"] == "org/served-model"


def _pbs_env(hpc_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A PBS job's environment on one node (two slots: one task): the Redis URL in a file
    (swarm.env, readable by others until a test makes it its owner's), never from qsub -v
    (qstat -f shows those)."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n")
    secrets = tmp_path / "swarm.env"
    secrets.write_text(f"export SWARM_REDIS_URL='{hpc_env['SWARM_REDIS_URL']}'\n")
    secrets.chmod(0o644)
    return {
        **{k: v for k, v in hpc_env.items() if k != "SWARM_REDIS_URL"},
        "SWARM_ENV_FILE": str(secrets),
        "PBS_O_WORKDIR": str(tmp_path),
        "PBS_NODEFILE": str(nodefile),
    }


def test_pbs_workers_take_their_own_hosts_endpoints_with_the_tag_asked_for(
    hpc_env: dict[str, str], tmp_path: Path
) -> None:
    ports = [free_port() for _ in range(3)]
    sim = launch(ports)
    try:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(
            f"localhost\t{ports[0]}\tmodel=8b\n"
            f"localhost\t{ports[1]}\tmodel=70b\n"  # another model: not this job's tag
            f"othernode\t{ports[2]}\tmodel=8b\n"  # another node: its own worker's
        )
        _enqueue(hpc_env, tmp_path, "tagged", 500, 8)
        env = {
            **_pbs_env(hpc_env, tmp_path),
            "SWARM_HOSTFILE": str(hostfile),
            "SWARM_ENDPOINT_TAG": "model=8b",
        }
        script = ["bash", REPO / "examples" / "pbs" / "swarm-workers.pbs"]
        loose = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
        assert loose.returncode == 2
        assert "holds a password and others may read it: chmod 600 it" in loose.stderr
        (tmp_path / "swarm.env").chmod(0o600)
        run = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        lines = _collect(hpc_env, tmp_path, "tagged")
        assert len(lines) == 500 and all(x["error"] is None for x in lines)
        assert {x["endpoint"] for x in lines} == {f"http://localhost:{ports[0]}"}
        status = subprocess.run(
            [BIN / "swarm-status", "tagged"], env=hpc_env, capture_output=True, text=True
        )
        rows = [line.split() for line in status.stdout.splitlines() if "http://" in line]
        # One row: this node's worker and its one endpoint; its last word is "finished" or,
        # when the burst worker exited first, "stopped".
        assert [(row[0], row[1], row[3]) for row in rows] == [
            (f"http://localhost:{ports[0]}", "localhost", "500")
        ]
        assert rows[0][2] in ("finished", "stopped")
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def test_pbs_nodes_start_an_engine_per_device_and_drain_the_job(
    hpc_env: dict[str, str], tmp_path: Path
) -> None:
    _enqueue(hpc_env, tmp_path, "tiles", 400, 8)
    env = {
        **_pbs_env(hpc_env, tmp_path),
        "MODEL": "org/tile-model",
        "ENGINES": "3",
        "SIM_ARGS": "--step-ms 2",
    }
    (tmp_path / "swarm.env").chmod(0o600)
    run = subprocess.run(
        ["bash", REPO / "examples" / "pbs" / "swarm-node.pbs"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    # Three engines, one per tile (which of them answered what is the fleet's to decide: under
    # load one comes up after the others drained the job).
    assert run.stderr.count("healthy after") == 3
    lines = _collect(hpc_env, tmp_path, "tiles")
    assert len(lines) == 400 and all(x["error"] is None for x in lines)
    assert {x["model"] for x in lines} == {"org/tile-model"}
    logs = tmp_path / "logs" / "localhost"
    assert sorted(p.name for p in logs.iterdir()) == [
        "engine-0.log", "engine-1.log", "engine-2.log", "worker.log",
    ]  # fmt: skip
