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
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Lookout", "Watch"]

T = TypeVar("T")

# How late a blocking read's reply may be past its wait before the endpoints waiting on it
# look for themselves (a Redis that hangs: the reader's own command times out later).
LATE_S = 1.0


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
    blocks on the job's stream, the others wait until its read returns and then look without
    blocking, one at a time, if it found entries, or take it that there are none if it found
    none. A thousand idle endpoints hold one connection a job they wait on, not one each,
    and make one read a poll between them, not one each (a look of each after every poll
    was, at a thousand endpoints, most of what Redis did: scenario 9)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._reading: dict[str, _Read] = {}  # job -> its blocking read under way
        self._quiet_until: dict[str, float] = {}  # job -> when its last empty read is stale
        self._turns: dict[str, asyncio.Lock] = {}  # job -> its looks without blocking
        self._empty_at: dict[str, float] = {}  # job -> when its last empty look was sent

    def quiet(self, job: str) -> bool:
        """Whether a look for ``job``'s new entries would find none: a blocking read of them
        is under way in this process (new entries end it first), or one found none within
        its own wait (entries come meanwhile: the next blocking read returns them at once)."""
        return job in self._reading or self._quiet_until.get(job, 0.0) > self._clock()

    def clock(self) -> float:
        return self._clock()

    def turn(self, job: str) -> asyncio.Lock:
        """Held by a look without blocking for ``job``'s new entries: the process's endpoints
        look one at a time, each finding what the last left (fifty walks looking at once
        after a read found entries found none but one: scenario 9's most frequent command)."""
        return self._turns.setdefault(job, asyncio.Lock())

    def none_since(self, job: str, asked: float) -> bool:
        """Whether a look for ``job``'s new entries sent at or after ``asked`` found none (a
        look asked for then would find none either)."""
        return self._empty_at.get(job, -math.inf) >= asked

    def found_none(self, job: str, sent: float, block_ms: int | None = None) -> None:
        """A look for ``job``'s new entries sent at ``sent`` found none. With ``block_ms`` (the
        job the process's blocking read waits on), the next looks are that read's for as long
        (every slot that finds nothing waits on it), not each free slot's own: at scenario 9,
        ten empty looks a batch while a job's queue ran dry as it filled."""
        self._empty_at[job] = max(sent, self._empty_at.get(job, -math.inf))
        if block_ms is not None:
            self._quiet_until[job] = self._clock() + block_ms / 1000

    async def wait(
        self, job: str, block_ms: int, read: Callable[[int | None], Awaitable[T | None]]
    ) -> T | None:
        """``read(block_ms)`` if no endpoint of this process is blocked on ``job``'s stream,
        else, once that endpoint's read has ended, ``read(None)`` in turn with the others
        waiting if it found entries (more may wait) until one finds none, and None if it
        found none; ``read(None)`` too if it has not ended within ``block_ms`` and
        :data:`LATE_S`."""
        reading = self._reading.get(job)
        if reading is None:
            reading = self._reading[job] = _Read()
            try:
                got = await read(block_ms)
                reading.found = got is not None
                return got
            finally:
                del self._reading[job]
                if reading.found:
                    self._quiet_until.pop(job, None)
                else:
                    self._quiet_until[job] = self._clock() + block_ms / 1000
                reading.ended.set()
        try:
            # (Its reply comes after its wait: waiting as long only would end first each time.)
            await asyncio.wait_for(reading.ended.wait(), block_ms / 1000 + LATE_S)
        except TimeoutError:
            return await read(None)
        # One look at a time, each finding what the last left; the first to find none ends
        # the looks (all fifty endpoints of a worker looking at once, when the read had
        # found some, found nothing but for one or two: most of the reads at scenario 9).
        async with reading.turn:
            if not reading.found:
                return None
            got = await read(None)
            if got is None:
                reading.found = False
                self._quiet_until[job] = self._clock() + block_ms / 1000
            return got


class _Read:
    """A blocking read under way: whether entries may be left to take (unknown: as if
    there were), once ``ended``; the waiters' turns to look."""

    __slots__ = ("ended", "found", "turn")

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.found = True
        self.turn = asyncio.Lock()
