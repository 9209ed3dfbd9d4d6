"""The shared case of issue 21: on one fleet of two models and one Redis, a job answered partly
from the response cache, a plain job, a job for the other model, a job of questions over
documents (its prompts carrying affinity keys, each document's given to one endpoint; it and the
plain job of one project), and a job spread over three shards, deleted mid-run and queued
again under its name with another input over two, one endpoint unusable (a wrong key), with
Redis restarted in the middle. No output holds a wrong answer or another model's, and every
job's counts equal its total. Real processes throughout."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
from pathlib import Path

import msgspec
import pytest
import redis

from swarm_queue.common.keys import Keys, lane_name
from swarm_queue.common.shards import aimed_names
from swarm_queue.sim.text import completion_for
from tests.harness import MAX_TOKENS, Fleet, FleetFactory, command, wrong_key_endpoint
from tests.helpers import wait_count
from tests.servers import redis_server


def _questions(job: str, n: int) -> list[str]:
    return [f"{job}: what does record {i} of the survey say?" for i in range(n)]


def _documents_asked(docs: int, questions: int) -> list[str]:
    """Each of ``docs`` documents (long enough to carry an affinity key, short enough for the
    fleet's context) before each of ``questions`` questions, shuffled: one line each."""
    rng = random.Random(5)
    texts = ["".join(rng.choice("abcdefgh ") for _ in range(1200)) for _ in range(docs)]
    asked = [f"{t} Question {q}: what does it say?" for t in texts for q in range(questions)]
    rng.shuffle(asked)
    return asked


def _write(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(p + "\n" for p in prompts))
    return path


def _cmd(fleet: Fleet, *args: str | Path) -> subprocess.CompletedProcess[str]:
    out = command(fleet.env, *args)
    assert out.returncode == 0, out.stderr
    return out


def _enqueue(fleet: Fleet, path: Path, job: str, *args: str) -> None:
    _cmd(fleet, "swarm-enqueue", path, "--job", job, "--max-tokens", str(MAX_TOKENS), *args)


@pytest.mark.slow
def test_jobs_of_two_models_a_broken_endpoint_a_requeued_job_and_a_redis_restart(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = redis_server(appendonly=True, workdir=str(workdir)).start()
    stack = contextlib.ExitStack()
    try:
        # Ports 0 and 1 serve model m, port 2 model n; and a wrong-key endpoint beside port 0.
        fleet = fleet_factory(3, "--model", "m,m,n", url=server.url)
        keys = Keys(fleet.prefix)
        cache_args = ("--model", "m", "--cache", "--temperature", "0")
        cached_in = _questions("cached", 4000)
        plain_in = _questions("plain", 6000)
        other_in = _questions("other", 2000)
        old_in, new_in = _questions("old", 3000), _questions("new", 3000)
        affine_in = _documents_asked(40, 8)

        # Yesterday's job kept the answers to the first 1,000 of today's cached questions.
        _enqueue(fleet, _write(tmp_path / "warm.txt", cached_in[:1000]), "warm", *cache_args)
        warm = fleet.worker("warm", [0])
        assert warm.wait(timeout=120) == 0

        _enqueue(fleet, _write(tmp_path / "cached.txt", cached_in), "cached", *cache_args)
        # Two jobs of one project, sharing its turn of the fleet, beside jobs of none.
        _enqueue(fleet, _write(tmp_path / "plain.txt", plain_in), "plain", "--model", "m",
                 "--project", "lab")  # fmt: skip
        _enqueue(fleet, _write(tmp_path / "other.txt", other_in), "other", "--model", "n")
        _enqueue(fleet, _write(tmp_path / "affine.txt", affine_in), "affine", "--model", "m",
                 "--project", "lab")  # fmt: skip
        _enqueue(fleet, _write(tmp_path / "reused.txt", old_in), "reused", "--model", "m",
                 "--shards", "3")  # fmt: skip
        locked = stack.enter_context(wrong_key_endpoint())
        broken = fleet.worker("w1", [0], burst=False, SWARM_ENDPOINTS=f"{fleet.url(0)},{locked}")
        healthy = fleet.worker("w2", [1, 2], burst=False)
        wait_count("the reused job under way", lambda: fleet.done("reused"), 300)

        # The reused job is deleted with batches in flight and queued again with new input.
        fleet.sim.send_signal(signal.SIGSTOP)
        try:
            _cmd(fleet, "swarm-jobs", "--delete", "reused", "--force")
            _enqueue(fleet, _write(tmp_path / "new.txt", new_in), "reused", "--model", "m",
                     "--shards", "2")  # fmt: skip
        finally:
            fleet.sim.send_signal(signal.SIGCONT)
        collectors = {
            job: fleet.collect(job) for job in ("cached", "plain", "other", "affine", "reused")
        }

        # Redis restarts mid-run (AOF on, the same data back).
        wait_count("work after the requeue", lambda: fleet.done("plain"), 1000)
        server.stop()
        server.start()

        for job, collector in collectors.items():
            _, err = collector.communicate(timeout=300)
            assert collector.returncode == 0, (job, err)
        for w in (broken, healthy):
            w.terminate()
        # The worker with the wrong-key endpoint served all along with its other one, and
        # says on exit that one of its endpoints was unusable.
        assert broken.wait(timeout=60) == 1
        assert "endpoint unusable" in fleet.logs[1].read_text()
        assert healthy.wait(timeout=60) == 0
        with redis.Redis.from_url(server.url) as client:
            metas = {j: client.hgetall(keys.meta(j)) for j in collectors if j != "reused"}
            # The requeued job's counts are its two shards' together; its first layout's
            # third shard went with the delete, and nothing wrote it again.
            shards = [client.hgetall(keys.meta(name)) for name in aimed_names("reused", 2)]
            metas["reused"] = {
                field: b"%d" % sum(int(m.get(field, 0)) for m in shards)
                for field in (b"done", b"failed")
            }
            gone = set(aimed_names("reused", 3)) - set(aimed_names("reused", 2))
            assert gone and not any(client.exists(keys.meta(name)) for name in gone)
            owners = client.hgetall(keys.owners("affine"))
    finally:
        stack.close()
        server.close()

    jobs = {
        "cached": cached_in,
        "plain": plain_in,
        "other": other_in,
        "affine": affine_in,
        "reused": new_in,
    }
    for job, prompts in jobs.items():
        lines = [
            msgspec.json.decode(x)
            for x in (tmp_path / f"{job}.jsonl").read_bytes().split(b"\n")
            if x
        ]
        assert [x["index"] for x in lines] == list(range(len(prompts))), job
        wrong = [
            x["index"]
            for x in lines
            if x["error"] is not None
            or x["text"] != completion_for(prompts[x["index"]], MAX_TOKENS)[0]
        ]
        assert wrong == [], (job, wrong[:10])
        assert {x["model"] for x in lines} == {"n" if job == "other" else "m"}, job
        meta = metas[job]
        done, failed = int(meta[b"done"]), int(meta.get(b"failed", 0))
        assert (done, failed) == (len(prompts), 0), job
    # Each document was given to a live endpoint of its model: never the unusable one, nor
    # the other model's.
    given = {v for k, v in owners.items() if not k.startswith(b"#")}
    assert len([k for k in owners if not k.startswith(b"#")]) == 40
    assert given and given <= {lane_name(fleet.url(0)).encode(), lane_name(fleet.url(1)).encode()}
    # The cached job took its first thousand answers from the cache, and only those.
    cached_lines = [
        msgspec.json.decode(x) for x in (tmp_path / "cached.jsonl").read_bytes().split(b"\n") if x
    ]
    assert [x["index"] for x in cached_lines if x.get("cached")] == list(range(1000))
    assert int(metas["cached"][b"cache_hits"]) == 1000
