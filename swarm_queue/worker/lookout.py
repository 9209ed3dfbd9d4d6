"""The slots of one idle endpoint: one keeps looking for work, the others rest.

Every slot of an endpoint that finds nothing to take would otherwise poll Redis on its own,
each every ``poll_ms``: thirty-two slots of a thousand idle endpoints make Redis and the workers
busy with nothing. Instead one slot (the lookout) keeps polling and the others rest until it
finds work, then all of them step again: an endpoint's whole window is back in flight as soon as
work appears. A rest ends anyway after ``rest_s`` (the lookout may have stopped on an error), and
at once on :meth:`Lookout.wake` (the worker stops, a burst finds nothing left).

Across a worker's idle endpoints, :class:`Watch` does the same for the blocking read of a
job's new entries: one endpoint blocks (a blocking read holds a Redis connection for its whole
wait), the others wait for what it finds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Lookout", "Watch"]

T = TypeVar("T")


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


class Watch:
    """The idle endpoints of one worker process waiting for new entries of a job: one of them
    blocks on the job's stream, the others wait until its read returns (with entries, or
    after ``block_ms``: whichever comes first) and then look without blocking. A thousand
    idle endpoints hold one connection a job they wait on, not one each."""

    def __init__(self) -> None:
        self._reading: dict[str, asyncio.Event] = {}  # job -> set when its blocking read ends

    async def wait(self, job: str, block_ms: int, read: Callable[[int | None], Awaitable[T]]) -> T:
        """``read(block_ms)`` if no endpoint of this process is blocked on ``job``'s stream,
        else ``read(None)`` once that endpoint's read has ended (or ``block_ms`` passed)."""
        ended = self._reading.get(job)
        if ended is None:
            ended = self._reading[job] = asyncio.Event()
            try:
                return await read(block_ms)
            finally:
                del self._reading[job]
                ended.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), block_ms / 1000)
        return await read(None)
