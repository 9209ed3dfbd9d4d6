"""The simulator's tool calls, deterministic: a user message asks for a tool with a directive
``CALL name({json arguments})``. Offered that tool (the request's ``tools``), the simulator
answers the conversation's first directive not yet answered by a ``tool`` message with a
``tool_calls`` message in vLLM's format (``finish_reason: "tool_calls"``), one call a turn;
once every directive has its answer, it answers in text, or, asked for a JSON schema's
object (``response_format``), with an object of the schema's properties."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

__all__ = ["call_id", "pending_call", "schema_answer"]

_CALL = re.compile(r"CALL (\w+)\((\{.*?\})\)")


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
