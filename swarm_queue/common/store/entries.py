"""Stream entries: a prompt's index is its entry ID (``0-(index+1)``, or ``round-(index+1)``
once swarm-retry queued it again), and its payload a msgpack :class:`PromptItem`. A chunk
holds several consecutive prompts in one entry (ID ``0-(first+1)``): its payload is
:data:`CHUNK_MARK` and a msgpack array of its prompts' own payloads; it holds the job's
``chunk`` of prompts but where ``chunks`` (:meth:`common.keys.Keys.chunks`) says otherwise.
Everything per entry (reads, claims, acks, running marks, lanes) then works per chunk, and
everything per prompt (results, failures kept for swarm-retry) per prompt."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.models import PromptItem, decode_item

__all__ = [
    "CHUNK_MARK",
    "deaths",
    "decode_entry",
    "encode_chunk",
    "entry_payloads",
    "id_key",
    "index_of",
    "requeued",
]

# A byte no msgpack object starts with: what tells a chunk's payload from a prompt's.
CHUNK_MARK = b"\xc1"
_payloads = msgspec.msgpack.Decoder(list[bytes])
_encoder = msgspec.msgpack.Encoder()


def id_key(entry_id: bytes) -> tuple[int, int]:
    """Sort key of an entry ID: Redis orders IDs by (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq)


def deaths(mark: bytes | None) -> int:
    """How often workers died running an entry just taken over, from its ``running`` mark:
    its runs begun and never finished. An entry pending with no mark counts one, its read's
    (a read is a plain XREADGROUP, and marks are written only where that is not so: what is
    handed on, given back or taken over), so the common read and commit write no mark."""
    return 1 if mark is None else int(mark)


def index_of(entry_id: bytes | str) -> int:
    """The prompt index encoded in a stream entry ID ``0-(index+1)`` (a chunk's first)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2]) - 1


def requeued(entry_id: bytes) -> bool:
    """Whether the entry was queued again by ``swarm-retry`` (ID ``round-(index+1)``, round
    >= 1), rather than by the producer (``0-(index+1)``)."""
    return not entry_id.startswith(b"0-")


def encode_chunk(payloads: Sequence[bytes]) -> bytes:
    """One entry's payload holding ``payloads``, each a prompt's (consecutive indices)."""
    return CHUNK_MARK + _encoder.encode(list(payloads))


def entry_payloads(payload: bytes | None) -> list[bytes | None] | str:
    """The payload of each prompt an entry holds: one for a prompt's entry, each of a
    chunk's; a reason string for a chunk that cannot be read."""
    if payload is None or not payload.startswith(CHUNK_MARK):
        return [payload]
    try:
        inner: list[bytes | None] = list(_payloads.decode(payload[1:]))
    except msgspec.DecodeError as exc:
        return f"undecodable stream entry (a chunk): {exc}"
    return inner or "stream entry holds an empty chunk"


def decode_entry(
    entry_id: bytes, payload: bytes | None, *, chunked: bool = False
) -> PromptItem | str:
    """The :class:`PromptItem` of a prompt's payload (one of a chunk's, ``chunked``: its
    index at or past the entry's), or a reason string when it cannot be decoded."""
    if payload is None:
        return "stream entry has no payload"
    try:
        item = decode_item(payload)
    except msgspec.DecodeError as exc:
        return f"undecodable stream entry: {exc}"
    first = index_of(entry_id)
    if item.index != first and not (chunked and item.index > first):
        return f"stream entry {entry_id.decode()} holds index {item.index}"
    return item
