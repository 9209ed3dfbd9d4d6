"""A batch's answers once its request is done: which are still to commit (and how shaped),
which the endpoint kept leaving out (another endpoint's to try), and which the response cache
keeps, each matched to its own prompt."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from swarm_queue.common.models import Result
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.batch import GIVEN_BACK
from swarm_queue.worker.deliveries import Decoded
from swarm_queue.worker.early import EarlyCommits

__all__ = ["Unanswered", "left_out", "settled"]


class Unanswered(NamedTuple):
    """A prompt an endpoint could not answer usably: its delivery, why, and the kind it
    fails with if no other endpoint can take it."""

    decoded: Decoded
    why: str
    kind: FailureKind
    attempts: int = 0  # the requests that carried it here, where known


def left_out(
    items: list[Decoded], sent: list[Result]
) -> tuple[list[Decoded], list[Result], list[Unanswered]]:
    """``items`` and their results without those the endpoint could not answer and another
    may (kinds ``no_choice``, ``server_error``), and those apart."""
    kept, left = [], []
    for d, r in zip(items, sent, strict=True):
        if r.error_kind in GIVEN_BACK:
            left.append(Unanswered(d, r.error or "", FailureKind(r.error_kind), r.attempts))
        else:
            kept.append((d, r))
    return [d for d, _ in kept], [r for _, r in kept], left


def settled(
    items: list[Decoded],
    sent: list[Result],
    keys: list[str | None],
    shape: Callable[[Result], Result],
    early: EarlyCommits | None,
) -> tuple[list[tuple[Decoded, Result]], list[Unanswered], list[str | None], list[Result]]:
    """``(rest, left, keys, answers)``: the items still to commit with their shaped results
    (none of those ``early`` committed), the prompts the endpoint kept leaving out, and the
    cache's keys (those of ``keys``, in the order of ``items``) with the answers they keep."""
    if early is not None and early.shaped:  # chat: those answered came early, shaped
        answers = [early.shaped.get(d[0]) or shape(r) for d, r in zip(items, sent, strict=True)]
        mine = zip(items, sent, answers, strict=True)
        rest = [
            (d, a) for d, r, a in mine if d[0] not in early.ids and r.error_kind not in GIVEN_BACK
        ]
        _, _, left = left_out(items, sent)
        return rest, left, keys, answers
    if keys:  # matched to the answers kept, not to every item
        keys = [k for k, r in zip(keys, sent, strict=True) if r.error_kind not in GIVEN_BACK]
    kept, sent, left = left_out(items, sent)
    answers = [shape(r) for r in sent]
    return list(zip(kept, answers, strict=True)), left, keys, answers
