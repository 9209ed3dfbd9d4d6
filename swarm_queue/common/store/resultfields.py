"""Where an index's result is in its job's results hash: in its own field (``"17"``), or, for a
whole chunk answered in one commit of a job created to allow it (``Meta.PACKED``), in its
chunk's field (``"c16"``: :data:`~common.vocab.RESULT_CHUNK_PREFIX` and the chunk's first
index, a multiple of the job's chunk). A chunk's field holds :data:`RESULTS_MARK` and a
msgpack array of its results' own msgpack, in index order: one field, one argument and one
hash entry a chunk where there were one a prompt (issue 50). Only lua/commit.lua writes
either; :meth:`common.store.base.StoreBase.result_blobs` reads both."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.vocab import RESULT_CHUNK_PREFIX

__all__ = ["RESULTS_MARK", "block_of", "chunk_field", "pack_chunk", "split_chunk"]

# A byte no msgpack object starts with: what tells a chunk's results from a result.
RESULTS_MARK = b"\xc1"
_raws = msgspec.msgpack.Decoder(list[msgspec.Raw])


def chunk_field(first: int) -> str:
    """The results hash's field of the chunk whose first index is ``first``."""
    return f"{RESULT_CHUNK_PREFIX}{first}"


def block_of(index: int, chunk: int) -> int:
    """The first index of the chunk that holds ``index`` in a job of ``chunk``."""
    return index - index % chunk


def pack_chunk(blobs: Sequence[bytes]) -> bytes:
    """A chunk's field as lua/commit.lua writes it (what tests and tools compare with)."""
    n = len(blobs)
    return RESULTS_MARK + b"\xdc" + n.to_bytes(2, "big") + b"".join(blobs)


def split_chunk(value: bytes, chunk: int) -> list[bytes]:
    """Each result of a chunk's field, in index order. A field that cannot be read stands
    for each of its prompts as itself: unreadable, each of them fails as a damaged record
    (``models.result_or_failure``), and none of another chunk."""
    try:
        if value[:1] == RESULTS_MARK:
            raws = _raws.decode(value[1:])
            if len(raws) == chunk:
                return [bytes(r) for r in raws]
    except msgspec.DecodeError:
        pass
    return [value] * chunk
