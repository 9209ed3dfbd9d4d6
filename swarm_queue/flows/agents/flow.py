"""The agents' flow: moves every agent job's agents between their turns.

A turn's answer, the moment it is committed, is taken by the agent pump (one at a time per
agent job, by its lock; see :mod:`flows.flow`):

* tool calls: asked of the tool runners (:mod:`flows.agents.toolcalls`), and the agent parked until
  every answer is in. A parked agent is in no queue and holds no slot of any endpoint; once
  its answers are in, its conversation, the calls and their answers added, is queued as its
  next turn, in the lane of the endpoint that served the turn before;
* an answer: checked against the output schema; a mismatch, or an answer cut off at
  ``max_tokens``, gets a repair turn (the errors sent back) while repairs are left; then the
  agent finishes, once, with its output as data;
* a failure, a tool no runner allows, or the last turn asking for tools: the agent finishes
  with that failure and its reason; the other agents go on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgspec

from swarm_queue.common.chat import Message
from swarm_queue.common.keys import group_of, step_name
from swarm_queue.common.models import JobSpec, PromptItem, Result, decode_item, result_or_failure
from swarm_queue.common.schema import validator_of
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore
from swarm_queue.common.store.steps import Landed, Move
from swarm_queue.common.toolcall import ToolAnswer
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.agents.end import end_cancelled
from swarm_queue.flows.agents.output import AgentOutput
from swarm_queue.flows.agents.spec import (
    KIND,
    AgentResult,
    AgentSpec,
    agent_of,
    offered_tools,
)
from swarm_queue.flows.agents.state import (
    AgentState,
    Onward,
    Waiting,
    answers_of,
    counting,
    decode_state,
    decode_waiting,
    encode,
    lane_of,
)
from swarm_queue.flows.agents.toolcalls import ToolCaller
from swarm_queue.flows.flow import Flow, Gauge

__all__ = ["AgentFlow"]


class AgentFlow(Flow):
    """Moves every agent job's agents between their turns: its work is each agent job with
    agents still running."""

    name = KIND
    output = AgentOutput

    def __init__(self, store: FlowStore, settings: Settings, **given: Any) -> None:
        super().__init__(store, settings, **given)
        self._caller: ToolCaller | None = None
        self._tool_stats: dict[str, int] = {}

    async def find(self) -> dict[str, JobSpec]:
        specs = await self.current_specs(await self.job_names())
        return {
            name: spec
            for name, spec in specs.items()
            if not group_of(name)[1]
            and agent_of(spec) is not None
            and not await self._complete(spec)
        }

    def _agent_job(self, spec: JobSpec) -> AgentSpec:
        agent = agent_of(spec)
        assert agent is not None  # the work is agent jobs
        return agent

    async def _complete(self, spec: JobSpec) -> bool:
        """Whether no agent of ``spec``'s job moves any more: all finished (a cancelled job's
        once each has its outcome, see :mod:`flows.agents.end`)."""
        status = await self.store.status(spec.job, rate=False)
        if status.total is None:
            return False
        return await self.store.outcomes_count(spec.job) >= status.total

    @property
    def caller(self) -> ToolCaller:
        assert self._caller is not None
        return self._caller

    async def ready(self) -> None:
        if self._caller is None:
            self._caller = ToolCaller(self.store, self.settings)

    async def gauges(self) -> list[Gauge]:
        """Each running agent job's agents by state, and the tool calls of this Redis."""
        agents = {job: await self.store.outcome_counts(job) for job in sorted(self.work)}
        if agents:  # else as last read
            self._tool_stats = await self.store.tool_stats()
        tools = self._tool_stats
        return [
            Gauge(
                "swarm_agents",
                "An agent job's agents by state: thinking (queued or at an endpoint), waiting "
                "(for a tool: holding no endpoint slot), done (as last read)",
                ("job", "state"),
                tuple(
                    ((job, state), float(n))
                    for job, a in agents.items()
                    for state, n in (
                        ("thinking", a.active),
                        ("waiting", a.parked),
                        ("done", a.done),
                    )
                ),
            ),
            Gauge(
                "swarm_tool_calls",
                "Tool calls of this Redis: run by the runners, or answered by a run already "
                "made or under way (shared), as last read",
                ("outcome",),
                tuple(((o,), float(tools.get(o, 0))) for o in ("runs", "shared")),
            ),
        ]

    async def advance(self, name: str, spec: JobSpec) -> bool:
        agent = self._agent_job(spec)
        if not await self.lock(step_name(spec.job, agent.max_turns)):  # no job: its lock
            return False
        if (await self.store.status(spec.job, rate=False)).cancelled:
            # swarm-cancel stops its turns whole: no answer moves on, every agent ends.
            waits = (await self.store.parked(spec.job)).items()
            ids = {o: decode_waiting(b).item.custom_id for o, b in waits}
            return await end_cancelled(self.store, spec, ids) > 0
        did = False
        for k in range(agent.max_turns):
            turn = step_name(spec.job, k)
            if k and not await self.lock(turn):
                continue  # (held by another: cannot be, with the pump's lock; be safe)
            landed = await self.take(turn, spec.generation)
            if landed:
                await self._answers(spec, k, landed)
                did = True
        did |= await self._unpark(spec)
        await self._seal(spec)
        return did

    async def _answers(self, spec: JobSpec, k: int, landed: list[Landed]) -> None:
        """A turn's answers: each agent parked, finished or sent on to its next turn."""
        turn = step_name(spec.job, k)
        raws = await self.store.results_at(turn, [x.index for x in landed])
        items = [decode_item(x.payload or b"") for x in landed]
        origins = [it.origin if it.origin is not None else it.index for it in items]
        states = await self.store.input_states(spec.job, origins)
        offered = offered_tools(spec)
        now = await self.store.server_time()
        finished: dict[int, bytes] = {}
        asking: list[tuple[int, Waiting]] = []  # agents parking, their calls' keys still ""
        onward: list[Onward] = []
        new_states: dict[int, bytes] = {}
        for x, item, origin, raw, blob in zip(landed, items, origins, raws, states, strict=True):
            state = counting(decode_state(blob) if blob else AgentState(), k)
            r = result_or_failure(x.index, raw) if raw is not None else None
            state.turns += 1
            if r is not None and r.usage is not None:
                state.prompt_tokens += r.usage.prompt_tokens
                state.completion_tokens += r.usage.completion_tokens
            end, repair = self._outcome(spec, k, item, origin, state, r)
            if end is not None:
                finished[origin] = encode(end)
            elif r is not None and r.tool_calls:  # asked of the runners by _asked
                calls = [("", c) for c in r.tool_calls]
                state.tool_calls += len(calls)
                asking.append((origin, Waiting(k, item, calls, lane_of(r), now)))
            elif repair is not None:
                state.repairs += 1
                onward.append((origin, item, repair, lane_of(r)))
            new_states[origin] = encode(state)
        parked = await self._asked(asking, offered)
        await self.store.record_outcomes(
            spec.job, gen=spec.generation, states=new_states, waits=parked, results=finished
        )
        await self._onward(spec, k, onward, [x.entry_id for x in landed], repairs=True)

    async def _asked(
        self, asking: list[tuple[int, Waiting]], offered: list[str]
    ) -> dict[int, bytes]:
        """The parking agents' calls asked of the runners, all at once, each with its key.
        Only a tool the job offered is ever asked of a runner (a model may name any tool, a
        prompt injection another team's, and a runner allows more than this job was given):
        another's key stays "" and its answer is the refusal."""
        wanted = [c for _, w in asking for _, c in w.calls if c.name in offered]
        keys = iter(await self.caller.ask_all([(c.name, c.arguments) for c in wanted]))
        return {
            origin: encode(
                msgspec.structs.replace(
                    w, calls=[(next(keys) if c.name in offered else "", c) for _, c in w.calls]
                )
            )
            for origin, w in asking
        }

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
        agent = self._agent_job(spec)
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
        validator = validator_of(self._agent_job(spec).output_schema or None)
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
        goal = await self.spec(target)
        done = await self.store.moved(target, [o for o, _, _, _ in onward])
        first = await self.store.enqueued_count(target)
        own: dict[str, Any] = {}
        if repairs:
            last = await self.spec(step_name(spec.job, self._agent_job(spec).max_turns - 1))
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
        agent = self._agent_job(spec)
        source = step_name(spec.job, k)
        target = step_name(spec.job, min(k + 1, agent.max_turns - 1))
        if target == source:  # the last turn: nothing follows; acknowledge alone
            await self.store.ack_landed(source, acked)
            return
        goal = await self.spec(target)
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
        waits = {origin: decode_waiting(blob) for origin, blob in parked.items()}
        got = await self._answers_in(waits.values())
        for origin, w in waits.items():
            answers = answers_of(w, got, offered)
            if any(a is None for a in answers):
                why = await self._unserved(w, answers, now)
                if why is not None:
                    failed[origin] = encode(
                        AgentResult(
                            index=origin, custom_id=w.item.custom_id, failure="tool", error=why
                        )
                    )
                elif answers != (w.answers or [None] * len(w.calls)):  # some new: keep them
                    kept[origin] = encode(msgspec.structs.replace(w, answers=answers))
                continue
            refused = next((a for a in answers if a is not None and a.refused), None)
            if refused is not None:
                failed[origin] = encode(
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
        await self.store.record_outcomes(spec.job, gen=spec.generation, waits=kept, results=failed)
        for k, onward in ready.items():
            await self._onward(spec, k, onward, [])
            unparked = [o for o, _, _, _ in onward]
            states = await self._tallied(spec, {o: tallies[o] for o in unparked})
            await self.store.record_outcomes(
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
            agents, await self.store.input_states(spec.job, agents), strict=True
        ):
            state = decode_state(blob) if blob else AgentState()
            runs, cut = tallies[origin]
            state.tool_runs += runs
            state.tools_cut += cut
            out[origin] = encode(state)
        return out

    async def _answers_in(self, waits: Iterable[Waiting]) -> dict[str, ToolAnswer | None]:
        """The answers Redis has now of the calls parked agents still wait on, by key, each
        call asked once however many agents wait on it (in two reads for all, not two for
        each agent: a thousand agents park at once); one neither answered nor in hand is
        asked for again."""
        calls = {
            key: (key, c.name, c.arguments)
            for w in waits
            for (key, c), a in zip(w.calls, w.answers or [None] * len(w.calls), strict=True)
            if key and a is None
        }
        return dict(zip(calls, await self.caller.answers(list(calls.values())), strict=True))

    async def _unserved(
        self, w: Waiting, answers: list[ToolAnswer | None], now: float
    ) -> str | None:
        """Why a parked agent ends, when a call it waits on has waited ``tool_wait_s`` and no
        live runner serves its tool; None while it may still be answered."""
        wait_s = self.settings.tool_wait_s
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
        agent = self._agent_job(spec)
        waiting_turns = {
            decode_waiting(b).turn for b in (await self.store.parked(spec.job)).values()
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
            goal = await self.spec(turn)
            await self.store.seal(turn, await self.store.enqueued_count(turn), gen=goal.generation)
            await self.store.release_producer_lock(turn, self.token)
