"""What a slot does with the entries it took before any request: sort them by how many workers
died running them, decode them, and give a result to those that never reach the endpoint."""

from __future__ import annotations

from swarm_queue.common.models import PromptItem, Result
from swarm_queue.common.store import decode_entry, index_of
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.intake import Delivery

__all__ = ["SUSPECT_DEATHS", "Decoded", "Finished", "Triage", "dead_letters", "decode_deliveries"]

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


def dead_letters(dead: list[Delivery], endpoint: str) -> list[Finished]:
    """The failed results of entries that kept killing workers (their payloads kept for
    ``swarm-retry``)."""
    return [
        (
            eid,
            Result(
                index=index_of(eid),
                endpoint=endpoint,
                error=(
                    f"dead-lettered: run {n} times, and each time its worker died or its server "
                    "hung or dropped it (a prompt that kills workers or servers?)"
                ),
                error_kind=FailureKind.DEAD_LETTER,
            ),
            payload,
        )
        for eid, payload, n in dead
    ]


def decode_deliveries(
    deliveries: list[Delivery], endpoint: str
) -> tuple[list[Decoded], list[Finished]]:
    """The prompts to send, and the failed results of entries that cannot be read."""
    items: list[Decoded] = []
    bad: list[Finished] = []
    for eid, payload, _ in deliveries:
        decoded = decode_entry(eid, payload)
        if isinstance(decoded, str):
            failure = Result(
                index=index_of(eid),
                endpoint=endpoint,
                error=decoded,
                error_kind=FailureKind.BAD_ENTRY,
            )
            bad.append((eid, failure, payload))
        else:
            items.append((eid, payload, decoded))
    return items, bad
