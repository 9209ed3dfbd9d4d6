"""An idle endpoint's slots: one looks for work, the others rest until it finds some."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.intake import Intake
from swarm_queue.worker.lookout import Lookout, Watch
from swarm_queue.worker.sources import Looks
from tests.helpers import collect_lines, prompts, spec, until


async def test_one_slot_looks_and_the_others_rest_until_it_finds_work() -> None:
    lookout = Lookout(rest_s=60)
    await lookout.nothing_found(0)  # the first to find nothing looks: no rest
    await lookout.nothing_found(0)  # and keeps looking
    resting = [asyncio.create_task(lookout.nothing_found(i)) for i in (1, 2)]
    await until("two slots resting", lambda: lookout.resting == 2)
    lookout.found(1)  # a slot that is not the lookout wakes nobody
    await asyncio.sleep(0)
    assert not any(t.done() for t in resting)
    lookout.found(0)
    await asyncio.wait_for(asyncio.gather(*resting), timeout=5)  # woken, not rested out
    assert lookout.resting == 0
    # Work found, so nobody is looking: the next slot to find nothing looks.
    await lookout.nothing_found(2)
    rest = asyncio.create_task(lookout.nothing_found(0))
    await until("a slot resting", lambda: lookout.resting == 1)
    lookout.wake()
    await rest


async def test_a_rest_ends_after_rest_s_and_its_slot_takes_over_looking() -> None:
    lookout = Lookout(rest_s=0.01)
    await lookout.nothing_found(0)
    await lookout.nothing_found(1)  # rested rest_s: the lookout went quiet
    await lookout.nothing_found(1)  # now slot 1 looks: no rest
    assert lookout.resting == 0


async def test_a_lookout_that_stops_ends_the_rests_at_once_and_another_slot_looks() -> None:
    lookout = Lookout(rest_s=3600)  # no rest ends by itself within the test
    await lookout.nothing_found(1)  # slot 1 looks
    rests = [asyncio.create_task(lookout.nothing_found(i)) for i in (2, 3)]
    await until("two slots resting", lambda: lookout.resting == 2)
    lookout.leave(2)  # a slot that is not the lookout leaving wakes nobody
    await asyncio.sleep(0)
    assert not any(t.done() for t in rests)
    lookout.leave(1)  # the lookout stops: every rest ends now
    await asyncio.wait_for(asyncio.gather(*rests), timeout=5)
    # and the next slot to find nothing looks in its place, without a rest
    await asyncio.wait_for(lookout.nothing_found(3), timeout=5)
    assert lookout.resting == 0


async def test_an_idle_endpoint_polls_with_one_slot_and_wakes_all_for_new_work(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    settings = make_settings(batch_size=4, inflight=8)  # a fixed window of 8 slots
    async with sim_fleet(1) as fleet:
        engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
        drainer = engine.drainers[0]
        run = asyncio.create_task(engine.run())
        try:
            await until("seven slots resting", lambda: drainer.lookout.resting == 7)
            sent = drainer.client.requests
            await enqueue_prompts(store, spec(max_tokens=8), prompts(400))
            async with asyncio.timeout(30):
                while (await store.status("j")).done < 400:
                    assert not run.done()
                    await asyncio.sleep(0.01)
            assert drainer.client.requests - sent == 100  # 400 prompts in batches of 4
            # and, idle again, back to one slot looking
            await until("seven slots resting", lambda: drainer.lookout.resting == 7)
        finally:
            engine.request_stop()
            await run
            await engine.close()
    assert drainer.lookout.resting == 0
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 8)[0] for p, _ in prompts(400)]


async def test_endpoints_waiting_on_a_read_that_found_work_look_in_turn_until_one_finds_none() -> (
    None
):
    """Five endpoints wait on a sixth's blocking read, which finds entries: they look one at a
    time, each taking what the last left, and the first that finds none ends the looks; a job
    whose read found none is quiet (no look) for the read's wait. Before, all five looked at
    once whatever the read found (at 1,000 endpoints, most of Redis's work)."""
    now = [100.0]
    watch = Watch(clock=lambda: now[0])
    left = [2]  # batches left once the blocking read has taken its own
    looks: list[int | None] = []
    release = asyncio.Event()

    async def read(block_ms: int | None) -> str | None:
        if block_ms is not None:  # the blocking read
            await release.wait()
            return "the reader's batch"
        looks.append(block_ms)
        await asyncio.sleep(0)  # (another waiter would look meanwhile, were it let)
        if left[0]:
            left[0] -= 1
            return "a batch"
        return None

    reader = asyncio.create_task(watch.wait("j", 200, read))
    await until("a read under way", lambda: watch.quiet("j"))
    waiters = [asyncio.create_task(watch.wait("j", 200, read)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    got = await asyncio.wait_for(asyncio.gather(reader, *waiters), timeout=5)
    assert got == ["the reader's batch", "a batch", "a batch", None, None, None]
    assert len(looks) == 3  # two that found a batch, one that found none; two never looked
    assert watch.quiet("j")  # nothing left: no look for the read's wait
    now[0] += 0.3
    assert not watch.quiet("j")


async def test_a_look_that_finds_no_new_entries_leaves_the_next_to_the_blocking_read(
    store: JobStore, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue run dry as it fills (the producer slower than the fleet): every free slot of a
    process looking for itself made ten empty looks a batch at scenario 9. One look finding
    none makes the job quiet for the poll: the process's other endpoints wait on the blocking
    read instead, which returns what comes at once."""
    job = await store.create_job(spec("j"))
    looked: list[str] = []
    take_new = store.take_new

    async def counting(job: str, consumer: str, count: int, *, gen: str) -> Any:
        looked.append(consumer)
        return await take_new(job, consumer, count, gen=gen)

    monkeypatch.setattr(store, "take_new", counting)
    settings = make_settings(poll_ms=60_000, speculate=False)
    looks = Looks()
    a, b = (Intake(store, c, settings, c, _no_sleep, looks) for c in ("w|a", "w|b"))
    assert await a.next([job], None) is None and await b.next([job], None) is None
    assert looked == ["w|a"] and looks.watch.quiet("j")
    await enqueue_prompts(store, spec("j"), prompts(4))
    got = await asyncio.wait_for(b.next([job], 60_000), timeout=10)  # the blocking read
    assert got is not None and len(got.deliveries) == 4


async def _no_sleep(seconds: float) -> bool:
    return False


async def test_walks_of_a_process_look_for_new_entries_one_at_a_time_until_one_finds_none(
    store: JobStore, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six endpoints free at once, three batches queued: three looks take them, the fourth
    finds none, and the last two ask Redis nothing (all six looked at once before, five of
    them finding nothing or a part)."""
    job = await store.create_job(spec("j"))
    await enqueue_prompts(store, spec("j"), prompts(12))
    looked: list[int] = []
    take_new = store.take_new

    async def counting(job: str, consumer: str, count: int, *, gen: str) -> Any:
        got = await take_new(job, consumer, count, gen=gen)
        looked.append(len(got[0]))
        return got

    monkeypatch.setattr(store, "take_new", counting)
    settings = make_settings(batch_size=4, poll_ms=60_000, speculate=False)
    looks = Looks()
    walks = [Intake(store, f"w|{i}", settings, f"w|{i}", _no_sleep, looks) for i in range(6)]
    got = await asyncio.gather(*(w.next([job], None) for w in walks))
    assert sorted(len(t.deliveries) if t else 0 for t in got) == [0, 0, 0, 4, 4, 4]
    assert looked == [4, 4, 4, 0]


async def test_a_job_no_blocking_read_waits_on_is_looked_at_again_on_the_next_walk(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """Only the job the process's blocking read waits on (the first of the walk) is left quiet
    after a look that finds none: another job's entries (a pipeline's next step, fed as the
    step before answers) are taken on the next walk, not a poll later."""
    first = await store.create_job(spec("first"))
    second = await store.create_job(spec("second"))
    await enqueue_prompts(store, spec("first"), prompts(4))
    settings = make_settings(batch_size=4, poll_ms=60_000, speculate=False)
    intake = Intake(store, "w|a", settings, "w|a", _no_sleep)
    got = await intake.next([first, second], None)
    assert got is not None and got.job == "first"
    assert await intake.next([first, second], None) is None  # both looked at, none found
    assert intake.watch.quiet("first") and not intake.watch.quiet("second")
    await enqueue_prompts(store, spec("second"), prompts(4))
    got = await intake.next([first, second], None)
    assert got is not None and got.job == "second" and len(got.deliveries) == 4
