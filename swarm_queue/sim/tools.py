"""The simulator's tool calls, deterministic: a user message asks for a tool with a directive
``CALL name({json arguments})``. Offered that tool (the request's ``tools``), the simulator
answers the conversation's first directive not yet answered by a ``tool`` message with a
``tool_calls`` message in vLLM's format (``finish_reason: "tool_calls"``), one call a turn;
once every directive has its answer, it answers in text, or, asked for a JSON schema's
object (``response_format``), with an object of the schema's properties.

``tool_choice`` as vLLM 0.32 takes it (checked on it: :func:`choice_error`,
:func:`tool_call`): ``auto`` (or none given) only on a server started with
``--enable-auto-tool-choice`` and ``--tool-call-parser``; ``required`` and a named tool on one
started with ``--tool-call-parser``, constrained to a call (the directive's, else the tool's
parameters filled in); else vLLM's 400 naming the flag; ``none`` on any server, never a call.
A ``response_format`` under ``auto`` holds the whole answer to its schema: no call is written."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

__all__ = [
    "AUTO_REFUSED",
    "call_id",
    "call_message",
    "choice_error",
    "pending_call",
    "schema_answer",
    "tool_call",
]

_CALL = re.compile(r"CALL (\w+)\((\{.*?\})\)")


# vLLM's answer (400) to tools with tool_choice "auto" (its default) on a server started
# without a tool-call parser.
AUTO_REFUSED = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


def _forced(choice: Any) -> str | None:
    """The tool a named ``tool_choice`` forces (None: it names none)."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    return None


def choice_error(
    tools: list[dict[str, Any]] | None, choice: Any, parser: bool, auto: bool
) -> str | None:
    """vLLM 0.32's refusal of a request's ``tool_choice`` with these ``tools`` on a server
    started with a ``--tool-call-parser`` or not, and with ``--enable-auto-tool-choice``
    (``auto``) or not (None: accepted). Only ``none`` needs neither."""
    if not tools or choice == "none":
        return None
    if choice is None or choice == "auto":
        return None if auto and parser else AUTO_REFUSED
    if choice == "required":
        return None if parser else 'tool_choice="required" requires --tool-call-parser to be set'
    name = _forced(choice)
    if name is None:
        return f"Invalid tool_choice: {choice!r}"
    if name not in {(t.get("function") or {}).get("name") for t in tools}:
        return "The tool specified in `tool_choice` does not match any of the specified `tools`"
    return (
        None if parser else f'tool_choice=function "{name}" requires --tool-call-parser to be set'
    )


def tool_call(
    messages: list[tuple[str, str | None]],
    tools: list[dict[str, Any]] | None,
    choice: Any,
    constrained: bool,
    offered_only: bool = True,
) -> tuple[str, str] | None:
    """``(name, arguments)`` of the call the model writes, or None: it answers in text.
    ``constrained``: a ``response_format`` holds the answer to its schema (under ``auto``, no
    call can be written); ``offered_only`` False: a directive naming a tool not offered is
    followed too (a model may write any name)."""
    if not tools or choice == "none":
        return None
    offered = {(t.get("function") or {}).get("name") for t in tools}
    forced = _forced(choice)
    if choice is None or choice == "auto":
        return None if constrained else pending_call(messages, offered if offered_only else None)
    pending = pending_call(messages, offered if forced is None else {forced})
    if pending is not None:
        return pending
    # No directive left: the first tool offered (or the one named), its parameters filled in.
    tool = next(
        t for t in tools if forced is None or (t.get("function") or {}).get("name") == forced
    )
    function = tool.get("function") or {}
    arguments = schema_answer(
        function.get("parameters") or {}, "".join(c or "" for _, c in messages)
    )
    return str(function.get("name")), json.dumps(arguments, sort_keys=True)


def call_id(name: str, arguments: str, turn: int) -> str:
    """A tool call's id: a function of what is called, and when."""
    return f"call_{zlib.crc32(f'{turn}:{name}:{arguments}'.encode()):08x}"


def pending_call(
    messages: list[tuple[str, str | None]], offered: set[str | None] | None
) -> tuple[str, str] | None:
    """``(name, arguments)`` of the first tool call the conversation's directives ask for and
    no ``tool`` message answers yet (None: all answered, or none asked for); only of the
    ``offered`` tools, unless that is None."""
    asked = [
        (name, json.dumps(json.loads(args), sort_keys=True))
        for role, content in messages
        if role == "user" and content
        for name, args in _CALL.findall(content)
        if offered is None or name in offered
    ]
    answered = sum(1 for role, _ in messages if role == "tool")
    return asked[answered] if answered < len(asked) else None


def schema_answer(schema: dict[str, Any], seed: str) -> dict[str, Any]:
    """An object with every property of a JSON schema, each of its type, derived from
    ``seed`` (the conversation): deterministic, and valid against the schema's types."""
    h = zlib.crc32(seed.encode())
    out: dict[str, Any] = {}
    for i, (name, prop) in enumerate((schema.get("properties") or {}).items()):
        kind = prop.get("type") if isinstance(prop, dict) else None
        v = (h >> (i % 24)) & 0xFFFF
        if kind == "integer":
            out[name] = v % 100
        elif kind == "number":
            out[name] = (v % 1000) / 10
        elif kind == "boolean":
            out[name] = bool(v & 1)
        elif kind == "array":
            out[name] = [f"item-{v % 97}"]
        elif kind == "object":
            out[name] = {}
        else:
            out[name] = f"{name}-{v:04x}"
    return out


def call_message(name: str, arguments: str, turn: int, choice: Any) -> tuple[dict[str, Any], str]:
    """The assistant message asking for tool ``name`` with ``arguments`` at ``turn``, and its
    finish reason, as vLLM's parsers give them under the request's tool ``choice``."""
    call = {
        "id": call_id(name, arguments, turn),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if choice is None or choice == "auto":  # the parser found a call
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    # A call forced by guided decoding: vLLM 0.32 writes it with content "" and finish
    # "tool_calls" when required, "stop" when a tool was named (OpenAI's rule).
    reason = "tool_calls" if choice == "required" else "stop"
    return {"role": "assistant", "content": "", "tool_calls": [call]}, reason
