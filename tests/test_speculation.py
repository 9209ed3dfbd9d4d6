"""Speculative copies at a job's tail (MapReduce's backup tasks), against a real Redis: only
once the job is sealed and every entry delivered, oldest first, each entry once across the
fleet, nothing claimed; the first commit wins and nothing is counted twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from swarm_queue.common.models import decode_item
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from tests.helpers import collect_lines, gen_of, prompts, spec


async def test_copies_come_only_at_the_tail_oldest_first_each_entry_once(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(10))
    await store.read_new("j", "a", 4)  # a holds indices 0-3
    assert (
        await store.copies("j", "b", 10, gen=await gen_of(store, "j")) == []
    )  # six entries were never delivered
    await store.read_new("j", "b", 6)  # b holds 4-9: every entry is out
    got = await store.copies("j", "b", 3, gen=await gen_of(store, "j"))
    assert [eid for eid, _ in got] == [b"0-1", b"0-2", b"0-3"]  # a's, oldest first
    assert [decode_item(payload).index for _, payload in got] == [0, 1, 2]
    assert [eid for eid, _ in await store.copies("j", "b", 10, gen=await gen_of(store, "j"))] == [
        b"0-4"
    ]  # never b's own
    assert await store.copies("j", "b", 10, gen=await gen_of(store, "j")) == []  # each entry once
    # Another endpoint gets what is left: b's, never a's again.
    assert [eid for eid, _ in await store.copies("j", "c", 10, gen=await gen_of(store, "j"))] == [
        f"0-{i}".encode() for i in range(5, 11)
    ]
    # Nothing was claimed: a and b still hold what they took.
    owners = await store.redis.xpending_range(store.keys.stream("j"), "workers", "-", "+", 20)
    assert [p["consumer"] for p in owners] == [b"a"] * 4 + [b"b"] * 6


async def test_copies_are_only_of_entries_held_longer_than_a_batch_takes(
    store: JobStore,
) -> None:
    """A batch in another endpoint's hands for less than the asking endpoint's own batches
    take is not late: its copy would most likely finish second, its decoding thrown away
    (seen in issue 34's agent scenario: up to 4.5% of the tokens)."""
    await enqueue_prompts(store, spec(), prompts(6))
    await store.read_new("j", "a", 6)
    gen = await gen_of(store, "j")
    assert await store.copies("j", "b", 10, gen=gen, min_idle_ms=60_000) == []  # just taken
    # Three of them held 90 s (XCLAIM's IDLE sets how long an entry has been held).
    late = [b"0-1", b"0-2", b"0-3"]
    await store.redis.xclaim(store.keys.stream("j"), "workers", "a", 0, late, idle=90_000)
    got = await store.copies("j", "b", 10, gen=gen, min_idle_ms=60_000)
    assert [eid for eid, _ in got] == late
    assert [eid for eid, _ in await store.copies("j", "b", 10, gen=gen)] == [
        b"0-4",
        b"0-5",
        b"0-6",
    ]  # without a bound, the rest (each entry still once)


async def test_a_job_still_fed_is_not_at_its_tail_and_gets_no_copies(store: JobStore) -> None:
    """Every entry out is no tail while more will come (a producer still queuing, a pipeline
    step fed from the step before): copying then would run most of the job twice."""
    await enqueue_prompts(store, spec(), prompts(6))
    await store.redis.hdel(store.keys.meta("j"), Meta.TOTAL)  # as while its producer runs
    await store.read_new("j", "a", 6)
    gen = await gen_of(store, "j")
    assert await store.copies("j", "b", 10, gen=gen) == []
    await store.seal("j", 6, gen=gen)
    assert len(await store.copies("j", "b", 10, gen=gen)) == 6


async def test_an_idle_fast_endpoint_finishes_the_slow_ones_tail_and_nothing_counts_twice(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 200
    await enqueue_prompts(store, spec(max_tokens=8), prompts(n))
    # 12 s a batch: longer than the fast endpoint takes for the whole job, on a machine
    # however loaded (at 1.6 s, a loaded run saw the slow batches finish first).
    slow_cfg = EngineConfig(step_base_ms=1500.0, step_per_seq_ms=0.0)
    async with sim_fleet(1, slow_cfg) as slow, sim_fleet(1) as fast:
        settings = make_settings(batch_size=8, inflight=2)
        a = Engine(
            make_settings(worker_name="a", batch_size=8, inflight=2),
            store,
            [EndpointClient(slow.urls[0])],
        )
        b = Engine(settings, store, [EndpointClient(fast.urls[0])])
        try:
            run_a = asyncio.create_task(a.run(burst=True))
            async with asyncio.timeout(30):  # the slow endpoint holds its two batches
                while (await store.status("j")).in_flight < 16:  # noqa: ASYNC110 - observing
                    await asyncio.sleep(0.01)
            await b.run(burst=True)  # the rest, then copies of the slow one's tail
            status = await store.status("j")
            assert status.finished and (status.done, status.failed) == (n, 0)
            await run_a  # its own answers come late and change nothing
        finally:
            await a.close()
            await b.close()
        computed = slow.endpoints[0].engine.finished_seqs + fast.endpoints[0].engine.finished_seqs
    slow_d, fast_d = a.drainers[0].figures, b.drainers[0].figures
    # The figures agree with one another: every result counted once, by whoever committed
    # it first; each held entry copied once, and every copy that won counted as done.
    assert slow_d.prompts_done + fast_d.prompts_done == n
    assert (fast_d.copied, fast_d.copies_won) == (16, 16)
    assert (slow_d.prompts_done, fast_d.prompts_done) == (0, n)
    # The cost: the slow endpoint's two batches computed twice at most (its requests are cut
    # short once the job is over, so it may not finish them at all).
    assert n <= computed <= n + 16
    assert (await store.status("j")).done == n
    lines = await collect_lines(store, "j")
    assert [x["index"] for x in lines] == list(range(n))
    assert [x["text"] for x in lines] == [completion_for(p, 8)[0] for p, _ in prompts(n)]
    assert {x["endpoint"] for x in lines} == {fast.urls[0]}


async def test_a_burst_worker_stops_waiting_on_a_stalled_endpoint_once_its_job_is_over(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """The stalled endpoint's batches were copied and answered elsewhere: its requests are
    cut short, and its burst worker ends with the job (before: it waited out the request
    timeout, minutes, after the job had finished)."""
    n = 100
    await enqueue_prompts(store, spec(max_tokens=8), prompts(n))
    stalled_cfg = EngineConfig(step_base_ms=60_000.0, step_per_seq_ms=0.0)  # 8 min a batch
    async with sim_fleet(1, stalled_cfg) as stalled, sim_fleet(1) as fast:
        a = Engine(
            make_settings(worker_name="a", batch_size=8, inflight=2),
            store,
            [EndpointClient(stalled.urls[0])],
        )
        b = Engine(make_settings(batch_size=8, inflight=2), store, [EndpointClient(fast.urls[0])])
        try:
            run_a = asyncio.create_task(a.run(burst=True))
            async with asyncio.timeout(30):  # the stalled endpoint holds its two batches
                while (await store.status("j")).in_flight < 16:  # noqa: ASYNC110 - observing
                    await asyncio.sleep(0.01)
            await b.run(burst=True)
            assert (await store.status("j")).finished
            await asyncio.wait_for(run_a, timeout=30)
        finally:
            await a.close()
            await b.close()
    assert a.drainers[0].figures.prompts_done == 0
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 8)[0] for p, _ in prompts(n)]
