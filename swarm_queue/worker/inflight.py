"""The requests of one endpoint's batches in flight: their job and priority, oldest first, and
which were cancelled on purpose and why. A batch of a more urgent job preempts the newest of
a lower priority of another workflow (:meth:`InFlight.preempt_below`); a job over has its
requests cut short (:meth:`InFlight.abandon`); an engine with agents' turns waiting in it
hands the newest batch of them on (:meth:`InFlight.to_hand_on`). The drain loop asks
:meth:`InFlight.why` when a request ends cancelled: on purpose, or a stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from enum import StrEnum
from typing import Any, NamedTuple

from swarm_queue.common.keys import group_of
from swarm_queue.common.models import Result

__all__ = ["Answers", "Cancelled", "InFlight", "Pace", "Request"]

Request = asyncio.Task[list[Result]]


class Cancelled(StrEnum):
    """Why a request in flight was cancelled on purpose."""

    PREEMPTED = "preempted"  # for a batch of a more urgent job: its prompts go back
    ABANDONED = "abandoned"  # its job is over: its answers could change nothing
    HANDED_ON = "handed on"  # waiting in a busy engine: to the open lane, for an idle one


class Pace:
    """An endpoint's paces, as moving averages of its chat answers' seconds a completion
    token: from each request's start to its answer, its engine's queue included
    (``s_per_token``), and its decoding alone (``decode_s_per_token``: the time between two
    answers of one batch over the tokens between them, the requests having started
    together). What an endpoint with nothing to do is compared by before a busy one hands it
    turns: waiting ones by the first, begun ones by the second."""

    __slots__ = ("decode_s_per_token", "s_per_token")

    def __init__(self) -> None:
        self.s_per_token: float | None = None
        self.decode_s_per_token: float | None = None

    def note(self, seconds: float, tokens: int) -> None:
        if tokens <= 0:
            return
        self.s_per_token = _average(self.s_per_token, seconds / tokens)

    def note_decode(self, seconds: float, tokens: int) -> None:
        if tokens >= DECODE_MIN_TOKENS:
            self.decode_s_per_token = _average(self.decode_s_per_token, seconds / tokens)


# Two answers of a batch this many tokens apart or more time the engine's decoding.
DECODE_MIN_TOKENS = 4


def _average(mean: float | None, x: float) -> float:
    return x if mean is None else 0.9 * mean + 0.1 * x


class Answers:
    """How many of a batch's prompts have been answered so far (counted as they come), each
    answer's time noted in the endpoint's ``pace``, and the decoding between the first
    answer and each later one."""

    __slots__ = ("first", "n", "pace", "t0")

    def __init__(self, pace: Pace | None = None) -> None:
        self.n = 0
        self.pace = pace
        self.t0 = time.monotonic()
        self.first: tuple[float, int] | None = None  # the first answer's time and tokens

    def add(self, result: Result) -> None:
        self.n += 1
        if self.pace is None or result.usage is None:
            return
        now, tokens = time.monotonic(), result.usage.completion_tokens
        self.pace.note(now - self.t0, tokens)
        if self.first is None:
            self.first = (now, tokens)
        else:
            self.pace.note_decode(now - self.first[0], tokens - self.first[1])


class _Held(NamedTuple):
    """What is kept of a request in flight: its priority, job and the job's group, and, for
    a batch that may be handed on, its size and its answers so far."""

    priority: int
    job: str
    group: str
    size: int
    answers: Answers | None


class InFlight:
    """One endpoint's requests in flight."""

    def __init__(self) -> None:
        # Each request's priority, job and group (see common.keys.group_of), oldest first.
        self._running: dict[Request, _Held] = {}
        self._why: dict[Request, Cancelled] = {}

    def __len__(self) -> int:
        return len(self._running)

    def start(
        self,
        request: Coroutine[Any, Any, list[Result]],
        priority: int,
        job: str,
        *,
        size: int = 0,
        answers: Answers | None = None,
    ) -> Request:
        """Run ``request`` (of ``job``, at ``priority``) as a task held here until removed. A
        batch of ``size`` prompts whose ``answers`` are counted may be handed on
        (:meth:`hand_on`)."""
        task = asyncio.create_task(request)
        self._running[task] = _Held(priority, job, group_of(job)[0], size, answers)
        return task

    def remove(self, request: Request) -> None:
        self._running.pop(request, None)
        self._why.pop(request, None)

    def why(self, request: Request | None) -> Cancelled | None:
        """Why ``request`` was cancelled on purpose (None: it was not, or there was none)."""
        return None if request is None else self._why.get(request)

    def top_priority(self) -> int | None:
        """The highest priority in flight (None: nothing is)."""
        return max((h.priority for h in self._running.values()), default=None)

    def preempt_below(self, priority: int, job: str, share: int) -> None:
        """A batch of ``job`` at ``priority`` starts: cancel the newest request in flight of a
        lower priority, if any, so the engine gives its slots to the urgent prompts now rather
        than after the lower ones (as vLLM's own priority scheduling does). The newest has done
        the least work; one for one, so the engine's load stays the same. (The window keeps
        the engine just full, and its gauges lag by a period: whether this batch would have
        found free slots cannot be known, so the trade is always made; it costs at most one
        lower batch's progress per urgent batch.) Only up to ``share``, the job's fair share
        of batches on this endpoint: the rest are for the other endpoints. Never a batch of
        the same group (common.keys.group_of: an earlier step of a workflow, say an agent's
        earlier turn): that work is needed as much, its decoded tokens would be thrown away
        and its prompts put back behind the later step's, which its continuous batch takes
        in beside it."""
        if sum(1 for h in self._running.values() if h.job == job) >= share:
            return
        group = group_of(job)[0]
        lower = [
            r
            for r, h in self._running.items()
            if h.priority < priority and h.group != group and r not in self._why
        ]
        if lower:
            self._cancel(lower[-1], Cancelled.PREEMPTED)

    def abandon(self, job: str) -> None:
        """``job`` is over: cut its requests short."""
        for request, held in list(self._running.items()):
            if held.job == job and request not in self._why:
                self._cancel(request, Cancelled.ABANDONED)

    def to_hand_on(self, waiting: int, young_s: float = 0.0) -> tuple[Request, str, bool] | None:
        """With ``waiting`` sequences queued in the engine: the newest batch that may be
        handed on, its job, and whether it may have begun; if none of its prompts is
        answered yet and it is no larger than that. An engine serves requests of one
        priority first come, first served, so the newest ``waiting`` have not started:
        handing them on throws no decoded token away. With ``young_s``, also one sent less
        than that ago, begun or not (what it decoded is thrown away: at most ``young_s`` of
        tokens each)."""
        now = time.monotonic()
        for request, held in reversed(self._running.items()):
            if held.answers is None or request in self._why:
                continue
            if held.answers.n == 0 and held.size > 0:
                if held.size <= waiting:
                    return request, held.job, False
                if now - held.answers.t0 < young_s:
                    return request, held.job, True
            return None  # the newest has begun (or is too large): the older ones have too
        return None

    def hand_on(self, request: Request) -> int:
        """Cut ``request`` short to hand its prompts on (see :meth:`to_hand_on`); how many it
        held (0: it is no longer in flight)."""
        held = self._running.get(request)
        if held is None or request in self._why:
            return 0
        self._cancel(request, Cancelled.HANDED_ON)
        return held.size

    def _cancel(self, request: Request, why: Cancelled) -> None:
        self._why[request] = why
        request.cancel()
