"""A slot's commit brings its next batch (``Intake.read_ahead``): where an endpoint serves one
plain job, one call a batch instead of a commit and a take; what was read ahead and not run is
given back to the fleet unmarked (no death), and another job first in turn is not kept
waiting behind it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from swarm_queue.common.models import JobSpec, Result, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.worker.intake import Intake, Taken
from tests.helpers import assert_answered_in_order, prompts, run_engine

MAX_TOKENS = 12


def _spec(job: str = "r") -> JobSpec:
    return JobSpec(job=job, params=SamplingParams(max_tokens=MAX_TOKENS), chunk=16)


async def _no_sleep(seconds: float) -> bool:
    return False


async def _answer(store: JobStore, taken: Taken, read: tuple[str, int] | None) -> Any:
    """Commit ``taken``'s prompts answered, carrying ``read``."""
    results = []
    for eid, _, _ in taken.deliveries:
        first = int(eid.split(b"-")[1]) - 1
        results += [(eid, Result(index=first + k, text="a"), None) for k in range(16)]
    return await store.commit(taken.job, results, gen=taken.spec.generation, chunk=16, read=read)


async def test_a_lone_jobs_batches_each_come_with_the_commit_of_the_one_before(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 640
    await enqueue_prompts(store, _spec(), prompts(n))
    takes: list[int] = []
    reads: list[int] = []
    take_new, commit = store.take_new, store.commit

    async def counting_take(*args: Any, **kwargs: Any) -> Any:
        got = await take_new(*args, **kwargs)
        takes.append(len(got[0]))
        return got

    async def counting_commit(*args: Any, **kwargs: Any) -> Any:
        done = await commit(*args, **kwargs)
        reads.append(len(done.taken))
        return done

    monkeypatch.setattr(store, "take_new", counting_take)
    monkeypatch.setattr(store, "commit", counting_commit)
    async with sim_fleet(1) as fleet:
        settings = make_settings(batch_size=32, inflight=1, speculate=0)
        await run_engine(settings, store, fleet.urls)
        asked = sum(len(r.get("prompt", [])) for e in fleet.endpoints for r in e.received)
    await assert_answered_in_order(store, "r", n, MAX_TOKENS, asked)
    # 20 batches of 2 entries: the first taken, each next one read by the commit before it.
    assert sum(takes) == 2 and sum(reads) == 38, (takes, reads)
    status = await store.status("r", rate=False)
    assert (status.done, status.failed, status.total) == (n, 0, n)
    assert not await store.redis.hgetall(store.keys.running("r"))


async def test_batches_read_ahead_go_back_to_the_fleet_unmarked_when_the_slot_stops(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """A stop or a failing endpoint gives what was read ahead back: no run of it began, so
    another worker takes it at once, no death counted (a death runs its prompts one by one)."""
    job = await store.create_job(_spec())
    await enqueue_prompts(store, _spec(), prompts(64))
    settings = make_settings(batch_size=32, speculate=False)
    intake = Intake(store, "w|a", settings, "w|a", _no_sleep)
    first = await intake.next([job], None)
    assert first is not None and [e for e, _, _ in first.deliveries] == [b"0-1", b"0-17"]
    read = intake.read_ahead(job)
    assert read == ("w|a", 2)
    done = await _answer(store, first, read)
    await intake.arrived(job, done.taken, done.marked)
    assert intake.read_ahead(job) is None  # (one waiting is enough)
    assert done.marked == {b"0-33", b"0-49"}  # (running from their read: no start)
    await intake.release_ahead()
    other = await store.autoclaim("r", "w|b", 60_000, 10)
    assert [(eid, deaths) for eid, _, deaths in other] == [(b"0-33", 0), (b"0-49", 0)]
    assert not intake.hand("r") & {b"0-33", b"0-49"}  # (no longer this slot's)


async def test_no_read_rides_with_a_commit_while_another_job_shares_the_endpoint(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """Jobs of equal priority take the endpoint in turn: a batch read ahead would give one of
    them the turn of the other. One read ahead when the other came is given back, not run."""
    lone = await store.create_job(_spec())
    await enqueue_prompts(store, _spec(), prompts(64))
    settings = make_settings(batch_size=32, speculate=False)
    intake = Intake(store, "w|a", settings, "w|a", _no_sleep)
    first = await intake.next([lone], None)
    assert first is not None
    done = await _answer(store, first, intake.read_ahead(lone))
    await intake.arrived(lone, done.taken, done.marked)
    other = await store.create_job(_spec("s"))
    await enqueue_prompts(store, _spec("s"), prompts(32))
    got = await intake.next([other, lone], None)
    assert got is not None and got.job == "s"
    assert intake.read_ahead(other) is None
    back = await store.autoclaim("r", "w|b", 60_000, 10)  # given back, no death counted
    assert [(eid, deaths) for eid, _, deaths in back] == [(b"0-33", 0), (b"0-49", 0)]
