"""An endpoint's in-flight window: how many batches it has in flight at once, following
vLLM's scheduler gauges so the engine stays full without queuing far ahead.

A list request holds its slots until its longest sequence ends, so how much must be in flight
to keep an engine full depends on the output lengths: the window follows the gauges rather
than a constant. It opens small (a slow start: the first results come back at an idle engine's
pace) and falls back to a fixed window when the endpoint shows no gauges (another server, a
proxy). docs/BENCHMARKS.md, "Defaults, and why", has the measurements behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from swarm_queue.common.settings import Settings
from swarm_queue.worker.replies import Load

__all__ = ["ADAPT_START", "Window", "follow_load", "next_window"]

log = logging.getLogger("swarm.worker")

# The adaptive window opens with this many requests in flight and never goes below it.
ADAPT_START = 2
# With nothing in flight the gauges are read only every this many periods (an idle endpoint's
# /metrics is most of what an idle worker costs); the first batch taken brings the next look.
IDLE_LOOK_EVERY = 8


def next_window(
    window: int,
    load: Load,
    *,
    busy: bool,
    lo: int,
    hi: int,
    batch: int,
    ramping: bool = False,
    answering: bool = False,
    in_use: int | None = None,
) -> int:
    """The next in-flight window of an endpoint, from vLLM's scheduler gauges.

    Nothing waiting while the engine runs and every slot of the window is busy means the engine
    has idle capacity (a list request holds its slots until its longest sequence ends, so
    batches in flight overstate the sequences running): one more batch, or twice as many while
    ``ramping`` (a slow start, so the first results come back at an idle engine's pace and the
    job does not open with a queue). An engine seen running nothing is stalled, not short of
    batches, unless it is ``answering`` (results came back since the last look: it is merely
    faster than the gauges can show). One batch waiting is what keeps the engine full as a batch
    ends; more is queuing ahead, which only delays results and lengthens a job's tail: shed half
    the surplus batches beyond one. Requests in flight are never cancelled, so the window closes
    as they finish: the surplus is counted from the ``in_use`` batches (those the queue shows),
    not again from a window already made smaller.
    """
    if load.waiting > batch:
        surplus = -(-int(load.waiting - batch) // batch)
        held = window if in_use is None else max(window, in_use)
        return max(lo, min(window, held - max(1, surplus // 2)))
    if load.waiting <= 0 and (load.running > 0 or answering) and busy:
        return min(hi, window * 2 if ramping else window + 1)
    return window


class Window:
    """A resizable gate: at most ``size`` slots hold a token (have a batch in flight) at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self._cond = asyncio.Condition()

    async def resize(self, size: int) -> None:
        async with self._cond:
            self.size = size
            self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def token(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_use < self.size)
            self.in_use += 1
        try:
            yield
        finally:
            async with self._cond:
                self.in_use -= 1
                self._cond.notify_all()


async def follow_load(
    window: Window,
    load: Callable[[], Awaitable[Load | None]],
    *,
    answered: Callable[[], int],
    in_flight: Callable[[], int],
    sleep: Callable[[float], Awaitable[bool]],
    hi: int,
    settings: Settings,
    label: str,
) -> None:
    """Resize ``window`` every ``adapt_period_s`` from the endpoint's ``load`` (see
    :func:`next_window`), up to ``hi``; ``answered()`` counts the prompts done so far (results
    coming back), ``in_flight()`` the requests in flight now, ``sleep`` returns True when the
    worker stops. With no request in flight, look only every :data:`IDLE_LOOK_EVERY` periods
    (not the window's tokens: a slot polling Redis for work holds one). With no gauges to read
    three times running, fall back to the fixed window and return."""
    misses = 0
    ramping = True
    seen = answered()
    # Past the ramp, the window grows only on nothing waiting seen twice running: batches that
    # end together leave a gap of one round trip, which is not room for one more.
    wanted = False
    skipped = 0
    while True:
        if in_flight() == 0 and skipped < IDLE_LOOK_EVERY - 1:
            skipped += 1
            if await sleep(settings.adapt_period_s):
                return
            continue
        skipped = 0
        gauges = await load()
        if gauges is None:
            misses += 1
            if misses >= 3:
                log.info(
                    "%s: no vLLM gauges at /metrics; keeping %d requests in flight",
                    label,
                    settings.inflight,
                )
                await window.resize(settings.inflight)
                return
        else:
            misses = 0
            size = next_window(
                window.size,
                gauges,
                busy=window.in_use >= window.size,
                lo=ADAPT_START,
                hi=hi,
                batch=settings.batch_size,
                ramping=ramping,
                answering=answered() > seen,
                in_use=window.in_use,
            )
            if size > window.size and not ramping:
                size, wanted = (size if wanted else window.size), True
            else:
                wanted = False
            ramping = ramping and gauges.waiting <= 0
            seen = answered()
            if size != window.size:
                await window.resize(size)
        if await sleep(settings.adapt_period_s):
            return
