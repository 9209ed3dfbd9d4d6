"""Workflows on a fleet that is not uniform, against real Redis and real processes: tool
runners that allow different tools, a model that calls a tool its job did not offer, a tool no
runner serves, workers that allow different functions. Each case was seen failing (issue 30);
each must hold here."""

from __future__ import annotations

import asyncio
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import Keys
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents.end import CANCELLED
from swarm_queue.flows.agents.spec import (
    AgentResult,
    AgentSpec,
    agent_prompts,
    build_agents,
    enqueue_agents,
    tool_definition,
)
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for, embedding_for
from tests.harness import (
    MAX_TOKENS,
    TOOL_PARSER_ARGS,
    FleetFactory,
    check_output,
    collect,
    command,
    fleet_prompt,
    tool_runner,
)
from tests.helpers import run_engine, wait_count, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def runners(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Callable[[str], Path]]:
    """Start a tool runner process allowing the given tests.agent_tools functions; returns
    the file it writes each run to. Every runner is stopped after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(tools: str) -> Path:
        log = tmp_path / f"runs-{len(procs)}.log"
        log.touch()
        env = {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix, "SWARM_TOOLS": tools}
        procs.append(tool_runner(env, log, tmp_path / f"runner-{len(procs)}.log"))
        return log

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


async def _agents(store: JobStore, job: str, tools: list[str], task: str, n: int) -> None:
    specs, _ = build_agents(
        job,
        JobOptions(max_tokens=32),
        AgentSpec(max_turns=2),
        [tool_definition(t) for t in tools],
        source="test",
    )
    await enqueue_agents(store, specs, agent_prompts(task, [{"n": i} for i in range(n)]))


async def _results(store: JobStore, job: str, n: int) -> list[AgentResult]:
    raws = await store.outcomes(job, 0, n)
    return [msgspec.msgpack.decode(r, type=AgentResult) for r in raws if r is not None]


async def _runs(log: Path) -> list[str]:
    return (await asyncio.to_thread(log.read_text)).split()


async def _served(store: JobStore, tools: list[str]) -> None:
    """Wait until a live runner serves each of ``tools`` (they are other processes)."""
    async with asyncio.timeout(30):
        while not all((await store.tool_runners(tools)).values()):  # noqa: ASYNC110 - other processes, in Redis
            await asyncio.sleep(0.05)


async def test_a_call_is_taken_only_by_a_runner_that_allows_its_tool(
    runners: Callable[[str], Path],
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """Seen: runner A allowing fetch, runner B slow_add, one agent job offering each: about
    half the agents failed "not among this runner's SWARM_TOOLS" (one shared queue)."""
    fetch_log, add_log = runners("tests.agent_tools:fetch"), runners("tests.agent_tools:slow_add")
    n = 20
    await _agents(store, "jf", ["fetch"], 'Read {n}. CALL fetch({{"url": "doc{n}"}})', n)
    await _agents(store, "js", ["slow_add"], 'Add {n}. CALL slow_add({{"a": {n}, "b": 1}})', n)
    await _served(store, ["fetch", "slow_add"])
    async with sim_fleet(2, tool_parser="hermes") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    for job in ("jf", "js"):
        results = await _results(store, job, n)
        assert [r.index for r in results] == list(range(n))
        assert [(r.failure, r.error) for r in results if not r.ok] == []
        assert {(r.turns, r.tool_calls) for r in results} == {(2, 1)}
    assert await _runs(fetch_log) == ["fetch"] * n
    assert await _runs(add_log) == ["slow_add"] * n


async def test_a_tool_the_job_did_not_offer_is_never_run_and_the_model_is_told(
    runners: Callable[[str], Path],
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """Seen: a job offering one tool got answers calling another that the runner allows (for
    another job's sake), and that tool ran: a prompt injection could fire anyone's tool."""
    log = runners("tests.agent_tools:*")  # boom and fetch both allowed on the runner
    n = 8
    await _agents(store, "ag", ["fetch"], 'Look {n}. CALL boom({{"record": "r{n}"}})', n)
    await _served(store, ["fetch", "boom"])
    async with sim_fleet(
        1, faults=[FaultConfig(calls_unoffered=True)], tool_parser="hermes"
    ) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
        received = list(fleet.endpoints[0].received)
    results = await _results(store, "ag", n)
    assert [(r.index, r.ok, r.turns, r.tool_calls) for r in results] == [
        (i, True, 2, 1) for i in range(n)
    ]
    assert await _runs(log) == []  # boom never ran
    # Each agent's second turn carried the refusal as the tool's answer, naming what it has.
    told = [m["content"] for body in received for m in body["messages"] if m["role"] == "tool"]
    assert told == ["error: tool 'boom' was not offered to this job (its tools: 'fetch')"] * n


async def _agents_calling_boom(
    runners: Callable[[str], Path],
    store: JobStore,
    cli_env: dict[str, str],
    tmp_path: Path,
    job: str,
) -> subprocess.CompletedProcess[str]:
    """A runner of ``fetch`` alone, and ``job``: 4 agents each calling ``boom``, which no
    runner serves; swarm-enqueue's run."""
    runners("tests.agent_tools:fetch")
    await _served(store, ["fetch"])
    task = tmp_path / "task.txt"
    task.write_text('Look {n}. CALL boom({{"record": "r{n}"}})')
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(f'{{"n": {i}}}\n' for i in range(4)))
    out = command(
        cli_env, "swarm-enqueue", inputs, "--job", job, "--task", task, "--tools", "boom,fetch"
    )
    assert out.returncode == 0, out.stderr
    return out


async def _parked(store: JobStore, job: str, n: int) -> None:
    """Until ``n`` agents of ``job`` wait on their tools (the engine's tasks, in Redis)."""
    async with asyncio.timeout(30):
        while (await store.outcome_counts(job)).parked < n:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_a_tool_no_runner_serves_waits_visibly_then_fails_with_that_reason(
    runners: Callable[[str], Path],
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A call whose tool no live runner allows is not refused by a runner: it waits in its
    tool's queue, swarm-enqueue warns at once, swarm-status names the tool, and the agent
    fails only once SWARM_TOOL_WAIT_S has passed, saying why."""
    out = await _agents_calling_boom(runners, store, cli_env, tmp_path, "nb")
    assert "warning: no tool runner serves 'boom' now" in out.stderr
    assert "'fetch'" not in out.stderr
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        engine = asyncio.create_task(run_engine(make_settings(tool_wait_s=3.0), store, fleet.urls))
        await _parked(store, "nb", 4)
        status = await asyncio.to_thread(command, cli_env, "swarm-status", "nb")
        assert "tool boom: no runner serves it (SWARM_TOOLS of swarm-tools), 4 calls queued" in (
            status.stdout
        )
        assert "tool fetch: 1 runner(s)" in status.stdout
        await engine
    results = await _results(store, "nb", 4)
    assert [(r.index, r.failure) for r in results] == [(i, "tool") for i in range(4)]
    assert {r.error for r in results} == {
        "no tool runner serves 'boom' (waited 3 s): start swarm-tools with SWARM_TOOLS allowing it"
    }


async def test_a_cancelled_agent_job_ends_every_agent_wherever_it_waits(
    runners: Callable[[str], Path],
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Seen: swarm-cancel of an agent job said "0 unanswered prompts recorded as failed",
    its agents still waiting for a tool 22 minutes later, the collector never ending. A
    cancel ends every agent: parked on a tool, thinking, or not begun."""
    await _agents_calling_boom(runners, store, cli_env, tmp_path, "cx")
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        # No runner serves boom, and the agents would wait an hour for one.
        engine = asyncio.create_task(
            run_engine(make_settings(tool_wait_s=3600.0), store, fleet.urls)
        )
        await _parked(store, "cx", 4)
        cancel = await asyncio.to_thread(command, cli_env, "swarm-cancel", "cx")
        assert cancel.returncode == 0, cancel.stderr
        async with asyncio.timeout(30):  # the burst engine ends with the job
            await engine
    results = await _results(store, "cx", 4)
    assert [(r.index, r.failure) for r in results] == [(i, "cancelled") for i in range(4)]
    assert {r.error for r in results} == {CANCELLED}
    counts = await store.outcome_counts("cx")
    assert (counts.active, counts.parked, counts.done) == (0, 0, 4)


def _filtered(i: int) -> bool:
    """Whether keepers:even stops input ``i`` (its step 0 answer's digest is odd)."""
    return zlib.crc32(completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0].encode()) % 2 == 1


def test_a_filter_only_some_workers_allow_stops_no_input_for_it(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """Seen: two workers, only one allowing the --keep-fn: in one run all 2,000 inputs were
    stopped "not allowed", in the next none. Now a worker that cannot run the filter leaves
    the step to one that can, and while none can the step waits, visibly."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "keepers.py").write_text(
        "import zlib\n\n\ndef even(answer):\n    return zlib.crc32(answer.encode()) % 2 == 0\n"
    )
    fleet = fleet_factory(2)
    fleet.env["PYTHONPATH"] = str(code)
    n = 2000
    (fleet.tmp / "check.txt").write_text("Check: {answer}")
    enq = fleet.enqueue(
        "p", n, set(), "--then", str(fleet.tmp / "check.txt"), "--max-tokens", "6",
        "--keep-fn", "keepers:even",
    )  # fmt: skip
    assert enq.wait(60) == 0
    # Only a worker that does not allow the filter: step 0 is answered, nothing moves on.
    fleet.worker("plain", [0], burst=False)
    assert wait_count("step 0 answered", lambda: fleet.done("p"), n) == n
    wait_until(
        "the step shown waiting for a worker with the filter",
        lambda: (
            "waiting: p: no live worker has keep function keepers:even "
            "(SWARM_REDUCE_FUNCTIONS)" in command(fleet.env, "swarm-status", "p").stdout
        ),
    )
    assert fleet.done("p:s1") == 0
    # A worker that allows it joins: every input goes on or is stopped by the filter itself.
    fleet.worker("allows", [1], SWARM_REDUCE_FUNCTIONS="keepers:even")
    out = fleet.tmp / "p.jsonl"
    done = collect(fleet.env, "p", out)
    # The filter stopped some, which is what it is for: no failure (exit 0), counted apart.
    assert done.returncode == 0, done.stderr
    kept_out = sum(_filtered(i) for i in range(n))
    assert f"0 failed, {kept_out} kept out by a filter)" in done.stderr
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    stopped = [x["index"] for x in lines if x.get("stopped_at") is not None]
    assert stopped == [i for i in range(n) if _filtered(i)]
    assert {x["error"] for x in lines if x["index"] in set(stopped)} == {
        "not sent to step 1: keepers:even refused the answer"
    }
    assert all(len(x["steps"]) == 2 for x in lines if x.get("stopped_at") is None)
    assert "left to a worker that has keep function keepers:even" in fleet.logs[0].read_text()


def test_a_measure_is_left_by_a_worker_without_numpy_to_one_with_it(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A worker on which numpy does not import takes no batch of an uncertainty measure's
    step (before: it took them, and failed their prompts for good)."""
    hidden = tmp_path / "no-numpy"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\n\nsys.modules['numpy'] = None\n")
    fleet = fleet_factory(3, "--model", "writer,embedder,embedder")
    n = 200
    enq = fleet.enqueue(
        "u", n, set(), "--model", "writer", "--samples", "4", "--temperature", "0.7",
        "--per-prompt", "semantic-entropy", "--per-prompt-model", "embedder",
    )  # fmt: skip
    assert enq.wait(60) == 0
    lacking = fleet.worker("lacking", [1], env={"PYTHONPATH": str(hidden)})
    fleet.worker("full", [0, 2])
    out = fleet.tmp / "u.jsonl"
    done = collect(fleet.env, "u", out)
    assert done.returncode == 0, done.stderr
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    assert all(x["error"] is None and "entropy" in x["steps"][1]["value"] for x in lines)
    assert fleet.answered(1) == 0  # the worker without numpy sent its endpoint nothing
    assert lacking.wait(timeout=60) == 0
    assert "left to a worker that has numpy" in fleet.logs[0].read_text()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def test_vectors_of_another_dimension_are_never_served_as_right(
    fleet_factory: FleetFactory,
) -> None:
    """Seen: two endpoints of one model answering 8 and 16 dimensions: a job's vectors of both
    lengths, collect exit 0. Now the first answer fixes the job's dimension; a vector of
    another is the endpoint's failure, retried on an endpoint that answers it rightly."""
    fleet = fleet_factory(2, "--model", "emb,emb")
    fleet.faults(1, embed_dims=8)
    n = 2000
    src = fleet.tmp / "texts.txt"
    src.write_text("".join(f"text number {i} about topic {i % 7}\n" for i in range(n)))
    enq = command(fleet.env, "swarm-enqueue", src, "--job", "e", "--embed", "--model", "emb")
    assert enq.returncode == 0, enq.stderr
    fleet.worker("w", [0, 1])
    out = fleet.tmp / "e.jsonl"
    done = collect(fleet.env, "e", out)
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    dims = {len(x["embedding"]) for x in lines if x.get("embedding")}
    assert len(dims) == 1, dims  # one dimension, whichever answered first
    failed = [x for x in lines if x["error"]]
    if dims == {8}:  # the odd endpoint answered first: the other's vectors are the odd ones
        assert all(len(x["embedding"]) == 8 for x in lines if not x["error"])
    else:
        assert dims == {len(embedding_for("x"))}
        assert done.returncode == 0, done.stderr
        assert failed == []
    for x in failed:  # a failure of its own kind, naming the endpoint that sent it
        assert x["error_kind"] == "malformed"
        assert "malformed answer: vectors of" in x["error"] and fleet.url(0)[7:] in str(x)


@pytest.mark.parametrize("lie", [{"shift_index": 1}, {"drop_choices": 1}])
def test_a_lone_endpoint_that_answers_wrongly_is_not_hammered_and_its_job_ends(
    fleet_factory: FleetFactory, lie: dict[str, int]
) -> None:
    """Seen: the only endpoint of its model shifting its choices' indexes: ~120 requests/s for
    as long as it ran, the job never ended and showed no reason. Now its answers count against
    it, its circuit opens and stays open while its probes (which check an answer's shape) fail,
    and its job's prompts end failed with its error; the other model's job is untouched."""
    fleet = fleet_factory(2, "--model", "good,liar")
    fleet.faults(1, **lie)
    n = 300
    assert fleet.enqueue("lies", n, set(), "--model", "liar").wait(60) == 0
    assert fleet.enqueue("fine", n, set(), "--model", "good").wait(60) == 0
    worker = fleet.worker("w", [0, 1])
    out = fleet.tmp / "lies.jsonl"
    lies = collect(fleet.env, "lies", out)
    assert lies.returncode == 1, lies.stderr
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    assert {x["error_kind"] for x in lines} <= {"malformed", "no_choice"}
    assert all(x["error"] and x["text"] is None for x in lines)
    assert all("no other endpoint serves the job's model" in x["error"] for x in lines)
    assert fleet.requests(1) < 100
    fine = collect(fleet.env, "fine", fleet.tmp / "fine.jsonl")
    assert fine.returncode == 0, fine.stderr
    assert worker.wait(timeout=60) == 0
    # Said once per interval, not once per batch.
    log = fleet.logs[0].read_text()
    assert log.count("no usable answer") <= 3, log


def test_a_prompt_one_endpoint_leaves_out_is_answered_by_another(
    fleet_factory: FleetFactory,
) -> None:
    """Seen: an endpoint answering one choice fewer than asked, beside a good one: 2-3 of 300
    prompts failed "endpoint returned no choice for it in 6 attempts". Now a prompt one
    endpoint failed to answer is tried elsewhere before it fails."""
    fleet = fleet_factory(2)
    fleet.faults(1, drop_choices=1)
    n = 300
    assert fleet.enqueue("j", n, set()).wait(60) == 0
    fleet.worker("w", [0, 1])
    out = fleet.tmp / "j.jsonl"
    done = collect(fleet.env, "j", out)
    assert done.returncode == 0, done.stderr
    check_output(out, n, set())


def test_a_pipeline_whose_step_no_endpoint_serves_waits_visibly_and_cancels_whole(
    fleet_factory: FleetFactory,
) -> None:
    """Seen: a step whose model no endpoint serves: no warning at enqueue, swarm-status said
    "finished", swarm-collect --wait waited for ever, swarm-cancel did not reach the step.
    Now the job speaks for all of its steps."""
    fleet = fleet_factory(1, "--model", "good")
    fleet.worker("w", [0], burst=False)
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        wait_until(
            "the worker's endpoint in the fleet registry",
            lambda: b"good" in b"".join(client.hvals(Keys(fleet.prefix).fleet)),
        )
    finally:
        client.close()
    (fleet.tmp / "step.txt").write_text("Check: {answer}")
    enq = fleet.enqueue(
        "p", 40, set(), "--model", "good",
        "--then", str(fleet.tmp / "step.txt"), "--model", "nobody", "--max-tokens", "6",
    )  # fmt: skip
    assert enq.wait(60) == 0
    said = (fleet.tmp / "enqueue-p.log").read_text()
    assert "warning: step 1 p:s1: no live endpoint serves model 'nobody'" in said, said
    assert wait_count("step 0 answered", lambda: fleet.done("p"), 40) == 40
    wait_until(
        "the pipeline shown waiting for its step's model",
        lambda: "job p: waiting" in command(fleet.env, "swarm-status", "p").stdout,
    )
    status = command(fleet.env, "swarm-status", "p").stdout
    assert "  waiting    step 1 p:s1: no live endpoint serves model 'nobody'" in status
    assert "step 1 p:s1: 0 done, 0 failed of" in status and "(waiting: no live" in status
    jobs = command(fleet.env, "swarm-jobs").stdout
    assert any(line.split()[:2] == ["p", "waiting"] for line in jobs.splitlines()), jobs
    # Not finished: --delete-finished leaves it, a plain --delete refuses it.
    assert "p: deleted" not in command(fleet.env, "swarm-jobs", "--delete-finished").stdout
    refused = command(fleet.env, "swarm-jobs", "--delete", "p")
    assert refused.returncode != 0 and "still running" in refused.stderr
    # Cancelled whole: the step too, and the collector comes to its end.
    cancel = command(fleet.env, "swarm-cancel", "p")
    assert cancel.returncode == 0, cancel.stderr
    status = command(fleet.env, "swarm-status", "p").stdout
    assert "job p: cancelled" in status and "(cancelled)" in status, status
    out = fleet.tmp / "p.jsonl"
    collected = collect(fleet.env, "p", out)
    assert collected.returncode == 1, collected.stderr
    assert len(_lines(out)) == 40


def test_the_shared_case_on_a_fleet_that_is_not_uniform(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """Issue 30's shared case: one fleet, two tool runners with different tools, two workers
    with different allow-lists, an endpoint of the embedding model answering another
    dimension, a lone endpoint of a third model shifting its indexes; a pipeline with a
    keep-fn, an agent job per runner (one whose model calls a tool its job did not offer),
    an embeddings job, a plain job. Every answer right or failed with its reason, no tool run
    that its job did not offer, no input stopped by an allow-list, the bad endpoint's job
    ended within 30 s with fewer than 100 requests sent to it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "keepers.py").write_text(
        "import zlib\n\n\ndef even(answer):\n    return zlib.crc32(answer.encode()) % 2 == 0\n"
    )
    fleet = fleet_factory(5, "--model", "swarm-sim,swarm-sim,emb,emb,liar", *TOOL_PARSER_ARGS)
    fleet.env["PYTHONPATH"] = str(code)
    env = fleet.env
    for port in (0, 1):
        fleet.faults(port, calls_unoffered=True)
    fleet.faults(3, embed_dims=8)
    fleet.faults(4, shift_index=1)
    tmp = fleet.tmp
    n_agents, n_pipe, n_plain, n_emb, n_lies = 40, 400, 1000, 1000, 300
    (tmp / "check.txt").write_text("Check: {answer}")
    (tmp / "in.jsonl").write_text("".join(f'{{"n": {i}}}\n' for i in range(n_agents)))
    (tmp / "fetch.txt").write_text(
        'Read {n}. CALL fetch({{"url": "a{n}"}}) then CALL slow_add({{"a": {n}, "b": 2}})'
    )
    (tmp / "add.txt").write_text('Add {n}. CALL slow_add({{"a": {n}, "b": 1}})')
    (tmp / "texts.txt").write_text("".join(f"text {i} on topic {i % 9}\n" for i in range(n_emb)))
    jobs = [
        [
            tmp / "in.jsonl",
            "--job",
            "af",
            "--task",
            tmp / "fetch.txt",
            "--tools",
            "fetch",
            "--model",
            "swarm-sim",
        ],
        [
            tmp / "in.jsonl",
            "--job",
            "as",
            "--task",
            tmp / "add.txt",
            "--tools",
            "slow_add",
            "--model",
            "swarm-sim",
        ],
        [tmp / "texts.txt", "--job", "e", "--embed", "--model", "emb"],
    ]
    for args in jobs:
        enq = command(env, "swarm-enqueue", *args)
        assert enq.returncode == 0, enq.stderr
    pipe = fleet.enqueue(
        "p", n_pipe, set(), "--model", "swarm-sim", "--then", str(tmp / "check.txt"),
        "--max-tokens", "6", "--keep-fn", "keepers:even",
    )  # fmt: skip
    assert pipe.wait(60) == 0
    assert fleet.enqueue("j", n_plain, set(), "--model", "swarm-sim").wait(60) == 0
    assert fleet.enqueue("lies", n_lies, set(), "--model", "liar").wait(60) == 0
    fetch_log, add_log = tmp / "fetch.log", tmp / "add.log"
    runners = []
    for tools, log in (("fetch", fetch_log), ("slow_add", add_log)):
        log.touch()
        runner_env = {k: v for k, v in env.items() if k.startswith("SWARM_")}
        runner_env["SWARM_TOOLS"] = f"tests.agent_tools:{tools}"
        runners.append(tool_runner(runner_env, log, tmp / f"runner-{tools}.log"))
    started = time.monotonic()
    fleet.worker("allows", [0, 2, 4], SWARM_REDUCE_FUNCTIONS="keepers:even")
    fleet.worker("plain", [1, 3])
    try:
        lies = collect(env, "lies", tmp / "lies.jsonl")
        lies_s = time.monotonic() - started
        outs = {job: collect(env, job, tmp / f"{job}.jsonl") for job in ("af", "as", "e", "p", "j")}
    finally:
        for r in runners:
            r.terminate()
            r.wait(timeout=30)
    # The lone endpoint that lies: its job ended, each prompt failed with its error, without
    # waiting out retries (the bound on its requests below); the time only rules out a hang
    # (35 s was seen with the machine's two cores under four stress processes).
    assert lies.returncode == 1 and lies_s < 90, (lies_s, lies.stderr)
    lines = _lines(tmp / "lies.jsonl")
    assert len(lines) == n_lies and {x["error_kind"] for x in lines} == {"malformed"}
    assert fleet.requests(4) < 100
    # The agents: every one answered; no tool run that its job did not offer.
    for job in ("af", "as"):
        assert outs[job].returncode == 0, outs[job].stderr
        agents = _lines(tmp / f"{job}.jsonl")
        assert [x["index"] for x in agents] == list(range(n_agents))
        assert all("failure" not in x for x in agents)
    assert {x["tool_calls"] for x in _lines(tmp / "af.jsonl")} == {2}
    assert sorted(fetch_log.read_text().split()) == ["fetch"] * n_agents
    assert sorted(add_log.read_text().split()) == ["slow_add"] * n_agents  # as's only
    # The embeddings: one dimension; a vector of the other never served as right.
    vectors = _lines(tmp / "e.jsonl")
    assert [x["index"] for x in vectors] == list(range(n_emb))
    assert len({len(x["embedding"]) for x in vectors if x.get("embedding")}) == 1
    assert {x["error_kind"] for x in vectors if x["error"]} <= {"malformed"}
    # The pipeline: no input stopped by an allow-list, only by the filter itself.
    steps = _lines(tmp / "p.jsonl")
    assert [x["index"] for x in steps] == list(range(n_pipe))
    stopped = [x for x in steps if x.get("stopped_at") is not None]
    assert {x["error"] for x in stopped} == {"not sent to step 1: keepers:even refused the answer"}
    assert [x["index"] for x in stopped] == [i for i in range(n_pipe) if _filtered(i)]
    # The plain job: every answer right.
    assert outs["j"].returncode == 0, outs["j"].stderr
    check_output(tmp / "j.jsonl", n_plain, set())
