"""The reduce stage against a real Redis and swarm-sim, with the drain engine in-process: a tree
reduce over three levels, context-sized groups, aggregators with failures, idempotent stages,
a step that outlasts its time. (Real worker processes killed between stages are in
test_reduce_e2e.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.keys import stage_name
from swarm_queue.common.models import JobSpec, PromptItem, ReduceSpec, Result, SamplingParams
from swarm_queue.common.reduce import render
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore, index_of
from swarm_queue.flows.reduce.flow import ReduceFlow
from swarm_queue.flows.reduce.reducer import StageBusy
from swarm_queue.producer.api import Swarm, scatter_gather
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.specs import Concat
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.inmemory import InMemoryBackend
from swarm_queue.worker.replies import ModelInfo
from tests.helpers import gen_of, prompts, run_engine

TEMPLATE = "Level {level}. Summarise these answers in one line:\n{responses}\nSummary:"


def tree_spec(job: str = "t", fanin: int = 10, max_tokens: int = 16) -> JobSpec:
    return JobSpec(
        job=job,
        params=SamplingParams(max_tokens=max_tokens),
        reduce=ReduceSpec(kind="tree", prompt=TEMPLATE, fanin=fanin),
    )


def expected_tree(leaves: list[str], fanin: int, max_tokens: int) -> tuple[str, list[int]]:
    """The tree's answer and prompts per level, computed offline from the sim's model."""
    answers = [completion_for(p, max_tokens)[0] for p in leaves]
    per_level = []
    level = 0
    while len(answers) > 1:
        level += 1
        groups = [answers[i : i + fanin] for i in range(0, len(answers), fanin)]
        sup = [render(TEMPLATE, g, level) for g in groups]
        per_level.append(len(sup))
        answers = [completion_for(p, 2 * max_tokens)[0] for p in sup]
    return answers[0].strip(), per_level


async def test_tree_reduce_over_1000_leaves_runs_three_levels_with_no_collector(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    leaves = [p for p, _ in prompts(1000)]
    await enqueue_prompts(store, tree_spec(), ((p, None) for p in leaves))
    async with sim_fleet(2) as fleet:
        # burst returns only once the reduce has finished: nobody collects meanwhile
        await run_engine(make_settings(), store, fleet.urls)
    answer, per_level = expected_tree(leaves, 10, 16)
    assert per_level == [100, 10, 1]
    for level, n in enumerate(per_level, 1):
        status = await store.status(stage_name("t", level))
        assert (status.total, status.done, status.failed) == (n, n, 0)
    final = await store.read_final("t")
    assert final is not None
    assert (final.kind, final.value, final.used, final.failed, final.error) == (
        "tree",
        answer,
        1000,
        [],
        None,
    )
    assert [(lv.level, lv.prompts, lv.failed) for lv in final.levels] == [
        (1, 100, 0),
        (2, 10, 0),
        (3, 1, 0),
    ]


async def test_a_look_for_work_left_counts_a_stage_only_its_second_sweep_finds(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """Seen in CI under load: a burst engine returned with a tree's last stage queued and not
    run. Its look for work left swept the jobs, found none with work and no reduce pending,
    and swept again: the stage the reduce (advancing in the background) had queued meanwhile
    came in with that second sweep, but only the reduces pending were read after it. Here
    the stage comes in with the second sweep: it is work left."""
    await enqueue_prompts(store, JobSpec(job="t:r3", params=SamplingParams()), [("p", None)])
    engine = Engine(make_settings(), store, [EndpointClient("http://127.0.0.1:9")])
    sweeps = 0

    async def sweep(*, force: bool = False) -> None:
        nonlocal sweeps
        sweeps += 1
        if sweeps == 2:
            engine.table.jobs["t:r3"] = await store.load_spec("t:r3")

    engine.refresh_jobs = sweep  # type: ignore[method-assign]
    try:
        assert await engine.any_work()
    finally:
        await engine.close()
    assert sweeps == 2


async def test_groups_are_split_to_fit_the_context_and_failed_leaves_are_listed(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    leaves = [p for p, _ in prompts(60)]
    leaves[7] = "x" * 2400  # 600 tokens: over this context on its own
    spec = tree_spec(fanin=10, max_tokens=16)
    await enqueue_prompts(store, spec, ((p, None) for p in leaves))
    # 200 tokens of context, 32 of them for a supervisor's answer: 10 answers of about 25
    # tokens each do not fit one prompt.
    cfg = EngineConfig(max_model_len=200, step_base_ms=1.0, step_per_seq_ms=0.0)
    async with sim_fleet(2, cfg) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    level1 = await store.status(stage_name("t", 1))
    assert level1.total is not None and level1.total > 6  # more groups than 60 / 10
    # ... and every one of them fitted: none was rejected for its length
    assert (level1.done, level1.failed) == (level1.total, 0)
    final = await store.read_final("t")
    assert final is not None and final.error is None and isinstance(final.value, str)
    assert [(f.index, f.level, f.kind) for f in final.failed] == [(7, 0, "rejected")]
    assert "context length" in final.failed[0].error
    assert final.used == 59
    assert final.levels[0].split_groups > 0
    assert all(lv.failed == 0 for lv in final.levels)


async def test_aggregator_reduce_runs_when_the_map_stage_ends(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    spec = JobSpec(job="v", params=SamplingParams(max_tokens=8), reduce=ReduceSpec(kind="vote"))
    texts = ["same question"] * 5 + ["x" * 20000, "other question"]
    await enqueue_prompts(store, spec, ((t, None) for t in texts))
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    final = await store.read_final("v")
    assert final is not None
    winner = completion_for("same question", 8)[0].strip().casefold()
    assert final.value["winner"] == winner
    assert final.value["votes"] == 5
    assert final.value["share"] == 5 / 6
    assert [(f.index, f.kind) for f in final.failed] == [(5, "rejected")]


async def test_advancing_a_stage_twice_or_concurrently_queues_it_once(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    leaves = [p for p, _ in prompts(200)]
    await enqueue_prompts(store, tree_spec(), ((p, None) for p in leaves))
    async with sim_fleet(1) as fleet:
        clients = [EndpointClient(u) for u in fleet.urls]
        engine = Engine(make_settings(), store, clients)  # its drain path only: no flow runs
        flow = ReduceFlow(store, make_settings(), endpoints=clients)
        try:
            worked = 0
            while not (await store.status("t")).finished:
                worked += await engine.drainers[0].step(block_ms=50)
            assert worked == 7  # 200 leaves in batches of 32: seven steps that did work
            await flow.refresh(force=True)
            assert list(flow.work) == ["t"]  # its map stage finished: the reduce's to take
            outcomes = await asyncio.gather(
                flow.reducer.advance("t", 0), flow.reducer.advance("t", 0), return_exceptions=True
            )
            # one queued the level; the other met its lock, found it queued, or resumed it
            # with nothing left to add
            assert "level 1: 20 prompts" in outcomes
            other = outcomes[1 - outcomes.index("level 1: 20 prompts")]
            assert isinstance(other, StageBusy) or other in (
                "stale: the job is at stage 1",
                "level 1: 20 prompts",
            )
            assert await flow.reducer.advance("t", 0) == "stale: the job is at stage 1"
            await flow.refresh(force=True)
            assert flow.work == {}  # level 1 runs: nothing for the reduce until it finishes
            assert await store.redis.xlen(store.keys.stream(stage_name("t", 1))) == 20
            assert (await store.status(stage_name("t", 1))).total == 20
        finally:
            await engine.close()


class _TokenizerStuck(InMemoryBackend):
    """A server that answers prompts and states its context, but whose ``/tokenize`` never
    answers (the client's own timeout is minutes)."""

    async def models(self, timeout_s: float = 30.0) -> list[ModelInfo]:
        return [ModelInfo("shout", max_model_len=4096)]

    async def tokenize(self, prompt: str, model: str, timeout_s: float = 30.0) -> int | None:
        await asyncio.Event().wait()
        return None


async def test_a_reduce_step_that_outlasts_its_time_ends_the_job_with_the_reason(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    await enqueue_prompts(store, tree_spec(), ((p, None) for p, _ in prompts(40)))
    engine = Engine(make_settings(reduce_timeout_s=0.5), store, [_TokenizerStuck()])
    try:  # burst: returns once the job has ended
        await asyncio.wait_for(engine.run(burst=True), timeout=60)
    finally:
        await engine.close()
    final = await store.read_final("t")
    assert final is not None and final.value is None
    assert final.error == "reduce step at stage 0 took over 0.5 s (SWARM_REDUCE_TIMEOUT_S)"
    assert (await store.status("t")).done == 40


async def test_swarm_api_submits_follows_results_in_order_and_reads_the_reduce(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet]
) -> None:
    texts = [p for p, _ in prompts(300)]
    fleet = sim_fleet(2)
    async with fleet, Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm:
        job = await swarm.submit(texts, max_tokens=8, reduce=Concat(separator="|"))
        seen = [r async for r in swarm.results(job)]
        final = await swarm.final(job)
    expected = [completion_for(p, 8)[0] for p in texts]
    assert [r.index for r in seen] == list(range(300))
    assert [r.text for r in seen] == expected
    assert final is not None and final.value == "|".join(expected)


async def test_scatter_gather_is_one_call_on_a_private_redis(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    texts = [f"item {i}" for i in range(120)] + [("y" * 20000, "too-long")]
    async with sim_fleet(2) as fleet:
        results = await scatter_gather(texts, fleet.urls, max_tokens=8)
    assert [r.index for r in results] == list(range(121))
    assert [r.text for r in results[:120]] == [
        completion_for(f"item {i}", 8)[0] for i in range(120)
    ]
    assert results[120].custom_id == "too-long"
    assert results[120].error is not None and "context length" in results[120].error


async def test_swarm_api_cancel_ends_the_reduce_too_so_final_does_not_wait_forever(
    redis_url: str, prefix: str
) -> None:
    async with Swarm(redis_url, prefix=prefix) as swarm:  # no workers: nothing gets answered
        job = await swarm.submit([f"q{i}" for i in range(30)], reduce=Concat())
        await swarm.cancel(job)
        final = await asyncio.wait_for(swarm.final(job), timeout=10)
        status = await swarm.status(job)
    assert final is not None
    assert (final.kind, final.value, final.error) == (
        "concat",
        None,
        "cancelled by operator (swarm-cancel)",
    )
    assert (status.cancelled, status.failed_by_kind) == (True, {"cancelled": 30})


def test_swarm_refuses_a_session_that_nothing_would_serve() -> None:
    with pytest.raises(ConfigError, match="no Redis URL and no endpoints"):
        Swarm()


class _Crash(BaseException):
    """The worker process dying: not an error the reducer could catch and record."""


async def test_a_stage_change_cut_off_halfway_is_finished_by_the_next_run(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    leaves = [p for p, _ in prompts(2500)]
    await enqueue_prompts(store, tree_spec(fanin=2, max_tokens=4), ((p, None) for p in leaves))
    async with sim_fleet(2) as fleet:
        clients = [EndpointClient(u) for u in fleet.urls]
        flow = ReduceFlow(store, make_settings(), endpoints=clients)
        try:
            # The leaves' answers, committed as a worker would (what they say does not matter).
            taken = await store.read_new("t", "w", len(leaves))
            await store.commit(
                "t",
                [(eid, Result(index=index_of(eid), text="a"), None) for eid, _ in taken],
                gen=await gen_of(store, "t"),
            )
            assert (await store.status("t")).finished
            real_add = store.add_items
            calls = 0

            async def add_then_die(
                job: str,
                items: Sequence[PromptItem],
                digest: str = "",
                *,
                gen: str,
                affinity: Sequence[str] = (),
                chunk: int = 1,
                after: int | None = None,
            ) -> None:
                nonlocal calls
                calls += 1
                if calls == 2:  # the first chunk of level 1 is in; the process dies
                    raise _Crash
                await real_add(
                    job, items, digest, gen=gen, affinity=affinity, chunk=chunk, after=after
                )

            store.add_items = add_then_die  # type: ignore[method-assign]
            with pytest.raises(_Crash):
                await flow.reducer.advance("t", 0)
            store.add_items = real_add  # type: ignore[method-assign]
            level1 = stage_name("t", 1)
            assert await store.enqueued_count(level1) == 1000  # one chunk of 1,000
            assert (await store.status("t")).stage == 0  # not yet recorded as advanced
            assert await flow.reducer.advance("t", 0) == "level 1: 1250 prompts"
        finally:
            for client in clients:
                await client.close()
    entries = await store.redis.xrange(store.keys.stream(level1))
    assert [eid for eid, _ in entries] == [f"0-{i + 1}".encode() for i in range(1250)]
    status = await store.status(level1)
    assert (status.total, status.enqueued) == (1250, 1250)
