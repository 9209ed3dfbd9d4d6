"""Tool calls as agents share them: the key that names a call (the tool and its arguments,
whatever their order), and the answer a tool runner keeps for it.

A call is run once while it is in flight: the first asker claims it (a key with a TTL) and
queues it for the tool runners; who asks again meanwhile waits for its answer. The answer is
kept for the waiters, and as a cache for later callers when the tool asks for one (a
function's ``swarm_cache_s`` attribute). A runner that dies holding a call lets its claim
expire, and the next asker runs it again: at least once, deduplicated by its key.
"""

from __future__ import annotations

import hashlib
import json

import msgspec

__all__ = [
    "BEGUN",
    "CLAIM_UNQUEUED_S",
    "HAND_OVER_S",
    "START_GRACE_S",
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
    """The longest a runner holds one try of a call: a wait for its tool's limits, then its
    run, each at most ``tool_timeout_s`` (arq's timeout of a try)."""
    return 2 * tool_timeout_s + 10


# How long a call's claim lasts until its try is queued; then it lasts :func:`claim_s`.
CLAIM_UNQUEUED_S = 10.0


# A call's claim holds "1" until its try is queued, then the try's arq job ID, then BEGUN and
# the runner's label once a runner has begun that try: what tells an asker a try queued and
# never begun, or begun by a runner that is gone.
BEGUN = b"begun:"

# A try that arq marks taken (its in-progress key) at two looks this far apart while no runner
# has begun it is lost, and asked again; so is a try begun by a runner that no longer says it
# serves the tool at two such looks (killed: its label lapses from the tool's runners). arq
# marks a job taken before running it and gives it to another runner only once that mark
# expires, the tool's whole timeout and more (seen: agents stalled minutes after a Redis
# restart lost a mark's reply, and 130 s at the defaults after a runner was killed).
START_GRACE_S = 5.0


def claim_s(tool_timeout_s: float) -> float:
    """How long a call's claim lasts: longer than arq's three tries of it, so that no one
    asks for it again while a runner may still answer."""
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
