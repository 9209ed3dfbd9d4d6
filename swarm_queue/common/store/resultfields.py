"""Where an index's result is in its job's results hash: in its own field (``"17"``), or, for a
whole chunk answered in one commit of a job created to allow it (``Meta.PACKED``), in its
chunk's field (``"c16"``: :data:`~common.vocab.RESULT_CHUNK_PREFIX` and the chunk's first
index, a multiple of the job's chunk). A chunk's field holds :data:`RESULTS_MARK` and a
msgpack array of its results' own msgpack, each as bytes (bin), in index order: one field,
one argument and one hash entry a chunk where there were one a prompt (issue 50). A worker
packs it (:func:`pack_chunk`), lua/commit.lua writes it as it came, or each result apart
where the chunk was answered before; :meth:`common.store.base.StoreBase.result_blobs` reads
both."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.vocab import RESULT_CHUNK_PREFIX

__all__ = ["RESULTS_MARK", "block_of", "chunk_field", "pack_chunk", "split_chunk"]

# A byte no msgpack object starts with: what tells a chunk's results from a result.
RESULTS_MARK = b"\xc1"
_blobs = msgspec.msgpack.Decoder(list[bytes])
_encoder = msgspec.msgpack.Encoder()


def chunk_field(first: int) -> str:
    """The results hash's field of the chunk whose first index is ``first``."""
    return f"{RESULT_CHUNK_PREFIX}{first}"


def block_of(index: int, chunk: int) -> int:
    """The first index of the chunk that holds ``index`` in a job of ``chunk``."""
    return index - index % chunk


def pack_chunk(blobs: Sequence[bytes]) -> bytes:
    """A chunk's field holding ``blobs``, its results' msgpack in index order."""
    return RESULTS_MARK + _encoder.encode(list(blobs))


def split_chunk(value: bytes, chunk: int) -> list[bytes]:
    """Each result of a chunk's field, in index order. A field that cannot be read stands
    for each of its prompts as itself: unreadable, each of them fails as a damaged record
    (``models.result_or_failure``), and none of another chunk."""
    try:
        if value[:1] == RESULTS_MARK:
            blobs = _blobs.decode(value[1:])
            if len(blobs) == chunk:
                return blobs
    except msgspec.DecodeError:
        pass
    return [value] * chunk
