"""A key under swarm-queue's names that holds another type of value (another tool's, or a
person's ``SET``): what needs it is skipped and named, every other job goes on, and no command
or worker dies of it. Real Redis, a real long-running worker process."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from swarm_queue.common.errors import BadKeyError, StoreRefused
from swarm_queue.common.keys import GROUP
from swarm_queue.common.store import JobStore, redis_errors
from swarm_queue.producer.dashboard import Dashboard
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.jobtable import UNREADABLE_RETRY_S
from tests.harness import MAX_TOKENS, Fleet, FleetFactory, command, fleet_prompt
from tests.helpers import collect_lines, wait_count, wait_until


def _run(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """One command against the fleet's Redis (a prompt on standard input for ``-``)."""
    return command(fleet.env, *args, stdin="a question\n", timeout_s=60)


def _queue(fleet: Fleet, job: str, n: int, *args: str) -> None:
    assert fleet.enqueue(job, n, set(), *args).wait(timeout=60) == 0
    assert fleet.done(job) == 0


async def _answers_right(store: JobStore, job: str, n: int) -> None:
    lines = await collect_lines(store, job)
    assert [x["text"] for x in lines] == [
        completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0] for i in range(n)
    ]


@pytest.mark.slow
async def test_keys_of_another_type_are_skipped_and_named_and_every_other_job_goes_on(
    fleet_factory: FleetFactory, store: JobStore, tmp_path: Path
) -> None:
    started = time.monotonic()
    fleet = fleet_factory(1, "--model", "m")
    keys = store.keys
    # Another tool's values under the fleet registry, the response cache and one job's results.
    await store.redis.set(keys.fleet, "not a hash")
    await store.redis.set(keys.cache_answers, "not a hash")
    await store.redis.set(keys.cache_used, "not a sorted set")
    await store.redis.set(keys.results("squat"), "not a hash")
    _queue(fleet, "a", 300)
    _queue(fleet, "c", 200, "--model", "m", "--cache", "--temperature", "0")
    _queue(fleet, "squat", 50)
    _queue(fleet, "u", 200, "--priority", "5")  # two priorities: the fair shares read the fleet
    worker = fleet.worker("w", [0], burst=False)
    for job, n in (("a", 300), ("c", 200), ("u", 200)):
        assert wait_count(f"job {job} done", functools.partial(fleet.done, job), n) == n
        await _answers_right(store, job, n)
    assert fleet.done("squat") == 0  # it waits alone, its entries kept

    fleet_key = repr(keys.fleet)
    jobs = _run(fleet, "swarm-jobs")
    assert jobs.returncode == 0, jobs.stderr
    states = {line.split()[0]: line.split()[1] for line in jobs.stdout.splitlines()[1:-1]}
    assert states == {"a": "finished", "c": "finished", "squat": "running", "u": "finished"}
    assert "response cache: unreadable: one of the keys" in jobs.stdout
    assert f"the fleet registry is unreadable, endpoints not shown: the key {fleet_key}" in (
        jobs.stderr
    )
    status = _run(fleet, "swarm-status", "squat")
    assert status.returncode == 0 and "done       0" in status.stdout, status.stderr
    assert fleet_key in status.stderr
    squatted = f"job squat is skipped by every worker: its key {keys.results('squat')!r} holds"
    assert f"{squatted} a string, not a hash" in status.stderr
    queued = _run(fleet, "swarm-enqueue", "-", "--job", "q", "--model", "m")
    assert queued.returncode == 0, queued.stderr
    assert f"the endpoints serving it cannot be known: the key {fleet_key}" in queued.stderr
    refused = _run(fleet, "swarm-enqueue", "-", "--job", "q2", "--model", "m", "--check-model")
    assert refused.returncode == 2 and fleet_key in refused.stderr
    dash = Dashboard(store, fleet.redis_url)
    assert await dash.step()
    assert dash.board is not None
    shown = {row.job: row.state for row in dash.board.jobs}
    assert shown.keys() == {*states, "q"} and states.items() <= shown.items()
    assert [n.split(":")[0] for n in dash.board.notes] == [
        "the fleet registry is unreadable, endpoints not shown"
    ]

    # The job registry itself replaced while a job runs: the worker goes on with what it knows.
    os.kill(fleet.sim.pid, signal.SIGSTOP)
    try:
        _queue(fleet, "b", 400)
        stream = keys.stream("b")
        wait_until("the worker takes job b", lambda: _held(fleet, stream) > 0)
        await store.redis.delete(keys.jobs)
        await store.redis.set(keys.jobs, "not a set")
    finally:
        os.kill(fleet.sim.pid, signal.SIGCONT)
    assert wait_count("job b done", lambda: fleet.done("b"), 400) == 400
    await _answers_right(store, "b", 400)
    listing = _run(fleet, "swarm-jobs")
    assert listing.returncode == 1 and "Traceback" not in listing.stderr
    assert listing.stderr.startswith(f"swarm-jobs: error: the key {keys.jobs!r} in Redis holds")
    assert await dash.step()
    assert dash.board.jobs == []
    assert dash.board.notes[1].startswith("the job registry is unreadable, no job shown")

    assert worker.poll() is None  # alive, serving
    worker.terminate()
    assert worker.wait(timeout=60) == 0
    log = fleet.logs[0].read_text()
    assert "Traceback" not in log
    for what in ("the fleet registry", "the response cache", "job squat", "the job registry"):
        assert log.count(f"skipping {what}:") == 1, (what, log[-3000:])
    # Job squat read again every UNREADABLE_RETRY_S, not at once: taken up, its leftovers
    # taken back and refused again, it was served 424 times in a 3-second run (once, 1,000
    # times a second for 2 minutes, job a starved at 64 of 300).
    retries = 2 + (time.monotonic() - started) / UNREADABLE_RETRY_S
    assert log.count("serving job squat") <= retries, log.count("serving job squat")


def _held(fleet: Fleet, stream: str) -> int:
    """How many entries of ``stream`` a worker holds (read, not yet acknowledged)."""
    with redis.Redis.from_url(fleet.redis_url) as client:
        return int(client.xpending(stream, GROUP)["pending"])


async def test_every_redis_refusal_becomes_an_error_of_swarm_queue(store: JobStore) -> None:
    key = store.keys.fleet
    await store.redis.set(key, "not a hash")
    # A plain command, a pipeline's (redis-py words its error otherwise) and a script's.
    with pytest.raises(BadKeyError) as plain:
        await store.read_fleet()
    assert plain.value.keys == (key,) and f"the key {key!r} in Redis holds" in str(plain.value)
    with pytest.raises(BadKeyError):
        await store.publish_fleet([], gone=["w|e"])
    with pytest.raises(BadKeyError):
        async with redis_errors(store.url, "", key):
            await store.redis.eval("return redis.call('HGET', KEYS[1], 'f')", 1, key)
    with pytest.raises(StoreRefused, match="refused a command: unknown command"):
        async with redis_errors(store.url):
            await store.redis.execute_command("NO-SUCH-COMMAND")
