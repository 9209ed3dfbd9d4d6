"""Stream entries: a prompt's index is its entry ID (``0-(index+1)``, or ``round-(index+1)``
once swarm-retry queued it again), and its payload a msgpack :class:`PromptItem`."""

from __future__ import annotations

import msgspec

from swarm_queue.common.models import PromptItem, decode_item

__all__ = ["decode_entry", "id_key", "index_of", "requeued"]


def id_key(entry_id: bytes) -> tuple[int, int]:
    """Sort key of an entry ID: Redis orders IDs by (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq)


def index_of(entry_id: bytes | str) -> int:
    """The prompt index encoded in a stream entry ID ``0-(index+1)``."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2]) - 1


def requeued(entry_id: bytes) -> bool:
    """Whether the entry was queued again by ``swarm-retry`` (ID ``round-(index+1)``, round
    >= 1), rather than by the producer (``0-(index+1)``)."""
    return not entry_id.startswith(b"0-")


def decode_entry(entry_id: bytes, payload: bytes | None) -> PromptItem | str:
    """The entry's :class:`PromptItem`, or a reason string when it cannot be decoded."""
    if payload is None:
        return "stream entry has no payload"
    try:
        item = decode_item(payload)
    except msgspec.DecodeError as exc:
        return f"undecodable stream entry: {exc}"
    if item.index != index_of(entry_id):
        return f"stream entry {entry_id.decode()} holds index {item.index}"
    return item
