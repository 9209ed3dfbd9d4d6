"""Pipelines in one process against real Redis: every input through every step, keyed by its
input index, each step's prompts built from the answer before; filters; no barrier."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import Result, decode_item, decode_result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.pipeline.flow import PipelineFlow
from swarm_queue.flows.pipeline.spec import (
    Keep,
    Link,
    StepOptions,
    build_pipeline,
    enqueue_pipeline,
    fill,
)
from swarm_queue.producer.api import Swarm
from swarm_queue.producer.enqueue import split_steps
from swarm_queue.producer.specs import Concat, Step, TreeReduce
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from tests.helpers import prompts, run_engine

T1 = "Check this answer: {answer}\nQuestion was: {prompt}"
T2 = "Summarise: {answer}"


def expected(prompt: str, steps: list[tuple[str, int]], first_max: int) -> list[str]:
    """What the simulator answers at each step for ``prompt``."""
    texts = [completion_for(prompt, first_max)[0]]
    for template, max_tokens in steps:
        texts.append(completion_for(fill(template, texts[-1], prompt), max_tokens)[0])
    return texts


async def _results(store: JobStore, job: str) -> dict[int, str | None]:
    raw = await store.redis.hgetall(store.keys.results(job))
    return {int(k): decode_result(v).text for k, v in raw.items()}


async def _fed(store: JobStore, job: str) -> dict[int, int]:
    raw = await store.redis.hgetall(store.keys.fed(job))
    return {int(o): int(i) for o, i in raw.items()}


async def test_three_steps_answer_every_input_in_its_place(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 300
    steps = [
        StepOptions(template=T1, options=JobOptions(max_tokens=12)),
        StepOptions(template=T2, options=JobOptions(max_tokens=6)),
    ]
    specs, _ = build_pipeline("p", JobOptions(max_tokens=16), steps, source="test")
    inputs = list(prompts(n))
    await enqueue_pipeline(store, specs, inputs)
    async with sim_fleet(3) as fleet:
        await run_engine(settings, store, fleet.urls)
    for k in (1, 2):
        status = await store.status(step_name("p", k))
        assert (status.total, status.done, status.failed) == (n, n, 0)
    by_step = [await _results(store, step_name("p", k)) for k in range(3)]
    fed = [await _fed(store, step_name("p", k)) for k in (1, 2)]
    for i, (prompt, _) in enumerate(inputs):
        want = expected(prompt, [(T1, 12), (T2, 6)], 16)
        got = [by_step[0][i], by_step[1][fed[0][i]], by_step[2][fed[1][i]]]
        assert got == want, i


async def test_no_step_waits_for_the_one_before_to_end(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    steps = [
        StepOptions(template=T1, options=JobOptions(max_tokens=4)),
        StepOptions(template=T2, options=JobOptions(max_tokens=4)),
    ]
    specs, _ = build_pipeline("p", JobOptions(max_tokens=16), steps, source="test")
    await enqueue_pipeline(store, specs, prompts(3000))
    # Engines of 32 sequences: the first step alone takes about 11 s, far longer than one
    # input's way through all three (the claim holds on a loaded machine too: at 4 s, a
    # run beside 4 busy processes on 2 cores saw the first step end first).
    slow = EngineConfig(max_num_seqs=32, step_base_ms=15.0, step_per_seq_ms=0.0)
    async with sim_fleet(2, slow) as fleet:
        await run_engine(settings, store, fleet.urls)
    first = await store.meta("p")
    last = await store.meta(step_name("p", 2))
    # The first input through all three steps came back long before the first step ended.
    assert float(last[Meta.FIRST_RESULT_S]) < float(first[Meta.FINISHED_S])
    assert int(last[Meta.DONE]) == 3000


async def test_a_redelivered_batch_moves_its_answers_on_once(
    store: JobStore, settings: Settings
) -> None:
    steps = [StepOptions(template=T2)]
    specs, _ = build_pipeline("p", JobOptions(max_tokens=4), steps, source="test")
    await enqueue_pipeline(store, specs, prompts(10))
    got = await store.read_new("p", "c", 10)
    gen = (await store.load_spec("p")).generation
    batch = [(eid, Result(index=i, text=f"a{i}"), payload) for i, (eid, payload) in enumerate(got)]
    await store.commit("p", batch[:6], gen=gen, moves_on=True)
    await store.commit("p", batch, gen=gen, moves_on=True)  # a copy of the first six too
    assert await store.redis.xlen(store.keys.landed("p")) == 10
    pump = PipelineFlow(store, settings)
    assert await pump.step()
    target = step_name("p", 1)
    assert await store.enqueued_count(target) == 10
    assert await store.redis.xlen(store.keys.landed("p")) == 0  # acknowledged and deleted
    entries = await store.redis.xrange(store.keys.stream(target))
    items = [decode_item(f[b"d"]) for _, f in entries]
    assert [(it.index, it.origin, it.prompt) for it in items] == [
        (i, i, f"Summarise: a{i}") for i in range(10)
    ]
    assert Meta.TOTAL not in await store.meta(target)
    assert await pump.step()  # nothing new, and step 0 has finished: the next is sealed
    assert int((await store.meta(target))[Meta.TOTAL]) == 10
    assert not await pump.step()


async def test_a_pump_that_dies_holding_answers_leaves_them_to_the_next(
    store: JobStore, settings: Settings
) -> None:
    specs, _ = build_pipeline(
        "p", JobOptions(max_tokens=4), [StepOptions(template=T2)], source="test"
    )
    await enqueue_pipeline(store, specs, prompts(5))
    got = await store.read_new("p", "c", 5)
    gen = (await store.load_spec("p")).generation
    batch = [(eid, Result(index=i, text=f"a{i}"), payload) for i, (eid, payload) in enumerate(got)]
    await store.commit("p", batch, gen=gen, moves_on=True)
    await store.ensure_pump_group("p")
    taken = await store.take_landed("p", "dead/pump", 3)  # it took three, then died
    assert [x.index for x in taken] == [0, 1, 2]
    pump = PipelineFlow(store, settings, token="next")
    assert await pump.step()  # first what the dead one held
    target = step_name("p", 1)
    assert await store.step_indices(target, range(5)) == [0, 1, 2, None, None]
    assert await pump.step()  # then the rest
    assert await store.step_indices(target, range(5)) == [0, 1, 2, 3, 4]
    assert await pump.step()  # step 0 is finished: the next is sealed
    assert int((await store.meta(target))[Meta.TOTAL]) == 5


def test_templates_fill_in_one_pass() -> None:
    assert fill("{prompt} -> {answer}", "see {prompt}", "Q") == "Q -> see {prompt}"


def test_a_pipeline_refuses_what_it_cannot_run() -> None:
    def build(**kw: object) -> None:
        step = StepOptions(**{"template": "{answer}", **kw})
        build_pipeline("p", JobOptions(), [step], source="t")

    with pytest.raises(ConfigError, match=r"step 1's template has no \{answer\}"):
        build(template="no answer here")
    # Seen: '{answr}' accepted, and sent on as written.
    with pytest.raises(
        ConfigError,
        match=r"step 1's template names \{answr\}, \{question\}: only \{answer\} \(the "
        r"step before's answer\) and \{prompt\} \(the input's\) are filled in",
    ):
        build(template="{answer} {answr} {question} {prompt}")
    build(template='Rate {answer} as JSON: {"score": 1}')  # braces that name nothing are text
    with pytest.raises(ConfigError, match="step 1's keep-if '\\(': missing \\)"):
        build(keep_if="(")
    with pytest.raises(ConfigError, match="step 1: max_tokens must be >= 1"):
        build(options=JobOptions(max_tokens=0))
    with pytest.raises(ConfigError, match="at most 63 steps"):
        build_pipeline("p", JobOptions(), [StepOptions(template="{answer}")] * 64, source="t")


def test_a_keep_function_runs_only_where_the_workers_allow_it() -> None:
    link = Link(job="p:s1", template="{answer}", keep_fn="tests.test_flows_pipeline:short")
    assert Keep(link, ()).refused == (
        "keep function tests.test_flows_pipeline:short (SWARM_REDUCE_FUNCTIONS does not allow "
        "it here)"
    )
    keep = Keep(link, ["tests.test_flows_pipeline:*"])
    assert keep.why_not("x") is None
    assert keep.why_not("far too long") == "tests.test_flows_pipeline:short refused the answer"
    assert keep.why_not("") == "tests.test_flows_pipeline:short raised ValueError: empty"
    regex = Keep(Link(job="p:s1", template="{answer}", keep_if="^yes"), ())
    assert regex.why_not("yes, because") is None
    assert regex.why_not("no") == "the answer does not match keep-if '^yes'"


def short(answer: str) -> bool:
    """A keep function of the tests: short answers go on."""
    if not answer:
        raise ValueError("empty")
    return len(answer) < 5


def test_the_command_line_cuts_at_each_then() -> None:
    head, steps = split_steps(
        ["in.txt", "--job", "j", "--then", "a.txt", "--chat", "--then=b.txt", "--keep-if", "x"]
    )
    assert head == ["in.txt", "--job", "j"]
    assert steps == [["a.txt", "--chat"], ["b.txt", "--keep-if", "x"]]


def long_enough(answer: str) -> bool:
    """A keep function of the API test: answers of ten words or more go on."""
    return len(answer.split()) > 9


async def test_the_python_api_runs_a_pipeline_and_streams_its_chains(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet]
) -> None:
    texts = [p for p, _ in prompts(200)]
    async with (
        sim_fleet(2) as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        job = await swarm.pipeline(
            texts,
            [Step(T1, max_tokens=10), Step(T2, keep=long_enough, max_tokens=5)],
            max_tokens=8,
        )
        chains = [c async for c in swarm.chains(job)]
        # Seen: results() of a pipeline gave its first step's answers as if they were its own.
        with pytest.raises(ConfigError, match=f"job {job} is a pipeline: its results are chains"):
            [r async for r in swarm.results(job)]
        with pytest.raises(ConfigError, match="module-level function"):
            Step(T2, keep=lambda a: True)
    assert [c.index for c in chains] == list(range(200))
    kept = 0
    for c, prompt in zip(chains, texts, strict=True):
        t0 = completion_for(prompt, 8)[0]
        t1 = completion_for(fill(T1, t0, prompt), 10)[0]
        if len(t1.split()) > 9:
            kept += 1
            assert c.text == completion_for(fill(T2, t1, prompt), 5)[0]
            assert [s.step for s in c.steps] == [0, 1, 2]
        else:
            assert c.stopped_at == 2
            assert c.error == (
                "not sent to step 2: tests.test_flows_pipeline:long_enough refused the answer"
            )
    assert 0 < kept < 200


async def test_a_pipelines_reduce_runs_over_its_last_step_in_input_order(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet]
) -> None:
    texts = [p for p, _ in prompts(120)]
    async with (
        sim_fleet(2) as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        job = await swarm.pipeline(
            texts,
            [Step(T2, keep=long_enough, max_tokens=5)],
            max_tokens=10,
            reduce=Concat(separator="|"),
        )
        final = await swarm.final(job)
        with pytest.raises(ConfigError, match="a tree reduce is not supported there yet"):
            await swarm.pipeline(texts, [Step(T2)], reduce=TreeReduce("{responses}"))
    assert final is not None and final.error is None
    kept = []
    for i, prompt in enumerate(texts):
        t0 = completion_for(prompt, 10)[0]
        if long_enough(t0):
            kept.append(completion_for(fill(T2, t0, prompt), 5)[0])
        else:
            assert any(f.index == i for f in final.failed), i
    assert final.value == "|".join(kept)  # input order, whatever order the step ran in
    assert final.used == len(kept) and len(final.failed) == 120 - len(kept) > 0


async def test_a_fault_of_a_flow_is_said_and_every_flow_goes_on(
    settings: Settings, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected error in one flow's round (a bug, a record no pump expected) must end
    neither the loop that moves every workflow's work nor the other flows' rounds."""
    engine = Engine(settings, store, [EndpointClient("http://127.0.0.1:9")])
    first, *rest = engine.pumps.flows
    rounds = others = 0

    async def counted() -> bool:
        nonlocal others
        others += 1
        return False

    async def faulty() -> bool:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            raise ValueError("a name no pump expected")
        if rounds == 3:
            engine.request_stop()
        return True  # moved: the next round at once

    first.step = faulty  # type: ignore[method-assign]
    for other in rest:
        other.step = counted  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.ERROR, "swarm"):
            await engine._pump_loop()
    finally:
        await engine.close()
    assert rest and rounds == 3 and others == 3 * len(rest)  # the others ran in that round too
    assert "pipeline flow" in caplog.text and "a name no pump expected" in caplog.text


async def test_a_pipeline_deleted_and_queued_again_is_pumped_as_the_new_one(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """The pump keeps no state of a step's old life: the new job's answers move on."""
    specs, _ = build_pipeline("p", JobOptions(max_tokens=4), [StepOptions(template=T2)], source="t")
    pump = PipelineFlow(store, make_settings(jobs_refresh_s=1e-9))  # every round

    async def answer_all(text: str) -> None:
        got = await store.read_new("p", "c", 10)
        gen = (await store.load_spec("p")).generation
        batch = [(e, Result(index=i, text=f"{text}{i}"), d) for i, (e, d) in enumerate(got)]
        await store.commit("p", batch, gen=gen, moves_on=True)

    await enqueue_pipeline(store, specs, prompts(5))
    await answer_all("old")
    assert await pump.step()
    await store.delete_job("p")
    await enqueue_pipeline(store, specs, prompts(5))
    await answer_all("new")
    for _ in range(4):  # the stale step is found gone, then the new answers move on
        await pump.step()
    entries = await store.redis.xrange(store.keys.stream(step_name("p", 1)))
    assert [decode_item(f[b"d"]).prompt for _, f in entries] == [
        f"Summarise: new{i}" for i in range(5)
    ]
