"""Model-aware routing in the drain engine, against a real Redis and in-process swarm-sim:
each endpoint takes only the jobs whose model it serves; a 404 for a model is that job's
trouble, a wrong key the endpoint's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
import pytest
from aiohttp import web

from swarm_queue.common.embedded import free_port
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.keys import GROUP
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import RELEASED_IDLE_MS, JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.intake import Queued, service_order
from tests.helpers import collect_lines, prompts, run_engine, serve, spec


async def _done(store: JobStore, job: str) -> int:
    s = await store.status(job)
    return s.done + s.failed


async def test_an_unloaded_adapter_leaves_its_job_waiting_and_the_endpoint_serving_others(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    n = 600
    await enqueue_prompts(store, spec("lora", model="lora1"), prompts(n))
    await enqueue_prompts(store, spec("base", model="m"), prompts(n))
    # No periodic re-read during the run: the 404 itself must tell the worker.
    settings = make_settings(batch_size=10, inflight=2, models_refresh_s=600)
    cfg = EngineConfig(step_base_ms=3.0, step_per_seq_ms=0.0)
    async with sim_fleet(1, cfg, model="m+lora1") as fleet:
        sim = fleet.endpoints[0]
        engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
        run = asyncio.create_task(engine.run(burst=True))
        try:
            while await _done(store, "lora") < 60:
                assert not run.done()
                await asyncio.sleep(0.01)
            sim.models = ["m"]  # the adapter is unloaded under the worker's feet
            with caplog.at_level(logging.WARNING, "swarm.worker"):
                await asyncio.wait_for(run, timeout=60)  # burst: lora is nobody's work now
        finally:
            await engine.close()
        drainer = engine.drainers[0]
        assert drainer.broken is None and drainer.models == ("m",)
        assert any("does not serve model 'lora1'" in r.getMessage() for r in caplog.records)
        assert await _done(store, "base") == n
        left = await store.status("lora")
        assert left.done < n and left.failed == 0
        assert left.done + left.pending + left.in_flight == n
        # The refused batches were released: whatever is still pending is marked long idle,
        # for any endpoint serving lora1 to take at once, in no worker's hands (not in flight).
        held = await store.redis.xpending_range(store.keys.stream("lora"), GROUP, "-", "+", n)
        assert len(held) > 0 and left.in_flight == 0
        assert all(p["time_since_delivered"] >= RELEASED_IDLE_MS for p in held)

        sim.models = ["m", "lora1"]  # loaded again: the job resumes
        await run_engine(settings, store, fleet.urls)
    for job in ("lora", "base"):
        lines = await collect_lines(store, job)
        assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(n)]
        assert all(x["attempts"] == 1 for x in lines)  # a refused batch is no failed attempt


async def test_a_wrong_key_breaks_only_its_endpoint_and_the_job_finishes_elsewhere(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    async def healthy_anyway(request: web.Request) -> web.Response:
        return web.Response()

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad key", "code": 401}}, status=401)

    app = web.Application()  # as vLLM with --api-key: /health is open, /v1 routes are not
    app.router.add_get("/health", healthy_anyway)
    app.router.add_route("*", "/v1/{tail:.*}", refuse)
    await enqueue_prompts(store, spec("j"), prompts(300))
    async with serve(app) as locked, sim_fleet(1) as fleet:
        engine = await run_engine(make_settings(batch_size=10), store, [locked, *fleet.urls])
    locked_drainer, healthy = engine.drainers
    assert locked_drainer.circuit.state == "broken" and healthy.circuit.state == "closed"
    assert engine.broken == [f"{locked}: HTTP 401: bad key"]
    assert (locked_drainer.figures.prompts_done, healthy.figures.prompts_done) == (0, 300)


def test_service_order_puts_every_higher_priority_job_first_and_rotates_equals() -> None:
    jobs = [("big", 0), ("urgent", 5), ("other", 0), ("mid", 1), ("urgent2", 5)]
    assert service_order(jobs, 0) == ["urgent", "urgent2", "mid", "big", "other"]
    assert service_order(jobs, 1) == ["urgent2", "urgent", "mid", "other", "big"]
    assert service_order([], 3) == []


def test_service_order_puts_an_agent_jobs_earlier_turns_before_its_later_ones() -> None:
    """An agent job's turns share one turn of the rotation, earliest first (an agent whose
    first turn is left for the end ends last, the engines idle meanwhile); a pipeline's
    steps (of no affinity) are units of their own, as any job."""
    jobs = [
        Queued("ag:s2", 0, "ag", 2),
        Queued("pipe:s1", 0, "", 1),
        Queued("ag:s1", 0, "ag", 1),
        Queued("ag", 0, "", 0),
        Queued("pipe", 0, "", 0),
    ]
    assert service_order(jobs, 0) == ["ag", "ag:s1", "ag:s2", "pipe:s1", "pipe"]
    assert service_order(jobs, 1) == ["pipe:s1", "pipe", "ag", "ag:s1", "ag:s2"]
    assert service_order(jobs, 2) == ["pipe", "ag", "ag:s1", "ag:s2", "pipe:s1"]


def test_service_order_shares_by_project_and_serves_its_earliest_deadline_first() -> None:
    """A project with ten jobs and one with one are first in turn equally often; in a project,
    the job due first leads, whatever its place (no deadline: after every one that has)."""
    jobs = [Queued(f"b{i}", 0, "", 0, "bulk", 0.0) for i in range(10)]
    jobs += [Queued("a", 0, "", 0, "alice"), Queued("loose", 0)]
    firsts = [service_order(jobs, turn)[0] for turn in range(300)]
    assert firsts.count("a") == firsts.count("loose") == 100  # a third each: three shares
    assert sum(f.startswith("b") for f in firsts) == 100
    # Within the bulk project its jobs still take turns.
    assert {f for f in firsts if f.startswith("b")} == {f"b{i}" for i in range(10)}
    due = [
        Queued("day", 0, "", 0, "p", 2_000_000_000.0),
        Queued("none", 0, "", 0, "p"),
        Queued("half-hour", 0, "", 0, "p", 1_900_000_000.0),
        Queued("other-day", 0, "", 0, "p", 2_000_000_000.0),
    ]
    for turn in range(4):
        order = service_order(due, turn)
        assert order[0] == "half-hour" and order[-1] == "none"
        assert set(order[1:3]) == {"day", "other-day"}
    assert {service_order(due, t)[1] for t in range(4)} == {"day", "other-day"}  # in turn
    # Priority still comes first: an urgent job of any project before all of these.
    assert service_order([*due, Queued("urgent", 1, "", 0, "q")], 3)[0] == "urgent"


async def test_a_higher_priority_job_takes_every_free_slot_while_it_has_work(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec("big"), prompts(400))
    await enqueue_prompts(store, msgspec.structs.replace(spec("urgent"), priority=1), prompts(100))
    async with sim_fleet(1) as fleet:
        engine = Engine(
            make_settings(batch_size=10, inflight=1), store, [EndpointClient(fleet.urls[0])]
        )
        drainer = engine.drainers[0]
        try:
            # One batch at a time: the 10 urgent batches come first, then the big job's.
            for _ in range(10):
                assert await drainer.step() is True
            urgent, big = await store.status("urgent"), await store.status("big")
            assert (urgent.done, urgent.finished, big.done) == (100, True, 0)
            assert await drainer.step() is True
            assert (await store.status("big")).done == 10
        finally:
            await engine.close()


async def test_a_generating_and_a_pooling_server_of_one_model_name_each_get_their_own_jobs(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """Seen: one worker over a generating and a pooling server serving the same model name:
    --burst exited 0 with 32 of 300 of each job done (each endpoint's 404 for the route it
    lacks dropped the model, the next re-read of /v1/models brought it back, and a long-
    running worker sent each the wrong job again every 5 s). A route a server lacks is
    learnt from its 404 once and kept, per model."""
    n = 300
    embed, _ = build_spec("e", JobOptions(model="m", embed=True), source="t")
    await enqueue_prompts(store, embed, prompts(n))
    await enqueue_prompts(store, spec("g", model="m"), prompts(n))
    fast = EngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0)
    fleet = SimFleet(
        [
            SimEndpoint(free_port(), fast, model="m", runner="generate"),
            SimEndpoint(free_port(), fast, model="m", runner="pooling"),
        ]
    )
    async with fleet:
        await asyncio.wait_for(
            run_engine(make_settings(batch_size=16, models_refresh_s=0.2), store, fleet.urls),
            timeout=60,
        )
    generate, pooling = fleet.endpoints
    g, e = await collect_lines(store, "g"), await collect_lines(store, "e")
    assert [x["text"] for x in g] == [completion_for(p, 16)[0] for p, _ in prompts(n)]
    assert {x["endpoint"] for x in g} == {generate.url}
    assert len(e) == n and all(x["error"] is None and x["embedding"] for x in e)
    assert {x["endpoint"] for x in e} == {pooling.url}
