"""The slots of one idle endpoint: one keeps looking for work, the others rest.

Every slot of an endpoint that finds nothing to take would otherwise poll Redis on its own,
each every ``poll_ms``: thirty-two slots of a thousand idle endpoints make Redis and the workers
busy with nothing. Instead one slot (the lookout) keeps polling and the others rest until it
finds work, then all of them step again: an endpoint's whole window is back in flight as soon as
work appears. A rest ends anyway after ``rest_s`` (the lookout may have stopped on an error), and
at once on :meth:`Lookout.wake` (the worker stops, a burst finds nothing left).
"""

from __future__ import annotations

import asyncio

__all__ = ["Lookout"]


class Lookout:
    """Which of an endpoint's slots looks for work while there is none; the others rest."""

    def __init__(self, rest_s: float) -> None:
        self.rest_s = rest_s
        self._lookout: int | None = None  # the slot that keeps looking
        self._found = asyncio.Event()  # replaced on every wake: a waiter holds its own
        self.resting = 0

    async def nothing_found(self, slot: int) -> None:
        """Slot ``slot`` found nothing to take: return at once if it is the lookout (or
        becomes it: there was none); else rest until work is found, a wake, or ``rest_s``,
        after which it takes over looking itself."""
        if self._lookout in (None, slot):
            self._lookout = slot
            return
        found = self._found
        self.resting += 1
        try:
            await asyncio.wait_for(found.wait(), self.rest_s)
        except TimeoutError:
            self._lookout = slot  # the lookout went quiet: look in its place
        finally:
            self.resting -= 1

    def found(self, slot: int) -> None:
        """Slot ``slot`` took work: if it was looking, wake the resting slots (more may wait)."""
        if self._lookout == slot:
            self._lookout = None
            self.wake()

    def wake(self) -> None:
        """End every rest now."""
        if self.resting:
            self._found.set()
            self._found = asyncio.Event()

    def leave(self, slot: int) -> None:
        """Slot ``slot`` stops running: another slot looks in its place."""
        if self._lookout == slot:
            self._lookout = None
            self.wake()
