"""The real-vLLM checks of agents (run by :mod:`bench.interop_vllm`): on a server with the hermes
parser, serving the tiny model taught to call its lookup tool, agents with ``--tool-choice``
required, a tool's name and auto each call the tool and carry its answer into the last turn,
equal to vLLM's own for the same turns sent alone; on a server without the flags, each agent
ends at once with vLLM's message and the job finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness import TOOL_RUNNER
from bench.vllm_checks import REPO, WORK, Checks, alone, job
from bench.vllm_cpu import TOOL_KEYS

__all__ = ["AGENTS", "TOOL_TASK", "agents", "tool"]

# The taught model's task (bench.vllm_cpu.build_tool_model): the key last, where it copies it.
TOOL_TASK = "Item {n}: say what the lookup tool finds for {key}"
TOOL_PARAMETERS = {"type": "object", "required": ["key"], "additionalProperties": False,
                   "properties": {"key": {"enum": list(TOOL_KEYS)}}}  # fmt: skip
AGENT_TOML = f"""[[tools]]
name = "lookup"
strict = true
[tools.parameters]
type = "object"
required = ["key"]
additionalProperties = false
[tools.parameters.properties.key]
enum = {json.dumps(list(TOOL_KEYS))}
"""
AGENTS = 20


def agents(checks: Checks, env: dict[str, str], plain: str, tooled: str) -> None:
    """The agent checks: ``tooled`` serves the taught model with the hermes parser, ``plain``
    the random one with no tool flags; a tool runner process runs the lookup."""
    inputs = WORK / "agents.jsonl"
    inputs.write_text("".join(json.dumps({"n": i, "key": TOOL_KEYS[i % len(TOOL_KEYS)]}) + "\n"
                              for i in range(AGENTS)))  # fmt: skip
    task = WORK / "task.txt"
    task.write_text(TOOL_TASK)
    log = WORK / "tool-runs.log"
    log.write_text("")
    runner_env = {**env, "SWARM_TOOLS": "bench.agent_tools:lookup", "BENCH_TOOL_LOG": str(log),
                  "PYTHONPATH": str(REPO)}  # fmt: skip
    with open(WORK / "runner.log", "wb") as fh:
        runner = subprocess.Popen(
            [sys.executable, "-c", TOOL_RUNNER],
            cwd=REPO, env=runner_env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        spec = WORK / "agent.toml"
        spec.write_text(AGENT_TOML)
        agent = ("--task", task, "--agent", spec, "--max-turns", "2", "--max-tokens", "48",
                 "--temperature", "0")  # fmt: skip
        for choice in ("required", "lookup", "auto"):
            flags = ("--tool-choice", choice) if choice != "auto" else ()
            lines = job(env, tooled, f"agents-{choice}", inputs, *agent, *flags)
            _called(checks, tooled, choice, lines, log)
        lines = job(env, plain, "agents-req-plain", inputs, *agent, "--tool-choice", "required")
        said = [x for x in lines if x.get("failure") == "error"
                and "requires --tool-call-parser" in (x.get("error") or "")]  # fmt: skip
        checks.check(len(said) == len(lines) == AGENTS,
                     "agents --tool-choice required on a server without a tool parser: each "
                     "ends at once with vLLM's message", json.dumps(lines[:1]))  # fmt: skip
        lines = job(env, plain, "agents-auto-plain", inputs, *agent)
        said = [x for x in lines if x.get("failure") == "error"
                and "--enable-auto-tool-choice" in (x.get("error") or "")]  # fmt: skip
        checks.check(len(said) == len(lines) == AGENTS,
                     "agents with tool choice auto on a server without the flags: each ends "
                     "at once with vLLM's message; the job finishes",
                     json.dumps(lines[:1]))  # fmt: skip
    finally:
        runner.terminate()
        runner.wait(timeout=60)


def tool() -> dict[str, Any]:
    """The lookup tool as swarm-queue offers it from AGENT_TOML."""
    return {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "the lookup tool",
            "parameters": TOOL_PARAMETERS,
            "strict": True,
        },
    }


def _called(checks: Checks, url: str, choice: str, lines: list[dict[str, Any]], log: Path) -> None:
    """Each agent called the tool, the tool ran, and its answer went into the last turn: the
    agent's answer and tokens equal to vLLM's own for the same two turns sent alone."""
    tools = [tool()]
    sent: Any = {"type": "function", "function": {"name": choice}} if choice == "lookup" else choice
    bad = []
    for x in lines:
        i = x["index"]
        user = {"role": "user", "content": TOOL_TASK.format(n=i, key=TOOL_KEYS[i % len(TOOL_KEYS)])}
        first = alone(url, "chat/completions", {
            "messages": [user], "tools": tools, "tool_choice": sent, "max_tokens": 48,
            "temperature": 0})  # fmt: skip
        calls = first["choices"][0]["message"].get("tool_calls") or []
        if len(calls) != 1:
            bad.append((i, "vLLM alone made no call"))
            continue
        answer = f"the value of {json.loads(calls[0]['function']['arguments'])['key']}"
        second = alone(
            url,
            "chat/completions",
            {
                "messages": [
                    user,
                    {"role": "assistant", "content": None, "tool_calls": calls},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": answer},
                ],
                "tools": tools,
                "tool_choice": "none",
                "max_tokens": 48,
                "temperature": 0,
            },
        )
        want = (
            second["choices"][0]["message"]["content"],
            first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"],
        )  # fmt: skip
        got = (x.get("text"), x.get("prompt_tokens"))
        if x.get("failure") or x.get("tool_calls") != 1 or got != want:
            bad.append((i, x.get("failure") or got, want))
    what = {"required": "--tool-choice required", "lookup": "--tool-choice lookup (named)",
            "auto": "tool choice auto (hermes parser)"}[choice]  # fmt: skip
    checks.check(
        not bad and len(lines) == AGENTS,
        f"agents {what}: {len(lines) - len(bad)}/{AGENTS} called the tool, whose answer the "
        f"last turn carried (answer and prompt tokens equal to vLLM's own); tool runs so far "
        f"{len(log.read_text().split())}",
        json.dumps(bad[:3]),
    )
