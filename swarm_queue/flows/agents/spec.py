"""Agents on the fleet: each input a conversation of turns, each turn one unit of queue work.

An agent job ``a`` is its agents' first turns; its later turns are jobs of their own,
``a:s1``, ``a:s2``... (one per turn, up to ``max_turns``), all of the agent job's priority;
a worker serves an agent job's earlier turns before its later ones
(:func:`worker.intake.service_order`), so no agent's first turn is left for the end. A turn's
answer, the moment it is committed, is taken by the agents' flow (:mod:`flows.agents.flow`),
which every worker runs:

* tool calls: asked of the tool runners (:mod:`flows.agents.toolcalls`), and the agent parked until
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

import re
import string
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from swarm_queue.common.chat import Message
from swarm_queue.common.errors import (
    ConfigError,
    JobNotFoundError,
)
from swarm_queue.common.feed import EnqueueReport, enqueue_prompts
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.keys import step_name, validate_tool_name
from swarm_queue.common.models import Chat, FlowRef, JobSpec
from swarm_queue.common.schema import AnswerValidator
from swarm_queue.common.store import ProducerStore
from swarm_queue.common.toolcall import ToolAnswer
from swarm_queue.flows.pipeline.spec import MAX_STEPS

__all__ = [
    "KIND",
    "AgentResult",
    "AgentSpec",
    "agent_of",
    "agent_prompts",
    "build_agents",
    "enqueue_agents",
    "fill_task",
    "not_offered",
    "offered_tools",
    "task_fields",
    "tool_definition",
]


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


# The name the agents' flow goes by (an agent turn's FlowRef.kind).
KIND = "agents"


class AgentSpec(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """What makes a job's prompts agents (the flow settings of its turns): each a
    conversation of turns, the tools of the job (its chat request's) run by the tool runners
    between them, its final answer checked against ``output_schema`` (a JSON Schema) with up
    to ``max_repairs`` turns to repair it."""

    max_turns: int = 4
    max_repairs: int = 1
    output_schema: dict[str, Any] | None = None
    # Whether its turns call tools: "auto" (None: the model decides, which vLLM serves only
    # with --enable-auto-tool-choice and a --tool-call-parser), "required" or one tool's name
    # (a call at every turn but the last, constrained by the server: --tool-call-parser), "none".
    tool_choice: str | None = None


def agent_of(spec: JobSpec) -> AgentSpec | None:
    """What makes ``spec``'s prompts agents, when it is an agent job or one of its turns."""
    if spec.flow is None or spec.flow.kind != KIND:
        return None
    return msgspec.convert(spec.flow.settings, AgentSpec)


def offered_tools(spec: JobSpec) -> list[str]:
    """The names of the tools ``spec``'s job offers its agents."""
    return [t.get("function", {}).get("name", "") for t in spec.tools or ()]


def not_offered(name: str, offered: list[str]) -> ToolAnswer:
    """The answer the model gets for calling a tool its job did not offer: never run."""
    names = ", ".join(repr(n) for n in offered) or "none"
    return ToolAnswer(error=f"tool {name!r} was not offered to this job (its tools: {names})")


# An agent going on to its next turn: its index, the item of the turn before, the
# conversation of the next turn, and the lane to queue it in ("" for any endpoint).
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
    tools offered, every turn of the job's priority."""
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
    spec, warnings = build_spec(job, chat, source=source, step=True)
    flow = FlowRef(kind=KIND, failures=True, settings=msgspec.to_builtins(agent))
    spec = msgspec.structs.replace(spec, request=Chat(tools=tools or None), flow=flow)
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
    specs = []
    for k in range(agent.max_turns):
        turn = guided if k == last or not tools else spec
        place = {"affinity": True} if k else {}
        specs.append(
            msgspec.structs.replace(
                turn,
                job=step_name(job, k),
                priority=spec.priority,
                request=Chat(
                    tools=tools or None, tool_choice="none" if forced and k == last else choice
                ),
                **place,
            )
        )
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
    store: ProducerStore,
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


async def _queued(store: ProducerStore, job: str) -> int:
    """How many prompts ``job`` holds (0 when there is no such job)."""
    try:
        return (await store.status(job, rate=False)).enqueued
    except JobNotFoundError:
        return 0
