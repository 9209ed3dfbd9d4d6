"""The requests of one endpoint's batches in flight: their job and priority, oldest first, and
which were cancelled on purpose and why. A batch of a more urgent job preempts the newest of
a lower priority of another workflow (:meth:`InFlight.preempt_below`); a job over has its
requests cut short (:meth:`InFlight.abandon`). The drain loop asks :meth:`InFlight.why` when a
request ends cancelled: on purpose, or a stop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from enum import StrEnum
from typing import Any

from swarm_queue.common.models import Result

__all__ = ["Cancelled", "InFlight", "Request"]

Request = asyncio.Task[list[Result]]


class Cancelled(StrEnum):
    """Why a request in flight was cancelled on purpose."""

    PREEMPTED = "preempted"  # for a batch of a more urgent job: its prompts go back
    ABANDONED = "abandoned"  # its job is over: its answers could change nothing


class InFlight:
    """One endpoint's requests in flight."""

    def __init__(self) -> None:
        # Each request's priority, job and family (its workflow job), oldest first.
        self._running: dict[Request, tuple[int, str, str]] = {}
        self._why: dict[Request, Cancelled] = {}

    def __len__(self) -> int:
        return len(self._running)

    def start(
        self,
        request: Coroutine[Any, Any, list[Result]],
        priority: int,
        job: str,
        family: str = "",
    ) -> Request:
        """Run ``request`` (of ``job``, at ``priority``; of workflow ``family``, the job's
        own name by default) as a task held here until removed."""
        task = asyncio.create_task(request)
        self._running[task] = (priority, job, family or job)
        return task

    def remove(self, request: Request) -> None:
        self._running.pop(request, None)
        self._why.pop(request, None)

    def why(self, request: Request | None) -> Cancelled | None:
        """Why ``request`` was cancelled on purpose (None: it was not, or there was none)."""
        return None if request is None else self._why.get(request)

    def top_priority(self) -> int | None:
        """The highest priority in flight (None: nothing is)."""
        return max((p for p, _, _ in self._running.values()), default=None)

    def preempt_below(self, priority: int, job: str, share: int, family: str = "") -> None:
        """A batch of ``job`` at ``priority`` starts: cancel the newest request in flight of a
        lower priority, if any, so the engine gives its slots to the urgent prompts now rather
        than after the lower ones (as vLLM's own priority scheduling does). The newest has done
        the least work; one for one, so the engine's load stays the same. (The window keeps
        the engine just full, and its gauges lag by a period: whether this batch would have
        found free slots cannot be known, so the trade is always made; it costs at most one
        lower batch's progress per urgent batch.) Only up to ``share``, the job's fair share
        of batches on this endpoint: the rest are for the other endpoints. Never a batch of
        the same workflow (``family``: an earlier step of it, say an agent's earlier turn):
        that work is needed as much, its decoded tokens would be thrown away and its prompts
        put back behind the later step's, which its continuous batch takes in beside it."""
        if sum(1 for _, j, _ in self._running.values() if j == job) >= share:
            return
        family = family or job
        lower = [
            r
            for r, (p, _, f) in self._running.items()
            if p < priority and f != family and r not in self._why
        ]
        if lower:
            self._cancel(lower[-1], Cancelled.PREEMPTED)

    def abandon(self, job: str) -> None:
        """``job`` is over: cut its requests short."""
        for request, (_, running_job, _) in list(self._running.items()):
            if running_job == job and request not in self._why:
                self._cancel(request, Cancelled.ABANDONED)

    def _cancel(self, request: Request, why: Cancelled) -> None:
        self._why[request] = why
        request.cancel()
