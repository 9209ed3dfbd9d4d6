"""What a slot does with the entries it took before any request: sort them by how many workers
died running them, decode them (a chunk into its prompts), and give a result to those that
never reach the endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from swarm_queue.common.models import PromptItem, Result
from swarm_queue.common.store import decode_entry, index_of
from swarm_queue.common.store.entries import CHUNK_MARK, encode_chunk, entry_payloads
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.intake import Delivery

__all__ = [
    "SUSPECT_DEATHS",
    "Decoded",
    "Finished",
    "Triage",
    "dead_letters",
    "decode_deliveries",
    "one_by_one",
    "unanswered",
    "unreadable",
]

# An entry that this many workers died running is suspected of killing them: it runs alone.
SUSPECT_DEATHS = 2

# (entry ID, result, original payload): what a commit takes.
Finished = tuple[bytes, Result, bytes | None]
# (entry ID, original payload, the prompt): what a request takes.
Decoded = tuple[bytes, bytes | None, PromptItem]


class Triage:
    """A batch's entries by deaths: ``fresh`` run together as usual (one death is usually
    innocent: a walltime, a node lost); ``suspects`` run alone, one after another, so that a
    prompt that kills workers cannot take its neighbours with it; ``dead`` (past the limit)
    are dead-lettered."""

    __slots__ = ("dead", "fresh", "suspects")

    def __init__(self, deliveries: list[Delivery], max_deliveries: int) -> None:
        self.dead = [d for d in deliveries if d[2] > max_deliveries]
        self.fresh = [d for d in deliveries if d[2] < SUSPECT_DEATHS]
        self.suspects = [d for d in deliveries if SUSPECT_DEATHS <= d[2] <= max_deliveries]


def one_by_one(deliveries: list[Delivery]) -> list[Delivery]:
    """``deliveries`` as entries of one prompt each: a chunk's prompts one by one, in order,
    each under its chunk's ID (so that a suspect's prompts run alone, and a death while one
    runs is that prompt's)."""
    out: list[Delivery] = []
    for eid, payload, deaths in deliveries:
        parts = entry_payloads(payload)
        if isinstance(parts, str) or len(parts) == 1:
            out.append((eid, payload, deaths))
        else:
            out += [(eid, encode_chunk([p]), deaths) for p in parts if p is not None]
    return out


def dead_letters(dead: list[Delivery], endpoint: str) -> tuple[list[Finished], list[Delivery]]:
    """The failed results of entries that kept killing workers (their payloads kept for
    ``swarm-retry``), and what is left to run of them: of a chunk, only its first prompt (the
    one running alone when its workers died: see :func:`one_by_one`) is dead-lettered, the
    rest run alone."""
    results: list[Finished] = []
    rest: list[Delivery] = []
    for eid, payload, n in dead:
        parts = entry_payloads(payload)
        first = parts[0] if not isinstance(parts, str) else payload
        chunked = payload is not None and payload.startswith(CHUNK_MARK)
        decoded = decode_entry(eid, first, chunked=chunked)
        index = decoded.index if isinstance(decoded, PromptItem) else index_of(eid)
        failure = Result(
            index=index,
            endpoint=endpoint,
            error=(
                f"dead-lettered: run {n} times, and each time its worker died or its server "
                "hung or dropped it (a prompt that kills workers or servers?)"
            ),
            error_kind=FailureKind.DEAD_LETTER,
        )
        results.append((eid, failure, first))
        if chunked and not isinstance(parts, str) and len(parts) > 1:
            rest += one_by_one([(eid, encode_chunk([p for p in parts[1:] if p]), n)])
    return results, rest


def decode_deliveries(
    deliveries: list[Delivery], endpoint: str
) -> tuple[list[Decoded], list[Finished]]:
    """The prompts to send (a chunk's each), and the failed results of entries that cannot be
    read."""
    items: list[Decoded] = []
    bad: list[Finished] = []
    for eid, payload, _ in deliveries:
        parts = entry_payloads(payload)
        if isinstance(parts, str):
            parts_or_none: list[bytes | None] = [payload]
            reasons: list[PromptItem | str] = [parts]
        else:
            parts_or_none = parts
            chunked = payload is not None and payload.startswith(CHUNK_MARK)
            reasons = [decode_entry(eid, p, chunked=chunked) for p in parts]
        for at, (part, decoded) in enumerate(zip(parts_or_none, reasons, strict=True)):
            if isinstance(decoded, str):
                failure = Result(
                    index=index_of(eid) + at,
                    endpoint=endpoint,
                    error=decoded,
                    error_kind=FailureKind.BAD_ENTRY,
                )
                bad.append((eid, failure, part))
            else:
                items.append((eid, part, decoded))
    return items, bad


class _Answered(Protocol):
    async def answered(self, job: str, indices: Sequence[int]) -> set[int]: ...

    async def chunk_sizes(self, job: str, entry_ids: Sequence[bytes], chunk: int) -> list[int]: ...


async def unreadable(
    store: _Answered, job: str, deliveries: list[Delivery], endpoint: str, chunk: int
) -> tuple[list[Delivery], list[Finished]]:
    """Chunks whose payload cannot be read, out of ``deliveries`` (of a job of ``chunk``):
    each of their prompts failed as a bad entry (their number the chunk's size), so that the chunk
    is acknowledged and its job ends, rather than one prompt failed and the rest waiting for
    ever."""
    bad = [d for d in deliveries if _chunk(d[1]) and isinstance(entry_payloads(d[1]), str)]
    if not bad:
        return deliveries, []
    sizes = await store.chunk_sizes(job, [eid for eid, _, _ in bad], chunk)
    failed: list[Finished] = []
    for (eid, payload, _), size in zip(bad, sizes, strict=True):
        why = entry_payloads(payload)
        failed += [
            (eid, Result(index=index_of(eid) + at, endpoint=endpoint, error=str(why),
                         error_kind=FailureKind.BAD_ENTRY), None)
            for at in range(size)
        ]  # fmt: skip
    gone = {eid for eid, _, _ in bad}
    return [d for d in deliveries if d[0] not in gone], failed


def _chunk(payload: bytes | None) -> bool:
    return payload is not None and payload.startswith(CHUNK_MARK)


async def unanswered(
    store: _Answered, job: str, deliveries: list[Delivery]
) -> tuple[list[Delivery], list[bytes]]:
    """Of chunks taken again (released, orphaned, copied: some of their prompts may have
    their results), only the prompts still to answer, so that none is answered twice; and
    the chunks with none left, to acknowledge. Entries of one prompt pass as they are (a
    commit's first write wins for them)."""
    chunks: dict[bytes, list[tuple[int, bytes]]] = {}
    for eid, payload, _ in deliveries:
        if payload is None or not payload.startswith(CHUNK_MARK):
            continue
        parts = entry_payloads(payload)
        if isinstance(parts, str):
            continue  # unreadable: failed as a bad entry
        decoded = [(decode_entry(eid, p, chunked=True), p) for p in parts if p is not None]
        # (one that does not decode stays, to fail as a bad entry)
        chunks[eid] = [(d.index if isinstance(d, PromptItem) else -1, p) for d, p in decoded]
    if not chunks:
        return deliveries, []
    have = await store.answered(job, [i for c in chunks.values() for i, _ in c if i >= 0])
    if not have:
        return deliveries, []
    left: list[Delivery] = []
    whole: list[bytes] = []
    for eid, payload, deaths in deliveries:
        if eid not in chunks:
            left.append((eid, payload, deaths))
            continue
        rest = [p for i, p in chunks[eid] if i not in have]
        if rest:
            left.append((eid, encode_chunk(rest), deaths))
        else:
            whole.append(eid)
    return left, whole
