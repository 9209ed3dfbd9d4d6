"""The shared case of issue 21: on one fleet and one Redis, a job answered partly from the
response cache, a plain job, and a job deleted mid-run and queued again under its name with
another input, with Redis restarted in the middle. No output holds a wrong answer, and every
job's counts equal its total. Real processes throughout."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import msgspec
import pytest
import redis

from common.embedded import EmbeddedRedis
from common.keys import Keys
from sim.text import completion_for
from tests.harness import MAX_TOKENS, Fleet, FleetFactory, command
from tests.helpers import wait_until


def _questions(job: str, n: int) -> list[str]:
    return [f"{job}: what does record {i} of the survey say?" for i in range(n)]


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
def test_a_cached_a_plain_and_a_requeued_job_through_a_redis_restart_get_only_right_answers(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = EmbeddedRedis(appendonly=True, workdir=str(workdir)).start()
    try:
        fleet = fleet_factory(2, "--model", "m,m", url=server.url)
        keys = Keys(fleet.prefix)
        cache_args = ("--model", "m", "--cache", "--temperature", "0")
        cached_in = _questions("cached", 4000)
        plain_in = _questions("plain", 6000)
        old_in, new_in = _questions("old", 3000), _questions("new", 3000)

        # Yesterday's job kept the answers to the first 1,000 of today's cached questions.
        _enqueue(fleet, _write(tmp_path / "warm.txt", cached_in[:1000]), "warm", *cache_args)
        warm = fleet.worker("warm", [0])
        assert warm.wait(timeout=120) == 0

        _enqueue(fleet, _write(tmp_path / "cached.txt", cached_in), "cached", *cache_args)
        _enqueue(fleet, _write(tmp_path / "plain.txt", plain_in), "plain")
        _enqueue(fleet, _write(tmp_path / "reused.txt", old_in), "reused")
        workers = [fleet.worker("w1", [0], burst=False), fleet.worker("w2", [1], burst=False)]
        wait_until("the reused job under way", lambda: fleet.done("reused") >= 300)

        # The reused job is deleted with batches in flight and queued again with new input.
        fleet.sim.send_signal(signal.SIGSTOP)
        try:
            _cmd(fleet, "swarm-jobs", "--delete", "reused", "--force")
            _enqueue(fleet, _write(tmp_path / "new.txt", new_in), "reused")
        finally:
            fleet.sim.send_signal(signal.SIGCONT)
        collectors = {job: fleet.collect(job) for job in ("cached", "plain", "reused")}

        # Redis restarts mid-run (AOF on, the same data back).
        wait_until("work after the requeue", lambda: fleet.done("plain") >= 1000)
        server.stop()
        server.start()

        for job, collector in collectors.items():
            _, err = collector.communicate(timeout=300)
            assert collector.returncode == 0, (job, err)
        for w in workers:
            w.terminate()
            assert w.wait(timeout=60) == 0
        with redis.Redis.from_url(server.url) as client:
            metas = {j: client.hgetall(keys.meta(j)) for j in ("cached", "plain", "reused")}
    finally:
        server.close()

    for job, prompts in (("cached", cached_in), ("plain", plain_in), ("reused", new_in)):
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
        meta = metas[job]
        done, failed = int(meta[b"done"]), int(meta.get(b"failed", 0))
        assert (done, failed) == (len(prompts), 0), job
    # The cached job took its first thousand answers from the cache, and only those.
    cached_lines = [
        msgspec.json.decode(x) for x in (tmp_path / "cached.jsonl").read_bytes().split(b"\n") if x
    ]
    assert [x["index"] for x in cached_lines if x.get("cached")] == list(range(1000))
    assert int(metas["cached"][b"cache_hits"]) == 1000
