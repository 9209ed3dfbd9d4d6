"""A chat prompt on the wire: its messages, as OpenAI's chat API takes them, and the tool calls
an answer asks for."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Message", "ToolCall"]


class ToolCall(msgspec.Struct, frozen=True, array_like=True):
    """One tool call an answer asks for: its id, the tool's name and its arguments (JSON
    text, as the model wrote them)."""

    id: str
    name: str
    arguments: str


class Message(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """One message of a chat conversation, as OpenAI's chat API takes it: an assistant's may
    hold the tool calls it asked for, a ``tool`` message answers the call ``tool_call_id``."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None

    def as_openai(self) -> dict[str, Any]:
        """The message as the chat API takes it (keys only for what it has)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["content"] = self.content or None
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out
