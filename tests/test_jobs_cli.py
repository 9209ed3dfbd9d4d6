"""swarm-jobs (list, delete finished) and swarm-status --watch, through the real commands."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from swarm_queue.common.fleet import EndpointInfo
from swarm_queue.common.models import Result
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from tests.harness import BIN
from tests.helpers import gen_of, prompts, spec, wait_until


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=60
    )


async def finish(store: JobStore, job: str) -> None:
    got = await store.read_new(job, "c", 100)
    await store.commit(
        job,
        [(eid, Result(index=i, text="t"), None) for i, (eid, _) in enumerate(got)],
        gen=await gen_of(store, job),
    )


@pytest.mark.slow
async def test_jobs_are_listed_and_only_finished_ones_deleted(
    store: JobStore,
    cli_env: dict[str, str],
) -> None:
    env = cli_env
    await enqueue_prompts(store, spec(job="old"), prompts(5))
    await finish(store, "old")
    await enqueue_prompts(store, spec(job="live"), prompts(7))
    await enqueue_prompts(store, spec(job="typo", model="model-x"), prompts(3))
    # One live endpoint, serving model-a: "live" (any model) runs, "typo" waits for model-x.
    row = EndpointInfo(endpoint="http://n1:8000", worker="n1", models=("model-a",))
    # Live for the whole test (5 periods): under CPU pressure two commands took over 10 s.
    await store.publish_fleet([msgspec.structs.replace(row, updated_s=time.time(), period_s=60)])
    listing = cli(env, "swarm-jobs")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert rows["old"][1:5] == ["finished", "5", "0", "5"]
    assert rows["live"][1:5] == ["running", "0", "0", "7"]
    assert rows["typo"][1:5] == ["waiting", "0", "0", "3"]
    status = cli(env, "swarm-status", "typo")
    assert status.stdout.splitlines()[:2] == [
        "job typo: waiting",
        "  waiting    no live endpoint serves model 'model-x'; live endpoints serve: model-a",
    ]

    refused = cli(env, "swarm-jobs", "--delete", "live")
    assert refused.returncode == 2
    assert "job 'live' is still running; swarm-cancel it first, or --force" in refused.stderr

    watch = cli(env, "swarm-status", "old", "--watch", "0.1")  # over already: one view, exit 0
    assert watch.returncode == 0 and watch.stdout.startswith("job old: finished")

    deleted = cli(env, "swarm-jobs", "--delete-finished")
    assert deleted.returncode == 0 and deleted.stdout.startswith("job old: deleted (")
    assert [k async for k in store.redis.scan_iter(match=store.keys.job_pattern("old"))] == []
    assert await store.list_jobs() == ["live", "typo"]
    assert (await store.status("live")).enqueued == 7


@pytest.mark.slow
async def test_enqueue_warns_or_refuses_a_model_no_live_endpoint_serves(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    src = tmp_path / "p.txt"
    src.write_text("one\ntwo\n")
    row = EndpointInfo(endpoint="http://n1:8000", worker="n1", models=("model-a", "lora-1"))
    await store.publish_fleet([msgspec.structs.replace(row, updated_s=time.time(), period_s=60)])
    reason = "no live endpoint serves model 'model-x'; live endpoints serve: lora-1, model-a"

    refused = cli(cli_env, "swarm-enqueue", str(src), "--job", "x", "--model", "model-x",
                  "--check-model")  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr == f"swarm-enqueue: error: --check-model: {reason}\n"
    assert await store.list_jobs() == []  # refused before anything was queued

    warned = cli(cli_env, "swarm-enqueue", str(src), "--job", "x", "--model", "model-x")
    assert warned.returncode == 0
    assert warned.stderr.splitlines()[0] == (
        f"swarm-enqueue: warning: {reason}; the job waits until an endpoint serving it appears"
    )
    served = cli(cli_env, "swarm-enqueue", str(src), "--job", "y", "--model", "lora-1",
                 "--check-model")  # fmt: skip
    assert served.returncode == 0 and served.stderr == ""
    assert await store.list_jobs() == ["x", "y"]


@pytest.mark.slow
def test_bad_values_closed_pipes_and_a_second_collector_are_one_clear_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    src = tmp_path / "p.txt"
    src.write_text("one\ntwo\n")
    nan = cli(cli_env, "swarm-enqueue", str(src), "--job", "n", "--temperature", "nan")
    assert (nan.returncode, nan.stderr) == (
        2,
        "swarm-enqueue: error: temperature must be a finite number >= 0, got nan\n",
    )
    huge = cli(cli_env, "swarm-enqueue", str(src), "--job", "n", "--max-tokens", "9" * 30)
    assert huge.returncode == 2 and "max_tokens must be 1..2147483647" in huge.stderr
    listing = cli(cli_env, "swarm-jobs").stdout.splitlines()
    assert listing[1:-1] == [] and listing[-1].startswith("response cache: ")  # no job

    assert cli(cli_env, "swarm-enqueue", str(src), "--job", "live").returncode == 0
    # The reader is gone before the command writes: it ends quietly, as on SIGPIPE.
    status = subprocess.Popen(
        [BIN / "swarm-status", "live"], env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert status.stdout is not None and status.stderr is not None
    status.stdout.close()
    assert (status.stderr.read(), status.wait(timeout=60)) == (b"", 141)
    status.stderr.close()

    out = tmp_path / "live.jsonl"
    first = subprocess.Popen(
        [BIN / "swarm-collect", "live", "--out", out, "--wait"],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = tmp_path / "live.jsonl.lock"
        wait_until("the first collector's lock", lambda: lock.exists() and lock.read_text())
        second = cli(cli_env, "swarm-collect", "live", "--out", str(out), "--wait")
        holder = f"{socket.gethostname()}:{first.pid}"
        assert second.returncode == 2
        assert second.stderr == (
            f"swarm-collect: error: {out} is being written by another swarm-collect "
            f"({holder}); wait for it to finish, or choose another --out\n"
        )
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_a_worker_with_a_wrong_redis_password_stops_at_once_with_one_line(
    cli_env: dict[str, str], redis_url: str
) -> None:
    wrong = redis_url.replace("redis://", "redis://:not-the-password@", 1)
    env = {**cli_env, "SWARM_REDIS_URL": wrong, "SWARM_ENDPOINTS": "http://127.0.0.1:9"}
    started = time.monotonic()
    out = cli(env, "swarm-worker", "--burst")
    assert time.monotonic() - started < 10  # not arq's half-minute of retries
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarm-worker: error: Redis at redis://:***@")
    assert "refused access" in lines[0] and "not-the-password" not in out.stderr


def test_a_command_that_seems_stuck_prints_its_stacks_on_sigusr1(cli_env: dict[str, str]) -> None:
    """``kill -USR1 PID`` on a command that waits (here ``swarm-collect --wait`` for a job
    not yet queued) prints where each thread waits, and the command goes on waiting."""
    proc = subprocess.Popen(
        [BIN / "swarm-collect", "later", "--out", "/dev/null", "--wait"],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()  # it waits now: "waiting for job 'later' to be enqueued"
        assert "waiting for job 'later'" in said
        proc.send_signal(signal.SIGUSR1)
        dump = "".join(proc.stderr.readline() for _ in range(3))
        assert "Thread 0x" in dump or "Current thread 0x" in dump, dump
        assert proc.poll() is None  # still waiting
    finally:
        proc.kill()
        proc.communicate()  # its pipe drained and closed


@pytest.mark.slow
async def test_steps_left_without_their_job_are_deleted_with_its_name_and_a_step_name_says_so(
    store: JobStore, cli_env: dict[str, str]
) -> None:
    """Seen: after a refused agent enqueue of an earlier version, t5:s1..s3 stayed, 'swarm-jobs
    --delete t5' said no such job and '--delete t5:s1' called the name invalid."""
    for k in (1, 2, 3):
        await store.create_job(spec(f"t5:s{k}"))
    step = cli(cli_env, "swarm-jobs", "--delete", "t5:s1")
    assert step.returncode == 2
    assert step.stderr == (
        "swarm-jobs: error: t5:s1 is a step or stage of job t5: delete t5 (its steps, stages "
        "and shards go with it)\n"
    )
    gone = cli(cli_env, "swarm-jobs", "--delete", "t5")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.startswith("job t5: deleted its steps left without it (")
    assert [j for j in await store.list_jobs() if j.startswith("t5")] == []
    assert [k async for k in store.redis.scan_iter(match=f"{store.keys.prefix}:{{t5}}:*")] == []
    nothing = cli(cli_env, "swarm-jobs", "--delete", "t5")
    assert nothing.returncode == 2 and "no job named 't5'" in nothing.stderr
