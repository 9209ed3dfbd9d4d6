"""Failure handling of the drain engine against a real Redis and in-process swarm-sim endpoints:
dead letters, suspects run alone, dead and stalled endpoints, graceful stop.

Crashes of real worker processes are in test_faults.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from redis.asyncio.client import Pipeline as RedisPipeline
from redis.exceptions import BusyLoadingError

from swarm_queue.common.errors import StoreFull, StoreUnavailable
from swarm_queue.common.models import Result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.intake import Intake, Taken
from tests.helpers import collect_lines, gen_of, prompts, run_engine, serve, spec, until
from tests.servers import redis_server


async def _die_running(store: JobStore, n_times: int, ids: list[bytes]) -> None:
    """``n_times``, a worker takes ``ids``, starts running them and dies (long ago: its
    entries are idle past any claim idle time)."""
    for k in range(n_times):
        stream = store.keys.stream("j")
        await store.redis.xclaim(stream, "workers", f"crashed-{k}", 0, ids, idle=10**6)
        entries, _ = await store.claim_own_pending("j", f"crashed-{k}", 100)
        await store.start("j", {eid: n for eid, _, n in entries}, gen=await gen_of(store, "j"))
        # Taking its own entries back reset their idle time: the worker died long ago.
        await store.redis.xclaim(stream, "workers", f"crashed-{k}", 0, ids, idle=10**6)


async def _hand_back(store: JobStore, n_times: int, ids: list[bytes]) -> None:
    """``n_times``, a worker takes ``ids``, starts them and releases them (a failing endpoint,
    a model it does not serve), then restarts and takes its own back: none of it a death."""
    for _ in range(n_times):
        await store.redis.xclaim(store.keys.stream("j"), "workers", "failing", 0, ids)
        await store.start("j", dict.fromkeys(ids, 0), gen=await gen_of(store, "j"))
        assert await store.release("j", "failing", ids, gen=await gen_of(store, "j")) == len(ids)
        entries, _ = await store.claim_own_pending("j", "failing", 100)
        assert [(eid, n) for eid, _, n in entries] == [(eid, 0) for eid in ids]
    await store.release(
        "j", "failing", ids, gen=await gen_of(store, "j")
    )  # last of all, handed back for anyone to take


async def test_a_look_for_leftovers_and_a_sibling_slots_read_never_both_take_an_entry(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """An endpoint's slots share one consumer. A look for its own leftovers (after a lost
    connection) sees the entries a sibling slot's read has just delivered, before that
    sibling hears its reply; whichever hears its reply first keeps them and the other leaves
    them (before, both ran them: every prompt of the batch twice)."""
    await enqueue_prompts(store, spec(), prompts(8))
    job = await store.load_spec("j")

    async def no_sleep(_: float) -> bool:
        return False

    intake = Intake(store, "w|http://a", make_settings(batch_size=8), "http://a", no_sleep)
    take_new = store.take_new
    sibling: list[Taken | None] = []

    async def read_heard_after_a_siblings_look(
        job_name: str, consumer: str, count: int, *, gen: str
    ) -> tuple[list[tuple[bytes, bytes | None, str]], set[bytes]]:
        got = await take_new(job_name, consumer, count, gen=gen)
        intake.look_again()  # a connection was lost: the sibling slot looks meanwhile
        sibling.append(await intake.next([job], None))
        return got

    store.take_new = read_heard_after_a_siblings_look  # type: ignore[method-assign,assignment]
    first = await intake.next([job], None)
    (looked,) = sibling
    assert looked is not None and len(looked.deliveries) == 8  # heard first: the sibling's
    assert first is None  # the same entries, left to the sibling
    assert len(intake.hand("j")) == 8


async def test_entries_in_hand_of_one_job_hide_no_entry_of_another_with_the_same_ids(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """Jobs' streams number their entries alike (0-1, 0-2...). What an endpoint holds of one
    job hides nothing of another: its leftovers of job b are taken back while it runs job
    a's entries of the same IDs (before: one set of IDs for all jobs, so b's entries were
    left pending to it, waiting the claim idle time; and a read of b's new entries was
    dropped as held, its job never ending)."""
    for job in ("a", "b"):
        await enqueue_prompts(store, spec(job), prompts(8))
    a, b = await store.load_spec("a"), await store.load_spec("b")

    async def no_sleep(_: float) -> bool:
        return False

    intake = Intake(store, "w|http://a", make_settings(batch_size=8), "http://a", no_sleep)
    running = await intake.next([a], None)
    assert running is not None and len(running.deliveries) == 8  # a's, in hand
    left = await store.read_new("b", "w|http://a", 8)  # b's, delivered and never heard
    intake.look_again()
    taken = await intake.next([b], None)
    assert taken is not None and taken.spec.job == "b"
    assert sorted(eid for eid, _, _ in taken.deliveries) == sorted(eid for eid, _ in left)
    assert intake.hand("a") == intake.hand("b") == {eid for eid, _ in left}


async def test_the_largest_batch_the_settings_allow_goes_through_every_script(
    store: JobStore,
) -> None:
    """Read, started, released, taken again, started and committed: a batch of
    MAX_BATCH_SIZE within the values Redis's Lua expands into one command."""
    from swarm_queue.common.settings import MAX_BATCH_SIZE

    n = MAX_BATCH_SIZE
    await enqueue_prompts(store, spec(), prompts(n))
    gen = await gen_of(store, "j")
    ids = [eid for eid, _ in await store.read_new("j", "w", n)]
    assert len(ids) == n
    await store.start("j", dict.fromkeys(ids, 0), gen=gen)
    assert await store.release("j", "w", ids, gen=gen) == n
    again = await store.autoclaim("j", "w2", 0, n)
    await store.start("j", {eid: d for eid, _, d in again}, gen=gen)
    answers = [(eid, Result(index=i, text="a"), None) for i, (eid, _, _) in enumerate(again)]
    assert (await store.commit("j", answers, gen=gen)).done == n
    assert (await store.status("j")).done == n


async def test_entries_that_keep_killing_workers_are_dead_lettered_and_suspects_run_alone(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(20))
    taken = [eid for eid, _ in await store.read_new("j", "crashed", 20)]
    # (Handed back at once: a read is a run begun, the death of a worker holding it one.)
    await store.release("j", "crashed", taken, gen=await gen_of(store, "j"))
    await _die_running(store, 9, taken[:2])  # 9 deaths: past the limit of 8
    await _die_running(store, 2, taken[2:5])  # 2 deaths: suspects
    await _die_running(store, 1, taken[5:10])  # 1 death: usually innocent, runs as usual
    await _hand_back(store, 20, taken[10:])  # handed back 20 times: never a death
    settings = make_settings(claim_idle_ms=100, max_deliveries=8, batch_size=20)
    async with sim_fleet(1) as fleet:
        engine = await run_engine(settings, store, fleet.urls)
        requests = fleet.endpoints[0].requests_total
    lines = await collect_lines(store, "j")
    assert [x["error"] is not None for x in lines] == [True] * 2 + [False] * 18
    assert lines[0]["error"] == (
        "dead-lettered: run 9 times, and each time its worker died or its server hung or "
        "dropped it (a prompt that kills workers or servers?)"
    )
    for x, (p, _) in zip(lines[2:], list(prompts(20))[2:], strict=True):
        assert x["text"] == completion_for(p, 16)[0]
    # Each line's attempts count its runs that never ended; a hand-back is no try.
    assert [x["attempts"] for x in lines[2:]] == [3] * 3 + [2] * 5 + [1] * 10
    status = await store.status("j")
    assert status.failed_by_kind == {"dead_letter": 2} and status.finished
    assert engine.drainers[0].figures.dead_lettered == 2
    # The 15 entries with at most one death ran as one batch; the 3 suspects each alone.
    assert requests == 4
    assert await store.redis.exists(store.keys.running("j")) == 0  # every mark went with its ack


async def test_a_dead_and_a_stalled_endpoint_hand_their_work_to_the_healthy_one(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(600))
    faults = [FaultConfig(die_after_s=0.3), FaultConfig(stall_after_s=0.3), FaultConfig()]
    settings = make_settings(
        batch_size=10,
        inflight=4,
        request_timeout_s=1.0,
        probe_timeout_s=0.3,
        circuit_failures=3,
        max_attempts=3,
        claim_idle_ms=60_000,
    )
    async with sim_fleet(
        3, EngineConfig(step_base_ms=5.0, step_per_seq_ms=0.0), faults=faults
    ) as fleet:
        engine = Engine(settings, store, [EndpointClient(u) for u in fleet.urls])
        try:
            await asyncio.wait_for(engine.run(burst=True), timeout=60)
        finally:
            await engine.close()
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(600)]
    dead, stalled, healthy = engine.drainers
    # (The stalled one's circuit opens only if its requests time out before the job ends:
    # once it has, they are cut short.)
    assert dead.circuit.is_open and not healthy.circuit.is_open
    assert healthy.figures.prompts_done > 300
    assert (
        dead.figures.prompts_done + stalled.figures.prompts_done + healthy.figures.prompts_done
        == 600
    )


async def test_graceful_stop_finishes_and_commits_batches_in_flight(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(max_tokens=30), prompts(400))
    settings = make_settings(batch_size=10, inflight=3)
    # A batch decodes for 3 s: under any load the three overlap, and the job is far from over
    # when they do (at 20 ms a step a loaded run once finished the job unseen and waited on).
    async with sim_fleet(1, EngineConfig(step_base_ms=100.0, step_per_seq_ms=0.0)) as fleet:
        sim = fleet.endpoints[0].engine
        engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
        run = asyncio.create_task(engine.run())
        try:
            await until("three batches of 10 decoding", lambda: sim.num_running >= 30, 30)
            engine.request_stop()
            await asyncio.wait_for(run, timeout=30)
        finally:
            await engine.close()
    status = await store.status("j")
    assert status.in_flight == 0  # nothing half-done: every batch taken was committed
    assert status.done == engine.drainers[0].figures.prompts_done >= 30
    assert status.done + status.pending == 400
    lines = await collect_lines(store, "j")
    assert all(
        x["text"] == completion_for(p, 30)[0]
        for x, (p, _) in zip(lines, prompts(400), strict=False)
    )


async def test_a_slow_batch_keeps_its_claim_and_is_never_computed_twice(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 120
    await enqueue_prompts(store, spec(max_tokens=30), prompts(n))
    slow_cfg = EngineConfig(step_base_ms=40.0, step_per_seq_ms=0.0)  # ~1.2 s a batch
    async with sim_fleet(1, slow_cfg) as slow, sim_fleet(1) as fast:
        # Claims go stale after 600 ms: half what a batch takes on the slow endpoint, and three
        # heartbeats apart (a loaded machine can delay one by a few hundred ms). (No
        # speculative copies: this is about claims; copies are tested on their own.)
        a = Engine(
            make_settings(
                worker_name="a", batch_size=40, inflight=3, claim_idle_ms=600, speculate=False
            ),
            store,
            [EndpointClient(slow.urls[0])],
        )
        b = Engine(
            make_settings(worker_name="b", claim_idle_ms=600, speculate=False),
            store,
            [EndpointClient(fast.urls[0])],
        )
        try:
            run_a = asyncio.create_task(a.run(burst=True))
            async with asyncio.timeout(30):  # a has taken every entry
                while (await store.status("j")).pending > 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await asyncio.gather(run_a, b.run(burst=True))  # b idles beside a's slow batches
        finally:
            await a.close()
            await b.close()
        computed = slow.endpoints[0].engine.finished_seqs + fast.endpoints[0].engine.finished_seqs
    assert computed == n  # nothing was taken over and computed twice
    assert (a.drainers[0].figures.prompts_done, b.drainers[0].figures.prompts_done) == (n, 0)
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 30)[0] for p, _ in prompts(n)]


async def test_odd_bodies_from_the_only_endpoint_lose_nothing_and_the_job_ends_when_it_heals(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A proxy in front of the simulator answers its first generation requests with an HTML
    502, a 200 that is not JSON and a 200 of broken JSON, in turn, then heals."""
    odd = [  # (status, content type, body): a fresh response is built for each request
        (502, "text/html", "<html><body>Bad Gateway</body></html>"),
        (200, "text/plain", "Service restarting"),
        (200, "application/json", '{"choices": [{"index": 0, "te'),
    ]
    bad_answers = 12
    sent = 0

    async with sim_fleet(1) as fleet, aiohttp.ClientSession() as http:

        async def proxy(request: web.Request) -> web.StreamResponse:
            nonlocal sent
            body = await request.read()
            if request.path.startswith("/v1/completions"):
                sent += 1
                if sent <= bad_answers:
                    status, kind, text = odd[sent % len(odd)]
                    return web.Response(status=status, text=text, content_type=kind)
            async with http.request(
                request.method,
                fleet.urls[0] + request.path,
                data=body,
                headers={"Content-Type": "application/json"},
            ) as upstream:
                return web.Response(
                    status=upstream.status,
                    body=await upstream.read(),
                    content_type=upstream.content_type,
                )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy)
        await enqueue_prompts(store, spec(), prompts(300))
        settings = make_settings(batch_size=10, inflight=3, max_attempts=2, circuit_failures=3)
        async with serve(app) as url:
            engine = await run_engine(settings, store, [url])
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(300)]
    status = await store.status("j")
    assert (status.done, status.failed) == (300, 0)
    # Every odd answer was met (by requests, then by the probe) before the job could end: a
    # batch's every attempt failed on them, and the circuit opened (after three failures in a
    # row, or at once when a batch gave up on an unreadable answer: which comes first depends
    # on how the three slots' requests interleave, seen to vary on a loaded machine).
    assert sent > bad_answers and engine.drainers[0].circuit.errors >= settings.max_attempts
    assert "circuit open after repeated failures" in caplog.text


async def test_a_full_redis_still_takes_every_answer_computed(
    make_settings: Callable[..., Settings], sim_fleet: Callable[..., SimFleet]
) -> None:
    """Redis over its maxmemory refuses every write that may grow memory: prompts cannot be
    queued, yet batches start and their answers land, each commit freeing its prompts (on the
    code before, no commit landed: the job waited for room that only its commits could make)."""
    with redis_server() as server:
        settings = make_settings(redis_url=server.url, batch_size=10)
        store = JobStore.from_settings(settings)
        try:
            await enqueue_prompts(store, spec(), prompts(300))
            await store.redis.config_set("maxmemory-policy", "noeviction")
            await store.redis.config_set("maxmemory", "1")  # every write that grows refused
            with pytest.raises(StoreFull, match="out of memory"):  # no prompt of a new job
                await enqueue_prompts(store, spec("more"), prompts(5))
            async with sim_fleet(1) as fleet:
                engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
                await asyncio.wait_for(engine.run(burst=True), timeout=60)
                await engine.close()
            assert (await store.status("j")).done == 300
            lines = await collect_lines(store, "j")
        finally:
            await store.close()
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(300)]


async def test_one_failing_endpoint_of_three_loses_nothing_and_dead_letters_nothing(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Its batches are released again and again, uncounted against the prompts, and the two
    healthy endpoints answer them (before: 415 of 2,000 dead-lettered)."""
    await enqueue_prompts(store, spec(), prompts(2000))
    faults = [FaultConfig(error_rate=1.0), FaultConfig(), FaultConfig()]
    settings = make_settings(batch_size=16, max_deliveries=2, circuit_failures=3, max_attempts=2)
    async with sim_fleet(3, faults=faults) as fleet:
        engine = await run_engine(settings, store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(2000)]
    failing, *healthy = engine.drainers
    assert failing.figures.prompts_done == 0 and failing.circuit.errors > 0
    assert sum(d.figures.prompts_done for d in healthy) == 2000


async def test_the_requests_figure_counts_the_http_requests_really_sent(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(320))
    async with sim_fleet(1) as fleet:
        engine = await run_engine(make_settings(batch_size=32), store, fleet.urls)
        sent = fleet.endpoints[0].requests_total
    assert engine.drainers[0].client.requests == sent == 10  # not twice: no model look-up per batch


async def test_a_hung_engine_that_still_answers_health_is_not_given_work_again(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """/health and /v1/models answer, generation never does: the probe asks for one token, so
    the circuit stays open instead of closing on every probe and hanging batches again."""
    generations = 0
    done = asyncio.Event()  # lets the hanging handlers end, so the stub server can stop

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "swarm-sim"}]})

    async def hang(request: web.Request) -> web.Response:
        nonlocal generations
        generations += 1
        await done.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", hang)
    await enqueue_prompts(store, spec(), prompts(400))
    settings = make_settings(
        batch_size=10, inflight=2, request_timeout_s=0.3, probe_timeout_s=0.3, circuit_failures=2
    )
    async with serve(app) as hung, sim_fleet(1, EngineConfig(step_base_ms=5.0)) as fleet:
        with caplog.at_level(logging.INFO, "swarm.worker"):
            engine = await run_engine(settings, store, [hung, *fleet.urls])
        done.set()
    stuck, healthy = engine.drainers
    assert (stuck.figures.prompts_done, healthy.figures.prompts_done) == (0, 400)
    assert stuck.circuit.state == "open"
    ready = [r for r in caplog.records if r.getMessage() == f"{hung}: endpoint ready; taking work"]
    assert len(ready) == 1  # at start only: no probe since has put it back to work
    # The failed batches, then one-token probes. The client counts a request as it starts it: a
    # probe begun as the burst engine closes can be cut off before the server sees it.
    assert generations >= 3
    assert stuck.client.requests - generations in (0, 1)


async def test_a_redis_still_loading_its_data_is_unavailable_not_a_job_finished(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in test_agents_survive_a_redis_restart: a Redis restarted with AOF answers LOADING
    while it reads its data back; a worker's sweep read that reply to a job's meta as a key
    of another tool's, dropped the running job as finished and left its batch in hand for the
    claim idle time. Such a reply is Redis unavailable: the sweep fails and is tried again."""
    await enqueue_prompts(store, spec(job="ld"), [("p", None)])
    assert await store.unfinished(["ld"]) == ["ld"]
    assert await store.reduces_pending(["ld"]) == []
    execute = RedisPipeline.execute

    async def loading(self: RedisPipeline, raise_on_error: bool = True) -> list[object]:
        got = await execute(self, raise_on_error=raise_on_error)
        return [BusyLoadingError("Redis is loading the dataset in memory") for _ in got]

    monkeypatch.setattr(RedisPipeline, "execute", loading)
    for read in (store.unfinished, store.generations, store.reduces_pending):
        with pytest.raises(StoreUnavailable, match="loading the dataset"):
            await read(["ld"])
