"""An idle endpoint's slots: one looks for work, the others rest until it finds some."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.lookout import Lookout, Watch
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
