"""Tool calls as agents share them: the key that names a call (the tool and its arguments,
whatever their order), and the answer a tool runner keeps for it.

A call is run once while it is in flight: the first asker queues it on its tool's stream and
claims it (a key with a TTL, holding the entry) in one step; who asks again meanwhile waits
for its answer. The answer is kept for the waiters, and as a cache for later callers when the
tool asks for one (a function's ``swarm_cache_s`` attribute). A runner renews the claim and
its entry's idle time while the call runs; one that dies leaves the entry idle, and another
runner takes it over after the claim idle time, as workers take over prompts: at least once,
deduplicated by its key, and at most :data:`MAX_RUNS` runs.
"""

from __future__ import annotations

import hashlib
import json

import msgspec

__all__ = [
    "HAND_OVER_S",
    "MAX_RUNS",
    "ToolAnswer",
    "claim_s",
    "cut",
    "decode_answer",
    "encode_answer",
    "runner_hold_s",
    "tool_key",
]

# How long an answer is kept for the callers that waited on it, at least (a tool's cache may
# keep it longer), from when it was last asked for.
HAND_OVER_S = 120.0


def cut(content: str, max_bytes: int) -> tuple[str, int]:
    """``content`` within ``max_bytes`` of UTF-8 (its head and a note saying so), and its
    size if it was cut (0: whole)."""
    data = content.encode()
    if len(data) <= max_bytes:
        return content, 0
    head = data[:max_bytes].decode("utf-8", "ignore")
    note = f"\n[cut: the tool answered {len(data):,} bytes; the first {max_bytes:,} are shown]"
    return head + note, len(data)


def runner_hold_s(tool_timeout_s: float) -> float:
    """The longest a runner holds one run of a call: a wait for its tool's limits, then its
    run, each at most ``tool_timeout_s``."""
    return 2 * tool_timeout_s + 10


# A call taken over this many times from runners that died running it is answered with that
# error, not run again: a call that kills its runner (out of memory, say) must not kill every
# runner of the fleet in turn, and its agents must end.
MAX_RUNS = 3


def claim_s(tool_timeout_s: float) -> float:
    """How long a call's claim lasts unrenewed: longer than a call waits for a runner while
    runners serve its tool, so that no one queues it again meanwhile. (A call whose entry was
    lost, an operator deleting the stream, is queued again by its next asker after that.)"""
    return 3 * runner_hold_s(tool_timeout_s) + 30


def tool_key(name: str, arguments: str) -> str:
    """The key of calling ``name`` with ``arguments`` (JSON text): equal for equal arguments
    in any key order; arguments that are no JSON object are keyed as written."""
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canonical = arguments
    digest = hashlib.blake2b(f"{name}\0{canonical}".encode(), digest_size=16).hexdigest()
    return f"{name}:{digest}"


class ToolAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a tool call returned (``content``, as the model receives it), or why it failed
    (``error``: then the model receives that as the tool's answer, as OpenAI's API does)."""

    content: str = ""
    error: str | None = None
    runner: str = ""
    elapsed_s: float = 0.0
    refused: bool = False  # the runner does not allow the tool: the agent fails with kind "tool"
    # The answer's size when it was cut to SWARM_TOOL_MAX_BYTES (0: whole).
    truncated_bytes: int = 0
    # How many times the call ran for this answer (more than 1: a runner died mid-call).
    runs: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def for_model(self) -> str:
        """The tool message's content."""
        return self.content if self.error is None else f"error: {self.error}"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ToolAnswer)


def encode_answer(answer: ToolAnswer) -> bytes:
    return _encoder.encode(answer)


def decode_answer(data: bytes) -> ToolAnswer:
    return _decoder.decode(data)
