"""Clocks differ between the machines of a fleet: every time stored or compared across them is
Redis's. Real worker processes whose own clocks are hours or weeks off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from swarm_queue.common.models import Result
from swarm_queue.common.store import JobStore
from tests.harness import Fleet, FleetFactory, command
from tests.helpers import wait_until

# Loaded by every Python process started with its folder on PYTHONPATH: time.time() is off by
# SWARM_TEST_CLOCK_OFFSET_S, as on a node whose clock was never set right.
_SKEW = """
import os
import time

_offset = float(os.environ.get("SWARM_TEST_CLOCK_OFFSET_S", "0"))
_real = time.time
time.time = lambda: _real() + _offset
"""


def _skewed(tmp_path: Path, offset_s: float) -> dict[str, str]:
    """The environment of a process whose clock is ``offset_s`` off."""
    folder = tmp_path / "skew"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SKEW)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SWARM_TEST_CLOCK_OFFSET_S": str(offset_s)}


@pytest.mark.slow
async def test_a_worker_two_hours_behind_is_live_and_one_forty_days_ahead_evicts_no_answer(
    fleet_factory: FleetFactory, store: JobStore, tmp_path: Path
) -> None:
    fleet = fleet_factory(2, "--model", "m,m")
    # Answers other jobs kept in the cache a minute ago, by Redis's clock.
    kept = [(f"k{i}", Result(index=i, text=f"kept {i}")) for i in range(50)]
    from swarm_queue.common.cache import encode_answer

    await store.cache_put(
        [(k, encode_answer(r, await store.server_time())) for k, r in kept], 30 * 86400, 1_000_000
    )

    behind = fleet.worker("behind", [0], burst=False, env=_skewed(tmp_path, -2 * 3600))
    wait_until("the worker behind publishes", lambda: b"behind" in _fleet_fields(store, fleet))
    check = _run(fleet, "swarm-enqueue", "-", "--job", "q", "--model", "m", "--check-model")
    assert check.returncode == 0, check.stderr  # the endpoint behind is live: the job queued
    status = _run(fleet, "swarm-status", "q")
    assert "silent" not in status.stdout and "no live endpoint" not in status.stdout
    behind.terminate()
    behind.wait(timeout=30)

    # A --cache job answered by a worker forty days ahead: its answers are kept, and every
    # answer kept before stays (the cache's TTL counts by Redis's clock, not the worker's).
    src = tmp_path / "c.txt"
    src.write_text("".join(f"question {i}\n" for i in range(40)))
    queued = _run(
        fleet,
        "swarm-enqueue",
        str(src),
        "--job",
        "c",
        "--model",
        "m",
        "--cache",
        "--temperature",
        "0",
    )
    assert queued.returncode == 0, queued.stderr
    ahead = fleet.worker("ahead", [1], env=_skewed(tmp_path, 40 * 86400))
    assert ahead.wait(timeout=120) == 0, fleet.logs[-1].read_text()
    answers = await store.redis.hkeys(store.keys.cache_answers)
    assert {f"k{i}".encode() for i in range(50)} <= set(answers)
    assert len(answers) == 50 + 40
    used = await store.redis.zrange(store.keys.cache_used, 0, -1, withscores=True)
    now = await store.server_time()
    assert all(abs(at - now) < 600 for _, at in used)  # stamped by Redis, not by the worker


def _run(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """One command against the fleet's Redis (a prompt on standard input for ``-``)."""
    return command(fleet.env, *args, stdin="a question\n", timeout_s=60)


def _fleet_fields(store: JobStore, fleet: Fleet) -> bytes:
    import redis

    with redis.Redis.from_url(fleet.redis_url) as client:
        return b" ".join(client.hkeys(store.keys.fleet))
