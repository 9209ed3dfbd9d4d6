"""``swarm-enqueue ... --task FILE`` (or ``--agent agent.toml``): an agent job from the
command line. Each input line is a JSON object whose fields fill the task's ``{field}``s; the
tools are named (the tool runners' ``SWARM_TOOLS`` decide what each is) or, in the TOML file,
described with their parameters; ``--schema`` is the agents' output schema."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Iterator
from typing import Any, BinaryIO

from swarm_queue.common.errors import ConfigError, InputError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents.spec import (
    AgentSpec,
    agent_prompts,
    build_agents,
    enqueue_agents,
    offered_tools,
    task_fields,
    tool_definition,
)
from swarm_queue.producer.jobflags import read_text

__all__ = ["add_agent_args", "enqueue_agent_job", "is_agent_job", "unserved_tools"]


def add_agent_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "agents (each input line a JSON object; its fields fill the task's {field}s)"
    )
    g.add_argument("--task", metavar="FILE", help="the task template: makes the job an agent job")
    g.add_argument("--system", metavar="FILE", help="the agents' system prompt")
    g.add_argument(
        "--tools",
        metavar="NAMES",
        help="tools offered to the agents, by name (comma-separated): the tool runners "
        "(swarm-tools) run them, each only if its SWARM_TOOLS allows it",
    )
    g.add_argument(
        "--tool-choice",
        metavar="CHOICE",
        help="auto (default: the model decides; vLLM serves it only when started with "
        "--enable-auto-tool-choice --tool-call-parser NAME), required or a tool's name (a call "
        "at every turn but the last, which answers; vLLM needs --tool-call-parser NAME), or none",
    )
    g.add_argument("--max-turns", type=int, default=4, metavar="N", help="turns (default 4)")
    g.add_argument(
        "--max-repairs",
        type=int,
        default=1,
        metavar="N",
        help="turns to repair an answer that misses --schema (default 1)",
    )
    g.add_argument(
        "--agent",
        metavar="FILE",
        help="all of the above in a TOML file: task, system, tool_choice, max_turns, "
        "max_repairs, and "
        "[[tools]] tables (name, description, parameters, strict)",
    )


def is_agent_job(args: argparse.Namespace) -> bool:
    return bool(args.task or args.agent)


def _agent_config(args: argparse.Namespace) -> dict[str, Any]:
    """The agent's settings: the TOML file's, the flags given beside it winning."""
    config: dict[str, Any] = {}
    if args.agent:
        try:
            config = tomllib.loads(read_text(args.agent, "--agent"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--agent {args.agent}: {exc}") from None
    if args.task:
        config["task"] = read_text(args.task, "--task")
    if args.system:
        config["system"] = read_text(args.system, "--system")
    if args.tools:
        config["tools"] = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.tool_choice:
        config["tool_choice"] = args.tool_choice
    config.setdefault("max_turns", args.max_turns)
    config.setdefault("max_repairs", args.max_repairs)
    if not isinstance(config.get("task"), str):
        raise ConfigError("an agent job needs its task (--task FILE, or task = ... in --agent)")
    return config


def _choice(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ConfigError(f"tool_choice is a word or a tool's name, got {value!r}")


def _tools(config: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for t in config.get("tools", []):
        if isinstance(t, str):
            out.append(tool_definition(t))
        elif isinstance(t, dict) and isinstance(t.get("name"), str):
            d = tool_definition(t["name"], t.get("description", ""))
            if isinstance(t.get("parameters"), dict):
                d["function"]["parameters"] = t["parameters"]
            if "strict" in t:
                # OpenAI's strict: vLLM then holds a forced call's arguments to the parameters
                # (without it, 0.32 constrains only the call's envelope).
                if not isinstance(t["strict"], bool):
                    raise ConfigError(f"tool {t['name']!r}: strict is true or false, got "
                                      f"{t['strict']!r}")  # fmt: skip
                d["function"]["strict"] = t["strict"]
            out.append(d)
        else:
            raise ConfigError(f"a tool is a name or a table with a name, got {t!r}")
    return out


def _inputs(stream: BinaryIO, source: str, task: str) -> Iterator[dict[str, Any]]:
    """The input objects, each checked against the task (an error names ``FILE:LINE``)."""
    for n, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise InputError(source, n, f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise InputError(source, n, "an agent's input is a JSON object of the task's fields")
        missing = task_fields(task) - obj.keys()
        if missing:
            raise InputError(
                source, n, f"no field {sorted(missing)[0]!r} the task names (it has "
                f"{', '.join(map(repr, sorted(obj))) or 'none'})",
            )  # fmt: skip
        yield obj


async def enqueue_agent_job(
    settings: Settings, args: argparse.Namespace, job: str, options: JobOptions
) -> str:
    """Queue the agent job the arguments describe; the line to print."""
    config = _agent_config(args)
    agent = AgentSpec(
        max_turns=int(config["max_turns"]),
        max_repairs=int(config["max_repairs"]),
        output_schema=options.schema,
        tool_choice=_choice(config.get("tool_choice")),
    )
    plain = JobOptions(**{**_fields(options), "schema": None})
    specs, warnings = build_agents(job, plain, agent, _tools(config), source=args.input)
    for warning in warnings:
        print(f"swarm-enqueue: warning: {warning}", file=sys.stderr)
    store = JobStore.from_settings(settings)
    try:
        for warning in await unserved_tools(store, offered_tools(specs[0])):
            print(f"swarm-enqueue: warning: {warning}", file=sys.stderr)
        if args.input == "-":
            stream: BinaryIO = sys.stdin.buffer
            prompts = agent_prompts(
                config["task"], _inputs(stream, "<stdin>", config["task"]), config.get("system")
            )
            report = await enqueue_agents(store, specs, prompts, progress=True)
        else:
            with open(args.input, "rb") as fh:  # noqa: ASYNC230 - a CLI, nothing else runs
                prompts = agent_prompts(
                    config["task"], _inputs(fh, args.input, config["task"]), config.get("system")
                )
                report = await enqueue_agents(store, specs, prompts, progress=True)
    except OSError as exc:
        raise ConfigError(f"cannot read {args.input}: {exc.strerror}") from None
    finally:
        await store.close()
    return (
        f"agent job {report.job}: {report.total} agents queued ({report.added} new, "
        f"{report.already_queued} already queued), up to {agent.max_turns} turns each"
    )


async def unserved_tools(store: JobStore, tools: list[str]) -> list[str]:
    """A warning for each of ``tools`` that no live tool runner serves now: its calls wait
    in its queue until one does, and fail after SWARM_TOOL_WAIT_S."""
    runners = await store.tool_runners(tools)
    return [
        f"no tool runner serves {t!r} now: its calls wait for one (a swarm-tools whose "
        "SWARM_TOOLS allows it), and fail after SWARM_TOOL_WAIT_S"
        for t in tools
        if not runners[t]
    ]


def _fields(options: JobOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in options.__struct_fields__}
