"""Agents on the queue against real Redis, simulated endpoints and a real tool runner process:
every agent through its turns once, its tools run by the runner (a call all agents share run
once, each agent's own once each), its output checked against the schema."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic import BaseModel

from swarm_queue.common.chat import ToolCall
from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import Chat, JobSpec, Result, Usage, decode_result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents.flow import AgentFlow
from swarm_queue.flows.agents.spec import (
    AgentResult,
    AgentSpec,
    agent_prompts,
    build_agents,
    enqueue_agents,
    tool_definition,
)
from swarm_queue.flows.agents.state import AgentState
from swarm_queue.flows.steps import step_statuses, tokens_of
from swarm_queue.sim.engine import EngineConfig, SimEngine
from swarm_queue.sim.server import SimEndpoint, SimFleet
from swarm_queue.sim.tools import AUTO_REFUSED
from tests.harness import AGENT_SCHEMA, AGENT_TASK, command, tool_runner
from tests.helpers import run_engine, until

pytestmark = pytest.mark.slow

SCHEMA, TASK = AGENT_SCHEMA, AGENT_TASK


class Paper(BaseModel):
    """AGENT_SCHEMA as batch-agent's and Curator's users write it."""

    title: str
    year: int


@pytest.fixture
def runs_log(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Path]:
    """A tool runner process on this test's Redis; the file it writes each run to."""
    log = tmp_path / "runs.log"
    log.touch()
    env = {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix}
    proc = tool_runner(env, log, tmp_path / "runner.log")
    yield log
    proc.terminate()
    proc.wait(timeout=30)


async def test_agents_take_their_turns_share_a_tool_call_and_answer_as_data(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    n = 60
    tools = [tool_definition("slow_add"), tool_definition("fetch")]
    specs, _ = build_agents(
        "ag",
        JobOptions(max_tokens=64),
        AgentSpec(max_turns=3, output_schema=SCHEMA),
        tools,
        source="test",
    )
    # Every turn of the job's priority: the service order puts earlier turns first.
    assert [(s.job, s.priority) for s in specs] == [("ag", 0), ("ag:s1", 0), ("ag:s2", 0)]
    inputs = [{"n": i, "custom_id": f"paper-{i}"} for i in range(n)]
    await enqueue_agents(store, specs, agent_prompts(TASK, inputs, system="Be exact."))
    async with sim_fleet(2, tool_parser="hermes") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    raws = await store.outcomes("ag", 0, n)
    results = [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]
    assert [r.index for r in results] == list(range(n))  # every agent finished
    for r in results:
        assert r.ok, r
        assert set(r.output) == {"title", "year"} and isinstance(r.output["year"], int)
        assert (r.turns, r.tool_calls, r.custom_id) == (3, 2, f"paper-{r.index}")
        assert (r.tool_runs, r.tools_cut) == (2, 0)  # each answer from one run, whole
        assert json.loads(r.text or "") == r.output
    # The job's tokens are its agents' every turn's, not the first turn's alone.
    spec = await store.load_spec("ag")
    used = tokens_of(await store.status("ag"), await step_statuses(store, spec))
    assert used == (
        sum(r.prompt_tokens for r in results),
        sum(r.completion_tokens for r in results),
        0,  # (swarm-sim without --enable-prompt-tokens-details says no cached tokens)
        0,
    )
    assert used[0] > (await store.status("ag")).prompt_tokens
    runs = (await asyncio.to_thread(runs_log.read_text)).split()
    assert runs.count("slow_add") == 1  # shared by all 60 agents: run once
    assert runs.count("fetch") == n  # each agent's own: once each


async def test_the_answers_of_every_parked_agent_are_read_at_once_each_call_once(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round of the agents' flow asks Redis for the tool answers of all its parked agents
    in one go, each call once however many agents wait on it: asked agent by agent, a
    thousand agents parked at once kept the next turns waiting a second for the reads."""
    from swarm_queue.flows.agents.flow import AgentFlow
    from swarm_queue.flows.agents.toolcalls import ToolCaller

    asked: list[list[str]] = []  # per round that found agents parked: the keys of each ask
    unpark, answers = AgentFlow._unpark, ToolCaller.answers

    async def one_round(self: AgentFlow, spec: JobSpec) -> bool:
        asked.append([])
        return await unpark(self, spec)

    async def spied(self: ToolCaller, calls: Any) -> Any:
        asked[-1].append(",".join(k for k, _, _ in calls))
        return await answers(self, calls)

    monkeypatch.setattr(AgentFlow, "_unpark", one_round)
    monkeypatch.setattr(ToolCaller, "answers", spied)
    await _queue_agents(store, "ag", 40)
    async with sim_fleet(2, tool_parser="hermes") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    assert (await store.status("ag", rate=False)).done == 40
    rounds = [keys for keys in asked if keys]
    assert rounds and all(len(keys) == 1 for keys in rounds), rounds  # one ask a round
    for (keys,) in rounds:
        assert len(keys.split(",")) == len(set(keys.split(",")))  # each call once
    # Rounds found many agents parked on the shared call and their own: asked together.
    assert max(len(keys.split(",")) for (keys,) in rounds) > 2


async def test_an_agent_goes_on_the_moment_its_turn_is_answered_not_with_its_batch(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """A batch of chat turns is one request per prompt: each answer is committed (and its
    agent moved on, here ended) as it comes, not once the batch's longest answer is in, or
    every agent would wait on its batch's slowest at each turn."""
    n = 32  # one batch
    specs, _ = build_agents(
        "ag", JobOptions(max_tokens=64), AgentSpec(max_turns=2), [tool_definition("fetch")],
        source="test",
    )  # fmt: skip
    await enqueue_agents(store, specs, agent_prompts("Question {n}.", [{"n": i} for i in range(n)]))
    ended_before: list[int] = []

    async def ended() -> int:
        return len([r for r in await store.outcomes("ag", 0, n) if r is not None])

    async with sim_fleet(1, tool_parser="hermes") as fleet:
        sim = fleet.endpoints[0]
        answer = sim.chat_answer

        async def held(req: Any, **kw: Any) -> Any:
            # The last agent's turn is answered only once another agent of its batch has
            # ended (in order, not in time: a batch-wise commit never gets there).
            if "Question 31." in str(req.messages):
                try:
                    async with asyncio.timeout(120):
                        while (k := await ended()) == 0:  # noqa: ASYNC110 - Redis, not a task
                            await asyncio.sleep(0.01)
                except TimeoutError:
                    k = 0
                ended_before.append(k)
            return await answer(req, **kw)

        sim.chat_answer = held  # type: ignore[method-assign]
        await run_engine(make_settings(batch_size=n), store, fleet.urls)
    assert (await store.status("ag", rate=False)).done == n
    # Agents of its batch ended while its last agent's turn was still being answered.
    assert ended_before and 0 < ended_before[0] < n, ended_before


async def _queue_agents(store: JobStore, job: str, n: int) -> None:
    """``n`` agents of up to 3 turns, each calling slow_add (shared) and fetch (its own)."""
    tools = [tool_definition("slow_add"), tool_definition("fetch")]
    options = JobOptions(max_tokens=64)
    specs, _ = build_agents(job, options, AgentSpec(max_turns=3), tools, source="test")
    await enqueue_agents(store, specs, agent_prompts(TASK, [{"n": i} for i in range(n)]))


async def _first_turns_calling_a_tool(store: JobStore, job: str) -> None:
    """Two agents of ``job`` whose first turns are answered, each with a call of ``fetch``
    (20 prompt and 7 completion tokens), and committed for the pump to take."""
    await _queue_agents(store, job, 2)
    got = await store.read_new(job, "c", 2)
    gen = (await store.load_spec(job)).generation
    call = ToolCall("call_1", "fetch", '{"url": "doc1"}')
    usage = Usage(prompt_tokens=20, completion_tokens=7)
    answers = [Result(index=i, tool_calls=[call], usage=usage) for i in range(2)]
    batch = [(eid, r, payload) for (eid, payload), r in zip(got, answers, strict=True)]
    await store.commit(job, batch, gen=gen, moves_on=True)


async def _assert_first_turns_counted_once(store: JobStore, job: str) -> None:
    blobs = await store.input_states(job, [0, 1])
    states = [msgspec.msgpack.decode(b, type=AgentState) for b in blobs]
    assert [(s.turns, s.tool_calls, s.prompt_tokens, s.completion_tokens) for s in states] == [
        (1, 1, 20, 7)
    ] * 2


async def test_a_pump_that_dies_before_acknowledging_a_turn_counts_it_once(
    make_settings: Callable[..., Settings],
    store: JobStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen once in test_agents_e2e's killed worker: an agent's line said 4 turns and 3 tool
    calls where it took 3 and 2. A pump that recorded a turn's answers (the agents' states,
    their waits) and died before acknowledging them leaves them to the next pump, which took
    them again and counted the turn again. A turn is counted once, however often it is
    taken."""
    await _first_turns_calling_a_tool(store, "dp")
    settings = make_settings()
    dead = AgentFlow(store, settings, token="dead")

    async def killed(*_: object, **__: object) -> None:
        raise RuntimeError("killed before acknowledging")

    monkeypatch.setattr(dead, "_onward", killed)
    with pytest.raises(RuntimeError, match="killed"):
        await dead.step()
    await dead.close()
    await store.release_producer_lock(step_name("dp", 3), dead.token)  # (as if expired)
    pump = AgentFlow(store, settings, token="next")
    try:
        assert await pump.step()
    finally:
        await pump.close()
    await _assert_first_turns_counted_once(store, "dp")


async def test_two_pumps_in_one_process_count_each_turn_once(
    make_settings: Callable[..., Settings],
    store: JobStore,
) -> None:
    """Two engines in one process (two Swarm sessions on one Redis, say) each run an agent
    pump. Their lock token was the process's (host:pid), so both held an agent job's lock at
    once, and each took the answers the other was moving: agents' lines said 3 tool runs
    where 2 ran (the hand-on test below, its two endpoints' workers started one after the
    other). One pump holds a job's lock; a turn is counted once."""
    await _first_turns_calling_a_tool(store, "tp")
    settings = make_settings()
    one, two = AgentFlow(store, settings), AgentFlow(store, settings)
    try:
        await asyncio.gather(one.step(), two.step())
        assert [await one.lock(step_name("tp", 3)), await two.lock(step_name("tp", 3))].count(
            True
        ) == 1
    finally:
        await one.close()
        await two.close()
    await _assert_first_turns_counted_once(store, "tp")


async def test_an_agent_whose_turn_fails_for_good_ends_with_it_and_its_job_finishes(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    cli_env: dict[str, str],
) -> None:
    """Seen on a stock vLLM (no tool-call parser): every first turn refused 400, yet the
    agents "thinking" for ever, swarm-collect --wait never returning and every burst worker
    up until the job was deleted. Each agent now ends with its turn's failure."""
    n = 12
    await _queue_agents(store, "rj", n)
    async with sim_fleet(2) as fleet:  # started without a tool-call parser: "auto" refused
        # Bounded: before the fix the burst never ended (the pump had agents to move).
        await asyncio.wait_for(run_engine(make_settings(), store, fleet.urls), 300)
    raws = await store.outcomes("rj", 0, n)
    results = [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]
    assert [r.index for r in results] == list(range(n))
    for r in results:
        assert (r.failure, r.turns, r.tool_calls) == ("error", 1, 0), r
        assert AUTO_REFUSED in (r.error or ""), r.error
    status = await asyncio.to_thread(command, cli_env, "swarm-status", "rj")
    assert f"agents: {n} done, 0 waiting for a tool, 0 thinking (of {n})" in status.stdout


async def test_a_required_tool_choice_runs_agents_on_a_server_without_auto_tool_choice(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """``tool_choice`` required: a call at every turn but the last (constrained by the
    server's guided decoding), the last asked for the answer, the schema sent only there."""
    n = 20
    tools = [tool_definition("slow_add"), tool_definition("fetch")]
    agent = AgentSpec(max_turns=3, output_schema=SCHEMA, tool_choice="required")
    specs, _ = build_agents("rq", JobOptions(max_tokens=64), agent, tools, source="test")
    await enqueue_agents(store, specs, agent_prompts(TASK, [{"n": i} for i in range(n)]))
    # A tool-call parser, but not --enable-auto-tool-choice: "auto" would be refused.
    async with sim_fleet(2, tool_parser="hermes", auto_tool_choice=False) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
        sent = [body for e in fleet.endpoints for body in e.received]
    raws = await store.outcomes("rq", 0, n)
    results = [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]
    assert [r.index for r in results] == list(range(n))
    for r in results:
        assert r.ok and set(r.output) == {"title", "year"}, r
        assert (r.turns, r.tool_calls) == (3, 2)
    runs = (await asyncio.to_thread(runs_log.read_text)).split()
    assert (runs.count("slow_add"), runs.count("fetch")) == (1, n)
    by_turn = {
        sum(1 for m in b["messages"] if m["role"] == "assistant"): b for b in sent
    }  # a turn's request, by the answers before it
    assert {k: (b.get("tool_choice"), "response_format" in b) for k, b in by_turn.items()} == {
        0: ("required", False),
        1: ("required", False),
        2: ("none", True),
    }


def _choice(spec: JobSpec) -> Any:
    assert isinstance(spec.request, Chat)
    return spec.request.tool_choice


def test_a_tool_choice_is_one_of_the_words_or_a_tool_offered() -> None:
    tools = [tool_definition("fetch")]
    named = build_agents("a", JobOptions(), AgentSpec(tool_choice="fetch"), tools, source="t")[0]
    assert _choice(named[0]) == {"type": "function", "function": {"name": "fetch"}}
    assert [_choice(s) for s in named][-1] == "none"
    auto = build_agents("a", JobOptions(), AgentSpec(tool_choice="auto"), tools, source="t")[0]
    assert {_choice(s) for s in auto} == {None}  # the server's default: not sent
    with pytest.raises(ConfigError, match=r"tool_choice must be one of auto, required, none or "
                       r"a tool offered \(fetch\), got 'search'"):  # fmt: skip
        build_agents("a", JobOptions(), AgentSpec(tool_choice="search"), tools, source="t")
    with pytest.raises(ConfigError, match=r"tool_choice 'required' needs tools offered"):
        build_agents("a", JobOptions(), AgentSpec(tool_choice="required"), [], source="t")


async def test_swarm_collect_writes_agents_as_they_finished_and_refuses_other_jobs(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    n = 30
    await _queue_agents(store, "fin", n)
    async with sim_fleet(2, tool_parser="hermes") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    out = tmp_path / "fin.jsonl"
    got = await asyncio.to_thread(
        command, cli_env, "swarm-collect", "fin", "--out", out, "--as-finished"
    )
    assert got.returncode == 0, got.stderr
    assert got.stderr.strip() == f"agents fin: wrote {n} as they finished (0 failed)"
    written = [msgspec.json.decode(x)["index"] for x in out.read_bytes().splitlines()]
    finished, _ = await store.finished_since("fin", b"0")
    assert written == finished and sorted(written) == list(range(n))
    plain = await asyncio.to_thread(
        command, cli_env, "swarm-collect", "fin:s1", "--out", out, "--as-finished"
    )
    assert plain.returncode == 2
    assert "--as-finished is for agent jobs; 'fin:s1' is not one" in plain.stderr


async def _served(store: JobStore, job: str, n: int, turns: int) -> list[list[str | None]]:
    """The endpoint that served each of ``n`` agents' turns, turn by turn, once it is checked
    that every agent took every turn."""
    served = []
    for k in range(turns):
        step = step_name(job, k)
        at = list(range(n)) if k == 0 else await store.step_indices(step, range(n))
        assert None not in at  # every agent took every turn
        raws = await store.results_at(step, [i for i in at if i is not None])
        served.append([decode_result(r).endpoint if r else None for r in raws])
    return served


async def test_each_turn_goes_to_the_endpoint_that_served_the_turn_before(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """Its engine holds the conversation's prefix: every later turn of an agent is served
    where its first was, while the first turns spread over the endpoints."""
    n = 48
    await _queue_agents(store, "af", n)
    async with sim_fleet(3, tool_parser="hermes") as fleet:
        settings = make_settings(batch_size=4, inflight=1, lane_wait_ms=60_000)
        await run_engine(settings, store, fleet.urls)
    served = await _served(store, "af", n, 3)
    # Spread over endpoints (all three, unless one was slow to come up under load), so that
    # the same endpoint for every turn is affinity, not the only endpoint.
    assert len(set(served[0])) >= 2 and set(served[0]) <= {e.url for e in fleet.endpoints}
    assert served[1] == served[0] and served[2] == served[0]


async def test_turns_waiting_in_a_busy_engine_are_handed_to_an_idle_one_each_run_once(
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
) -> None:
    """Two small engines, one at a twentieth of the other's speed, each with turns waiting in
    its queue while the other at times has nothing to do: the slow one's worker hands its
    newest waiting batch on to the fast one, never the other way (the slow one is not worth
    a turn's cached prefix), and turns are served there though their turn before was the slow
    one's and the lane wait (a minute) moved none. Every agent still takes each turn once,
    each tool call runs once."""
    n = 48
    tools = [tool_definition("slow_add"), tool_definition("fetch")]
    specs, _ = build_agents(
        "ho", JobOptions(max_tokens=12), AgentSpec(max_turns=3), tools, source="test"
    )
    await enqueue_agents(store, specs, agent_prompts(TASK, [{"n": i} for i in range(n)]))
    # Both engines small enough to queue what their windows send (two batches of 1 on the
    # slow engine's one sequence: the newest is always waiting whole). The slow one's worker
    # starts first and the fast one's once the slow engine has taken four first turns, so the
    # slow lane holds four agents' later turns (started together, a loaded machine let the
    # fast one take every first turn before the slow one's first read, or have them all handed
    # on; with two agents in it, nothing was handed on in two suite runs under --cpu-stress:
    # a turn is handed on only while it waits behind another in the slow engine).
    slow = EngineConfig(max_num_seqs=1, speed=0.05, step_base_ms=10.0, step_per_seq_ms=0.0)
    fast = EngineConfig(max_num_seqs=4, step_base_ms=10.0, step_per_seq_ms=0.0)
    fleet = SimFleet(
        [SimEndpoint(free_port(), config, tool_parser="hermes") for config in (slow, fast)]
    )
    settings = make_settings(batch_size=1, lane_wait_ms=60_000, hand_on=True)
    async with fleet:
        slow_ep, fast_ep = fleet.endpoints
        slow_side = asyncio.create_task(run_engine(settings, store, [slow_ep.url]))
        await until(
            "four first turns sent to the slow engine", lambda: slow_ep.requests_total >= 4, 60
        )
        await run_engine(settings, store, [fast_ep.url])
        await slow_side
        slow_url, fast_url = slow_ep.url, fast_ep.url
    served = await _served(store, "ho", n, 3)
    assert {e for row in served for e in row} <= {slow_url, fast_url}
    moved = {(served[k - 1][i], served[k][i]) for k in (1, 2) for i in range(n)}
    seen = [slow_url, fast_url] + [" ".join((e or "-")[-5:] for e in row) for row in served]
    assert moved - {(slow_url, slow_url), (fast_url, fast_url)} == {(slow_url, fast_url)}, seen
    raws = await store.outcomes("ho", 0, n)
    results = [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]
    assert [r.index for r in results] == list(range(n))
    # (each agent's last answer cut at max_tokens: short turns keep the slow engine quick)
    counts = [(r.index, r.turns, r.tool_calls, r.tool_runs) for r in results]
    assert counts == [(i, 3, 2, 2) for i in range(n)]
    runs = (await asyncio.to_thread(runs_log.read_text)).split()
    assert (runs.count("slow_add"), runs.count("fetch")) == (1, n)


class _NothingWaits(SimEngine):
    """An engine whose gauges never show a request waiting (a new one waits for the next
    step; the worker's look at the gauges may land between): only begun turns are left to
    hand on."""

    @property
    def num_waiting(self) -> int:
        return 0


@pytest.mark.parametrize("young_ms", [0, 60_000])
async def test_turns_just_begun_in_a_slow_engine_are_handed_to_an_idle_one_each_run_once(
    young_ms: int,
    runs_log: Path,
    make_settings: Callable[..., Settings],
    store: JobStore,
) -> None:
    """A slow engine (a tenth of the other's speed) with nothing waiting in its queue holds
    its lane's turns while the fast one has nothing to do: with ``hand_on_young_ms``, a batch
    begun under that long ago, none of it answered, is handed on (its sequences aborted,
    their few tokens decoded thrown away); without it nothing is handed on, and no running
    sequence is aborted. Never by
    the fast one. Either way every agent takes each turn once and each tool call runs
    once."""
    n = 48
    tools = [tool_definition("slow_add"), tool_definition("fetch")]
    specs, _ = build_agents(
        "hy", JobOptions(max_tokens=32), AgentSpec(max_turns=3), tools, source="test"
    )
    # Every other agent answers at its first turn, at lengths of 8 to 32 tokens: both
    # engines' batches of 4 time their decoding from the start (what a begun turn is handed
    # on by: the gaps between one batch's answers); the others call their tools.
    calls = 'CALL slow_add({{"a": 1, "b": 2}}) then CALL fetch({{"url": "doc{n}"}})'
    inputs = [{"n": i, "calls": calls.format(n=i) if i % 2 else ""} for i in range(n)]
    await enqueue_agents(store, specs, agent_prompts("Find paper {n}. {calls}", inputs))
    # A step of 100 ms on the slow engine, 10 on the fast.
    slow = EngineConfig(max_num_seqs=64, speed=0.1, step_base_ms=10.0, step_per_seq_ms=0.0)
    fast = EngineConfig(max_num_seqs=64, step_base_ms=10.0, step_per_seq_ms=0.0)
    endpoints = [SimEndpoint(free_port(), c, tool_parser="hermes") for c in (slow, fast)]
    endpoints[0].engine.__class__ = _NothingWaits
    settings = make_settings(  # (no tail copies of the first turn: their losers abort too)
        batch_size=4, lane_wait_ms=60_000, hand_on=True, hand_on_young_ms=young_ms,
        speculate=False,
    )  # fmt: skip
    async with SimFleet(endpoints):
        engine = await run_engine(settings, store, [e.url for e in endpoints])
    slow_side, fast_side = (d.figures for d in engine.drainers)
    aborted = [e.engine.aborted_running for e in endpoints]
    seen = (young_ms, slow_side.prompts_done, slow_side.handed_on, aborted)
    assert fast_side.handed_on == 0 and aborted[1] == 0, seen
    # (a batch handed on within its first step never ran: aborted waiting, not running)
    if young_ms:
        assert slow_side.handed_on > 0, seen
    else:
        assert slow_side.handed_on == 0 and aborted[0] == 0, seen
    raws = await store.outcomes("hy", 0, n)
    results = [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]
    assert [r.index for r in results] == list(range(n))
    took = [(r.turns, r.tool_calls, r.tool_runs) for r in results]
    assert took == [(3, 2, 2) if i % 2 else (1, 0, 0) for i in range(n)], took
    runs = (await asyncio.to_thread(runs_log.read_text)).split()
    assert (runs.count("slow_add"), runs.count("fetch")) == (1, n // 2)


async def test_the_python_api_runs_agents_with_its_own_tool_functions(
    redis_url: str,
    prefix: str,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swarm_queue.producer.api import Swarm
    from tests.agent_tools import fetch, slow_add

    log = tmp_path / "runs.log"
    log.touch()
    monkeypatch.setenv("SWARM_TEST_TOOL_LOG", str(log))
    async with (
        sim_fleet(2, tool_parser="hermes") as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        results = [
            r
            async for r in swarm.agents(
                task=TASK,
                inputs=[{"n": i} for i in range(30)],
                tools=[slow_add, fetch],
                output_schema=Paper,  # a Pydantic model: its instances come back
                max_turns=3,
                max_tokens=64,
            )
        ]
        # As they finish rather than in input order: each once.
        finished = [
            r.index
            async for r in swarm.agents(
                task=TASK,
                inputs=[{"n": i} for i in range(30)],
                tools=[slow_add, fetch],
                max_turns=3,
                max_tokens=64,
                in_order=False,
            )
        ]
        with pytest.raises(ConfigError, match="module-level function"):
            async for _ in swarm.agents(task=TASK, inputs=[], tools=[lambda: "x"]):
                pass
    assert sorted(finished) == list(range(30))
    assert [r.index for r in results] == list(range(30))
    assert all(r.ok and isinstance(r.output, Paper) for r in results)
    assert all(isinstance(r.output.year, int) and r.output.title for r in results)
    runs = (await asyncio.to_thread(log.read_text)).split()
    assert runs.count("slow_add") == 1 and runs.count("fetch") == 30


async def test_agents_waiting_on_a_tool_hold_no_slot_of_any_endpoint(
    redis_url: str,
    prefix: str,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swarm_queue.producer.api import Swarm
    from tests import agent_tools

    n = 40
    monkeypatch.setenv("SWARM_TEST_TOOL_LOG", str(tmp_path / "runs.log"))
    monkeypatch.setattr(agent_tools, "GATE", asyncio.Event())
    port = free_port()
    metrics = {"metrics_port": port, "metrics_addr": "127.0.0.1", "stats_period_s": 0.1}
    async with (
        sim_fleet(2, tool_parser="hermes") as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50, **metrics) as swarm,
    ):
        run = swarm.agents(
            task='Look up {n}. CALL wait_gate({{"topic": "t{n}"}})',
            inputs=[{"n": i} for i in range(n)],
            tools=[agent_tools.wait_gate],
            max_turns=2,
            max_tokens=64,  # room for every answer: one cut off fails as such
            job="gated",
        )
        collected = asyncio.create_task(_all(run))
        async with asyncio.timeout(30):  # every agent's first turn answered, its tool awaited
            while len(await swarm.store.parked("gated")) < n:  # noqa: ASYNC110 - state in Redis
                await asyncio.sleep(0.02)
        # Every agent waits on its tool: no endpoint runs or queues any of their sequences.
        assert [(e.engine.num_running, e.engine.num_waiting) for e in fleet.endpoints] == [
            (0, 0),
            (0, 0),
        ]
        # The worker's metrics say so too, once its figures are read again.
        async with asyncio.timeout(30):
            while _gauge(await asyncio.to_thread(_page, port), "gated", "waiting") != n:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        agent_tools.GATE.set()
        results = await collected
    assert [r.index for r in results] == list(range(n))
    assert all(r.ok and r.turns == 2 and r.tool_calls == 1 for r in results)


def _page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _gauge(page: str, job: str, state: str) -> float:
    want = f'swarm_agents{{job="{job}",state="{state}"}} '
    return next((float(x[len(want) :]) for x in page.splitlines() if x.startswith(want)), -1.0)


async def _all(run: Any) -> list[AgentResult]:
    return [r async for r in run]


async def test_an_answer_off_schema_is_repaired_then_fails_and_the_last_turn_ends_asking(
    redis_url: str,
    prefix: str,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swarm_queue.producer.api import Swarm
    from tests.agent_tools import fetch

    monkeypatch.setenv("SWARM_TEST_TOOL_LOG", str(tmp_path / "runs.log"))
    verdict = {
        "type": "object",
        "properties": {"verdict": {"enum": ["yes", "no"]}},
        "required": ["verdict"],
    }
    async with (
        sim_fleet(1, tool_parser="hermes") as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        # The simulator's object never names an enum's value: the answer stays off schema.
        off = [
            r
            async for r in swarm.agents(
                task="Judge claim {n}.",
                inputs=[{"n": i} for i in range(5)],
                output_schema=verdict,
                max_turns=3,
                max_repairs=1,
                max_tokens=32,
            )
        ]
        # Two tools asked for, two turns allowed: the last turn still asks.
        asking = [
            r
            async for r in swarm.agents(
                task='Read {n}. CALL fetch({{"url": "a{n}"}}) CALL fetch({{"url": "b{n}"}})',
                inputs=[{"n": i} for i in range(5)],
                tools=[fetch],
                max_turns=2,
                max_tokens=32,
            )
        ]
    assert all(r.failure == "schema" and r.turns == 2 for r in off)  # one repair, then failed
    assert all("does not match the schema" in (r.error or "") for r in off)
    assert all(r.failure == "max_turns" and r.turns == 2 and r.tool_calls == 1 for r in asking)
    assert all(r.error == "asked for tools at its last turn (2)" for r in asking)


async def test_an_answer_cut_off_at_max_tokens_is_repaired_then_fails_as_such(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """Seen on vLLM: an answer cut off by max_tokens (finish_reason "length", a tool call
    half written) taken as the agent's output."""
    n = 6
    tools = [tool_definition("fetch")]
    agent = AgentSpec(max_turns=3, max_repairs=1, output_schema=SCHEMA)
    for job, max_tokens in (("cut", 6), ("whole", 64)):
        specs, _ = build_agents(job, JobOptions(max_tokens=max_tokens), agent, tools, source="t")
        await enqueue_agents(
            store, specs, agent_prompts("Name paper {n}.", [{"n": i} for i in range(n)])
        )
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
        sent = list(fleet.endpoints[0].received)
    cut = [
        msgspec.msgpack.decode(r, type=AgentResult) for r in await store.outcomes("cut", 0, n) if r
    ]
    assert [r.index for r in cut] == list(range(n))
    for r in cut:  # the first answer cut, one repair cut too: failed as such, its text kept
        assert (r.failure, r.turns, r.error) == (
            "length",
            2,
            "the answer was cut off at max_tokens (6 tokens)",
        ), r
        assert r.text and r.output is None
    repairs = [b for b in sent if "was cut off at max_tokens" in b["messages"][-1]["content"]]
    assert len(repairs) == n
    # The same agents with room to answer: the schema's object at their last turn.
    whole = [
        msgspec.msgpack.decode(r, type=AgentResult)
        for r in await store.outcomes("whole", 0, n)
        if r
    ]
    assert all(r.ok and set(r.output) == {"title", "year"} for r in whole), whole
