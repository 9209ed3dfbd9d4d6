"""Agents on the fleet: each input a conversation of turns, each turn one unit of queue work.

An agent job ``a`` is its agents' first turns; its later turns are jobs of their own,
``a:s1``, ``a:s2``... (one per turn, up to ``max_turns``), each one priority above the turn
before, so an agent near its end goes before a fresh one. A turn's answer, the moment it is
committed, is taken by the agent pump (every worker runs one; one at a time per agent job, by
its lock):

* tool calls: asked of the tool runners (:mod:`flows.toolcalls`), and the agent parked until
  every answer is in. A parked agent is in no queue and holds no slot of any endpoint; once
  its answers are in, its conversation, the calls and their answers added, is queued as its
  next turn;
* an answer: checked against the output schema; a mismatch, or an answer cut off at
  ``max_tokens``, gets a repair turn (the errors sent back) while repairs are left; then the
  agent finishes, once, with its output as data;
* a failure, a tool no runner allows, or the last turn asking for tools: the agent finishes
  with that failure and its reason; the other agents go on.
"""

from __future__ import annotations

import json
import logging
import math
import re
import string
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import msgspec

from common.errors import (
    BadRecordError,
    ConfigError,
    JobConflictError,
    JobGoneError,
    JobNotFoundError,
)
from common.feed import EnqueueReport, enqueue_prompts
from common.jobspec import JobOptions, build_spec
from common.keys import lane_name, step_name, validate_tool_name
from common.models import (
    AgentSpec,
    JobSpec,
    Message,
    PromptItem,
    Result,
    ToolCall,
    decode_item,
    result_or_failure,
)
from common.schema import AnswerValidator
from common.store import JobStore, producer_token
from common.store.steps import Landed, Move
from common.tools import ToolAnswer
from common.vocab import Meta
from flows.pipeline import MAX_STEPS
from flows.toolcalls import ToolCaller

__all__ = [
    "AgentPump",
    "AgentResult",
    "AgentState",
    "agent_prompts",
    "build_agents",
    "enqueue_agents",
    "fill_task",
    "not_offered",
    "offered_tools",
    "task_fields",
    "tool_definition",
]

log = logging.getLogger("swarm.agents")

LOCK_TTL_MS = 10_000
BATCH = 500


def tool_definition(name: str, description: str = "") -> dict[str, Any]:
    """A tool as offered to the model, when only its name is known."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description or f"the {name} tool",
            "parameters": {"type": "object"},
        },
    }


class AgentState(msgspec.Struct):
    """An agent between turns: what it has used so far."""

    turns: int = 0
    repairs: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_runs: int = 0  # the runs behind its tools' answers (a call run twice counts 2)
    tools_cut: int = 0  # its tools' answers cut to SWARM_TOOL_MAX_BYTES


class Waiting(msgspec.Struct, frozen=True):
    """A parked agent: the turn it asked from, its conversation, its calls (key, call; the
    key "" for a tool its job did not offer: never asked of a runner), the lane of the
    endpoint that served that turn (where its next turn is queued), and since when it waits
    (Redis's clock, s)."""

    turn: int
    item: PromptItem
    calls: list[tuple[str, ToolCall]]
    lane: str = ""
    since_s: float = 0.0
    # The answers read so far, by call (None: not yet): kept with the agent, so that an
    # answer expiring from Redis before its last sibling comes in is never asked again.
    answers: list[ToolAnswer | None] = []


def offered_tools(spec: JobSpec) -> list[str]:
    """The names of the tools ``spec``'s job offers its agents."""
    return [t.get("function", {}).get("name", "") for t in spec.tools or ()]


def not_offered(name: str, offered: list[str]) -> ToolAnswer:
    """The answer the model gets for calling a tool its job did not offer: never run."""
    names = ", ".join(repr(n) for n in offered) or "none"
    return ToolAnswer(error=f"tool {name!r} was not offered to this job (its tools: {names})")


# An agent going on to its next turn: its index, the item of the turn before, the
# conversation of the next turn, and the lane to queue it in ("" for any endpoint).
Onward = tuple[int, PromptItem, tuple[Message, ...], str]


def _lane(r: Result | None) -> str:
    """The lane of the endpoint that computed ``r`` (none for an answer from the cache)."""
    return lane_name(r.endpoint) if r is not None and r.endpoint and not r.cached else ""


class AgentResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """An agent's end, as its output line shows it: its ``output`` (the answer, parsed when it
    has an output schema), or ``failure`` (``max_turns``, ``schema``, ``length``, ``tool``,
    ``error``) and why; the turns, tool calls and tokens it used."""

    index: int
    custom_id: str | None = None
    output: Any = None
    text: str | None = None
    failure: str | None = None
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The runs behind its tools' answers: more than its calls when a runner died mid-call and
    # a call ran again (at least once); and how many of those answers were cut to
    # SWARM_TOOL_MAX_BYTES.
    tool_runs: int = 0
    tools_cut: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None


_state_decoder = msgspec.msgpack.Decoder(AgentState)
_waiting_decoder = msgspec.msgpack.Decoder(Waiting)
_encoder = msgspec.msgpack.Encoder()


class AgentPump:
    """Moves every agent job's agents between their turns; :meth:`step` does one round."""

    def __init__(
        self,
        store: JobStore,
        caller: Callable[[], Awaitable[ToolCaller]],
        *,
        refresh_s: float = 2.0,
        token: str = "",
    ) -> None:
        self.store, self._make_caller = store, caller
        self._caller: ToolCaller | None = None
        self.refresh_s = refresh_s
        self.token = f"{token or producer_token()}/agents"
        self.jobs: dict[str, JobSpec] = {}
        # Every job's spec as last read, checked against its generation at each refresh (one
        # round trip for all), so that only a new or re-queued job's spec is read again.
        self._specs: dict[str, JobSpec] = {}
        self._targets: dict[str, JobSpec] = {}
        self._validators: dict[str, AnswerValidator | None] = {}
        self._grouped: set[str] = set()
        self._refreshed_at = -math.inf

    async def refresh(self, *, force: bool = False) -> None:
        """The agent jobs with agents still running."""
        if not force and time.monotonic() - self._refreshed_at < self.refresh_s:
            return
        jobs: dict[str, JobSpec] = {}
        names = [n for n in await self.store.list_jobs() if ":" not in n]
        for name, gen in zip(names, await self.store.generations(names), strict=True):
            spec = self._specs.get(name)
            if spec is None or spec.generation != gen:  # new, or deleted and queued again
                self._forget(name)
                try:
                    spec = self._specs[name] = await self.store.load_spec(name)
                except (JobNotFoundError, BadRecordError):
                    continue
            if spec.agent is not None and not await self._complete(spec):
                jobs[name] = spec
        self.jobs = jobs
        self._refreshed_at = time.monotonic()

    async def _complete(self, spec: JobSpec) -> bool:
        """Whether no agent of ``spec``'s job moves any more: all finished, or the job
        cancelled (swarm-cancel stops its turns whole)."""
        status = await self.store.status(spec.job, rate=False)
        if status.cancelled:
            return True
        if status.total is None:
            return False
        return await self.store.agents_finished(spec.job) >= status.total

    async def has_work(self) -> bool:
        await self.refresh(force=True)
        return bool(self.jobs)

    @property
    def caller(self) -> ToolCaller:
        assert self._caller is not None
        return self._caller

    async def step(self) -> bool:
        """One round over every agent job: True when an agent moved."""
        await self.refresh()
        if self.jobs and self._caller is None:  # a connection to the tool queue, once needed
            self._caller = await self._make_caller()
        did = False
        for spec in list(self.jobs.values()):
            try:
                did |= await self._step(spec)
            except JobConflictError as exc:  # another pump moved some: read again
                log.debug("agents of %s: %s", spec.job, exc)
                did = True
            except (JobGoneError, JobNotFoundError):
                self.jobs.pop(spec.job, None)
                self._forget(spec.job)
        return did

    def _forget(self, job: str) -> None:
        """Forget what was read of ``job`` and its turns: deleted, or queued again under its
        name (a turn's spec kept from before would refuse the new job's moves, after its
        agents' states were written: each such turn counted twice)."""
        self._specs.pop(job, None)
        for name in [t for t in self._targets if t.partition(":")[0] == job]:
            del self._targets[name]

    async def _step(self, spec: JobSpec) -> bool:
        agent = spec.agent
        assert agent is not None
        lock = step_name(spec.job, agent.max_turns)  # no job: the name of this pump's lock
        if await self.store.acquire_producer_lock(lock, self.token, LOCK_TTL_MS) is not None:
            return False
        did = False
        for k in range(agent.max_turns):
            turn = step_name(spec.job, k)
            if k and await self.store.acquire_producer_lock(turn, self.token, LOCK_TTL_MS):
                continue  # (held by another: cannot be, with the pump's lock; be safe)
            grouped = f"{turn}/{spec.generation}"  # a job queued again: a new stream
            if grouped not in self._grouped:
                await self.store.ensure_pump_group(turn)
                self._grouped.add(grouped)
            landed = await self.store.take_landed(turn, self.token, BATCH)
            if landed:
                await self._answers(spec, k, landed)
                did = True
        did |= await self._unpark(spec)
        await self._seal(spec)
        return did

    def _validator(self, spec: JobSpec) -> AnswerValidator | None:
        key = f"{spec.job}/{spec.generation}"
        if key not in self._validators:
            schema = spec.agent.output_schema if spec.agent else None
            self._validators[key] = AnswerValidator(schema) if schema else None
        return self._validators[key]

    async def _target(self, name: str) -> JobSpec:
        if name not in self._targets:
            self._targets[name] = await self.store.load_spec(name)
        return self._targets[name]

    async def _answers(self, spec: JobSpec, k: int, landed: list[Landed]) -> None:
        """A turn's answers: each agent parked, finished or sent on to its next turn."""
        agent = spec.agent
        assert agent is not None
        turn = step_name(spec.job, k)
        raws = await self.store.results_at(turn, [x.index for x in landed])
        items = [decode_item(x.payload or b"") for x in landed]
        origins = [it.origin if it.origin is not None else it.index for it in items]
        states = await self.store.agent_states(spec.job, origins)
        offered = offered_tools(spec)
        now = await self.store.server_time()
        finished: dict[int, bytes] = {}
        parked: dict[int, bytes] = {}
        onward: list[Onward] = []
        new_states: dict[int, bytes] = {}
        for x, item, origin, raw, blob in zip(landed, items, origins, raws, states, strict=True):
            state = _state_decoder.decode(blob) if blob else AgentState()
            r = result_or_failure(x.index, raw) if raw is not None else None
            state.turns += 1
            if r is not None and r.usage is not None:
                state.prompt_tokens += r.usage.prompt_tokens
                state.completion_tokens += r.usage.completion_tokens
            end, repair = self._outcome(spec, k, item, origin, state, r)
            if end is not None:
                finished[origin] = _encoder.encode(end)
            elif r is not None and r.tool_calls:
                # Only a tool the job offered is ever asked of a runner: a model may name any
                # tool (a prompt injection another team's), and a runner allows more than this
                # job was given.
                calls = [
                    (await self.caller.ask(c.name, c.arguments) if c.name in offered else "", c)
                    for c in r.tool_calls
                ]
                state.tool_calls += len(calls)
                parked[origin] = _encoder.encode(Waiting(k, item, calls, _lane(r), now))
            elif repair is not None:
                state.repairs += 1
                onward.append((origin, item, repair, _lane(r)))
            new_states[origin] = _encoder.encode(state)
        await self.store.record_agents(
            spec.job, gen=spec.generation, states=new_states, waits=parked, results=finished
        )
        await self._onward(spec, k, onward, [x.entry_id for x in landed], repairs=True)

    def _outcome(
        self,
        spec: JobSpec,
        k: int,
        item: PromptItem,
        origin: int,
        state: AgentState,
        r: Result | None,
    ) -> tuple[AgentResult | None, tuple[Message, ...] | None]:
        """How a turn's answer ends the agent (its result), or the conversation of its repair
        turn; (None, None): it goes on to its tools."""
        agent = spec.agent
        assert agent is not None
        last = k + 1 >= agent.max_turns

        def end(failure: str | None, error: str | None = None, **kw: Any) -> AgentResult:
            return AgentResult(
                index=origin,
                custom_id=item.custom_id,
                failure=failure,
                error=error,
                turns=state.turns,
                tool_calls=state.tool_calls,
                prompt_tokens=state.prompt_tokens,
                completion_tokens=state.completion_tokens,
                tool_runs=state.tool_runs,
                tools_cut=state.tools_cut,
                **kw,
            )

        if r is None or not r.ok:
            return end("error", r.error if r is not None else "its answer is gone from Redis"), None
        if r.tool_calls:
            if last:
                return end("max_turns", f"asked for tools at its last turn ({k + 1})"), None
            return None, None
        text = r.text or ""
        validator = self._validator(spec)
        why: str | None
        if r.finish_reason == "length":  # cut off at max_tokens: no answer, whatever it reads
            failure = "length"
            why = f"was cut off at max_tokens ({spec.params.max_tokens} tokens)"
            again = "Answer again, in full and shorter."
        else:
            failure = "schema"
            why = validator.error(text) if validator is not None else None
            again = "Answer again, as JSON of that schema."
        if why is None:
            output = json.loads(text) if validator is not None else text
            return end(None, output=output, text=text), None
        if state.repairs < agent.max_repairs and not last:
            conversation = (
                *(item.messages or ()),
                Message("assistant", text),
                Message("user", f"Your answer {why}. {again}"),
            )
            return None, conversation
        return end(failure, f"the answer {why}", text=text), None

    async def _onward(
        self,
        spec: JobSpec,
        k: int,
        onward: list[Onward],
        acked: list[bytes],
        *,
        repairs: bool = False,
    ) -> None:
        """Queue ``onward`` agents' next turns, acknowledging ``acked`` of turn ``k``.
        ``repairs``: turns asked to answer again, sent as a last turn is (the output schema
        guiding the answer) with no tool to call, whatever turn they are."""
        source, target = step_name(spec.job, k), step_name(spec.job, k + 1)
        if not onward:
            if acked:
                await self._ack_only(spec, k, acked)
            return
        goal = await self._target(target)
        done = await self.store.moved(target, [o for o, _, _, _ in onward])
        first = await self.store.enqueued_count(target)
        own: dict[str, Any] = {}
        if repairs and spec.agent is not None:
            last = await self._target(step_name(spec.job, spec.agent.max_turns - 1))
            own = {"params": last.params, "tool_choice": "none" if spec.tools else None}
        moves, queued = [], 0
        for origin, item, conversation, lane in onward:
            if origin in done:
                continue
            moved = PromptItem.of(first + queued, conversation, item.custom_id)
            moved = msgspec.structs.replace(moved, origin=origin, **own)
            moves.append(Move(origin, moved, lane=lane))
            queued += 1
        await self.store.move_on(source, target, first, moves, acked, gen=goal.generation)

    async def _ack_only(self, spec: JobSpec, k: int, acked: list[bytes]) -> None:
        agent = spec.agent
        assert agent is not None
        source = step_name(spec.job, k)
        target = step_name(spec.job, min(k + 1, agent.max_turns - 1))
        if target == source:  # the last turn: nothing follows; acknowledge alone
            await self.store.ack_landed(source, acked)
            return
        goal = await self._target(target)
        first = await self.store.enqueued_count(target)
        await self.store.move_on(source, target, first, [], acked, gen=goal.generation)

    async def _unpark(self, spec: JobSpec) -> bool:
        """Agents whose tool answers are all in: their next turns queued."""
        parked = await self.store.parked(spec.job)
        if not parked:
            return False
        ready: dict[int, list[Onward]] = {}
        failed: dict[int, bytes] = {}
        offered = offered_tools(spec)
        now = await self.store.server_time()
        kept: dict[int, bytes] = {}
        tallies: dict[int, tuple[int, int]] = {}  # agent -> (tool runs, answers cut)
        for origin, blob in parked.items():
            w = _waiting_decoder.decode(blob)
            answers = await self._answers_of(w, offered)
            if any(a is None for a in answers):
                why = await self._unserved(w, answers, now)
                if why is not None:
                    failed[origin] = _encoder.encode(
                        AgentResult(
                            index=origin, custom_id=w.item.custom_id, failure="tool", error=why
                        )
                    )
                elif answers != (w.answers or [None] * len(w.calls)):  # some new: keep them
                    kept[origin] = _encoder.encode(msgspec.structs.replace(w, answers=answers))
                continue
            refused = next((a for a in answers if a is not None and a.refused), None)
            if refused is not None:
                failed[origin] = _encoder.encode(
                    AgentResult(
                        index=origin,
                        custom_id=w.item.custom_id,
                        failure="tool",
                        error=refused.error,
                    )
                )
                continue
            conversation = (
                *(w.item.messages or ()),
                Message("assistant", "", tool_calls=tuple(c for _, c in w.calls)),
                *(
                    Message("tool", a.for_model() if a is not None else "", tool_call_id=c.id)
                    for (_, c), a in zip(w.calls, answers, strict=True)
                ),
            )
            ready.setdefault(w.turn, []).append((origin, w.item, conversation, w.lane))
            tallies[origin] = (
                sum(a.runs for a in answers if a is not None),
                sum(1 for a in answers if a is not None and a.truncated_bytes),
            )
        await self.store.record_agents(spec.job, gen=spec.generation, waits=kept, results=failed)
        for k, onward in ready.items():
            await self._onward(spec, k, onward, [])
            unparked = [o for o, _, _, _ in onward]
            states = await self._tallied(spec, {o: tallies[o] for o in unparked})
            await self.store.record_agents(
                spec.job, gen=spec.generation, states=states, unparked=unparked
            )
        return bool(ready or failed)

    async def _tallied(
        self, spec: JobSpec, tallies: dict[int, tuple[int, int]]
    ) -> dict[int, bytes]:
        """The states of agents going on from their tools, with the runs behind their answers
        and the answers cut added: what their lines say in the end."""
        if not any(runs or cut for runs, cut in tallies.values()):
            return {}
        agents = list(tallies)
        out = {}
        for origin, blob in zip(
            agents, await self.store.agent_states(spec.job, agents), strict=True
        ):
            state = _state_decoder.decode(blob) if blob else AgentState()
            runs, cut = tallies[origin]
            state.tool_runs += runs
            state.tools_cut += cut
            out[origin] = _encoder.encode(state)
        return out

    async def _answers_of(self, w: Waiting, offered: list[str]) -> list[ToolAnswer | None]:
        """The answers of a parked agent's calls as far as they are in: those it kept, those
        Redis has now (a call neither answered nor in hand asked again), and for a tool its
        job did not offer, the refusal."""
        have = w.answers or [None] * len(w.calls)
        ask = [
            (i, (key, c.name, c.arguments))
            for i, ((key, c), a) in enumerate(zip(w.calls, have, strict=True))
            if key and a is None
        ]
        got = dict(
            zip([i for i, _ in ask], await self.caller.answers([c for _, c in ask]), strict=True)
        )
        return [
            a if a is not None else got.get(i) if key else not_offered(c.name, offered)
            for i, ((key, c), a) in enumerate(zip(w.calls, have, strict=True))
        ]

    async def _unserved(
        self, w: Waiting, answers: list[ToolAnswer | None], now: float
    ) -> str | None:
        """Why a parked agent ends, when a call it waits on has waited ``tool_wait_s`` and no
        live runner serves its tool; None while it may still be answered."""
        wait_s = self.caller.settings.tool_wait_s
        if not w.since_s or now - w.since_s < wait_s:
            return None
        tools = sorted({c.name for (_, c), a in zip(w.calls, answers, strict=True) if a is None})
        runners = await self.store.tool_runners(tools)
        unserved = [t for t in tools if not runners.get(t)]
        if not unserved:
            return None
        return (
            f"no tool runner serves {', '.join(map(repr, unserved))} (waited {wait_s:g} s): "
            "start swarm-tools with SWARM_TOOLS allowing it"
        )

    async def _seal(self, spec: JobSpec) -> None:
        """Seal each later turn once the turn before has finished, every answer of it has been
        taken and no agent it parked waits any more."""
        agent = spec.agent
        assert agent is not None
        waiting_turns = {
            _waiting_decoder.decode(b).turn for b in (await self.store.parked(spec.job)).values()
        }
        for k in range(1, agent.max_turns):
            turn = step_name(spec.job, k)
            meta = await self.store.meta(turn)
            if Meta.TOTAL in meta:
                continue
            before = await self.store.status(step_name(spec.job, k - 1), rate=False)
            if not (before.finished or before.cancelled):
                return
            if (
                await self.store.landed_backlog(step_name(spec.job, k - 1))
                or (k - 1) in waiting_turns
            ):
                return
            goal = await self._target(turn)
            await self.store.seal(turn, await self.store.enqueued_count(turn), gen=goal.generation)
            await self.store.release_producer_lock(turn, self.token)


class _Fields(dict[str, Any]):
    """An input object as the task template sees it: a missing field is an error naming it."""

    def __missing__(self, key: str) -> Any:
        raise KeyError(key)


def task_fields(task: str) -> set[str]:
    """The input fields ``task`` names (``{n}``, ``{paper.title}``: ``paper``); a task that
    cannot be parsed names none here (filling it says why)."""
    try:
        parsed = list(string.Formatter().parse(task))
    except ValueError:
        return set()
    names = {re.split(r"[.\[]", name, maxsplit=1)[0] for _, name, _, _ in parsed if name}
    return {n for n in names if n and not n.isdigit()}


def fill_task(task: str, fields: dict[str, Any], index: int) -> str:
    """``task`` with ``{field}`` filled from one input object; ConfigError naming the field
    an input lacks."""
    try:
        return task.format_map(_Fields(fields))
    except KeyError as exc:
        raise ConfigError(f"input {index} has no field {exc.args[0]!r} the task names") from None
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"the task template cannot be filled: {exc}") from None


def build_agents(
    job: str,
    options: JobOptions,
    agent: AgentSpec,
    tools: list[dict[str, Any]],
    *,
    source: str,
) -> tuple[list[JobSpec], list[str]]:
    """The specs of agent job ``job`` and of its later turns (``job:s1``...): chat with the
    tools offered, each turn one priority above the one before (near-done first)."""
    if not 1 <= agent.max_turns < MAX_STEPS:
        raise ConfigError(f"max_turns must be 1..{MAX_STEPS - 1}, got {agent.max_turns}")
    if agent.max_repairs < 0:
        raise ConfigError(f"max_repairs must be >= 0, got {agent.max_repairs}")
    if agent.output_schema is not None:
        AnswerValidator(agent.output_schema)  # refuses what it cannot check, up front
    names = [t.get("function", {}).get("name") for t in tools]
    if len(set(names)) != len(names) or not all(names):
        raise ConfigError(f"tools must each have a distinct name, got {names}")
    for name in names:
        validate_tool_name(name)
    choice = _tool_choice(agent.tool_choice, names)
    chat = msgspec.structs.replace(options, chat=True)
    spec, warnings = build_spec(job, chat, source=source)
    spec = msgspec.structs.replace(spec, tools=tools or None, agent=agent)
    guided = spec
    if agent.output_schema is not None and options.response_format is None:
        # Guided decoding on the server (vLLM's json_schema) keeps repairs rare; but it holds
        # the whole answer to the schema, so a turn sent it can call no tool: only the last
        # turn gets it (a tool call there ends the agent anyway), every turn if no tools.
        guided = msgspec.structs.replace(
            spec,
            params=msgspec.structs.replace(
                spec.params,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": agent.output_schema},
                },
            ),
        )
    last = agent.max_turns - 1
    # A call required (or one tool's) at every turn but the last, which is asked for the
    # answer: "none" there, or no agent could ever end with one.
    forced = choice not in (None, "none")
    specs = [
        msgspec.structs.replace(
            guided if k == last or not tools else spec,
            job=step_name(job, k),
            priority=spec.priority + k,
            tool_choice="none" if forced and k == last else choice,
        )
        for k in range(agent.max_turns)
    ]
    return specs, warnings


TOOL_CHOICES = ("auto", "required", "none")


def _tool_choice(choice: str | None, names: list[str]) -> str | dict[str, Any] | None:
    """``tool_choice`` as sent for an agent's ``choice`` (None or "auto": not sent, the
    server's default), checked against the tools offered (``names``)."""
    if choice is None or choice == "auto":
        return None
    if not names:
        raise ConfigError(f"tool_choice {choice!r} needs tools offered (--tools)")
    if choice in TOOL_CHOICES:
        return choice
    if choice not in names:
        raise ConfigError(
            f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a tool offered "
            f"({', '.join(names)}), got {choice!r}"
        )
    return {"type": "function", "function": {"name": choice}}


def agent_prompts(
    task: str, inputs: Iterable[dict[str, Any]], system: str | None = None
) -> Iterator[tuple[tuple[Message, ...], str | None]]:
    """Each input's first turn: the system prompt and the task filled from the input (an
    input's ``custom_id``, if it has one, names its line)."""
    for i, fields in enumerate(inputs):
        if not isinstance(fields, dict):
            raise ConfigError(f"input {i} is a {type(fields).__name__}: give JSON objects")
        user = Message("user", fill_task(task, fields, i))
        custom = fields.get("custom_id")
        yield (
            (Message("system", system), user) if system else (user,),
            custom if isinstance(custom, str) else None,
        )


async def enqueue_agents(
    store: JobStore,
    specs: list[JobSpec],
    prompts: Iterable[tuple[tuple[Message, ...], str | None]],
    **kwargs: Any,
) -> EnqueueReport:
    """Create an agent job's later turns, then queue its agents' first turns. Refused before
    any agent was queued (an input the task cannot be filled from), it leaves no trace: the
    later turns it created are deleted again."""
    try:
        await store.load_spec(specs[0].job)
        new = False
    except JobNotFoundError:
        new = True
    for spec in reversed(specs[1:]):
        await store.create_job(spec)
    try:
        return await enqueue_prompts(store, specs[0], prompts, **kwargs)
    except Exception:
        # Nothing queued: no agent to finish, so nothing of it stays. (Some queued: a rerun
        # of the same command finishes them.)
        if new and await _queued(store, specs[0].job) == 0:
            await store.delete_job(specs[0].job)
        raise


async def _queued(store: JobStore, job: str) -> int:
    """How many prompts ``job`` holds (0 when there is no such job)."""
    try:
        return (await store.status(job, rate=False)).enqueued
    except JobNotFoundError:
        return 0
