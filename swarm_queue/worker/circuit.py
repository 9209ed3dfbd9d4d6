"""One endpoint's circuit breaker: closed while its requests succeed, open after repeated
failures, closed again by one prober once the endpoint really answers.

While the circuit is open the endpoint takes no work, and every request in flight there gives
up at once (its batch released for other endpoints): waiting out each request's timeout on a
dead or stalled node would hold its batches for minutes. One prober per endpoint, shared by all
its slots: slots taking turns to probe a stalled endpoint once kept a ``--burst`` worker alive
a probe timeout per slot after its work was done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from swarm_queue.common.errors import (
    EndpointError,
    EndpointMalformed,
    EndpointRetryable,
    EndpointUnusable,
)

__all__ = ["Circuit", "GiveUp"]

log = logging.getLogger("swarm.worker")

T = TypeVar("T")


class GiveUp(Exception):
    """This endpoint will not finish the request (attempts spent, or its circuit opened):
    hand the batch to another. ``lost``: one of its attempts was lost in the server (see
    :class:`~common.errors.EndpointRetryable`): a death of its prompts."""

    def __init__(self, cause: EndpointError, *, lost: bool = False) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.lost = lost


class Circuit:
    """The circuit of the endpoint ``label``: ``threshold`` consecutive failed requests open
    it. A drain loop starts with :meth:`hold`, so no work is taken before the endpoint has
    answered once (a vLLM still loading its model)."""

    def __init__(self, label: str, threshold: int) -> None:
        self.label = label
        self.threshold = threshold
        self._open = asyncio.Event()
        self._failures = 0  # consecutive failed requests, all slots together
        self._prober: asyncio.Task[None] | None = None
        self.was_ready = False  # has answered a probe at least once
        self.probed = False  # a probe has run (answered or not)
        # Since when (monotonic) an endpoint that was ready has failed every probe: it died.
        self.down_since: float | None = None
        # Why the endpoint can take no work at all (wrong key, no OpenAI server), for good.
        self.broken: str | None = None
        self.errors = 0  # failed requests, retried or given up
        self.last_error = ""
        # The endpoint's last failure, if it was an answer that could not be used (it is up,
        # and lies): what its probes check again, and what ends work no other endpoint takes.
        self.malformed: EndpointMalformed | None = None
        # The circuit was opened by a request lost in the server (it hung or died under it):
        # the requests it then cancels were lost there too (see EndpointRetryable.lost).
        self.lost = False

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def state(self) -> str:
        """``broken``, ``waiting`` (never answered yet), ``open`` or ``closed``."""
        if self.broken is not None:
            return "broken"
        if self._open.is_set():
            return "open" if self.was_ready else "waiting"
        return "closed"

    def hold(self) -> None:
        """Open, quietly: no failure yet, the endpoint just has to answer before taking work."""
        self._open.set()

    def failed(self, exc: EndpointError) -> None:
        """A request failed; the last of ``threshold`` in a row opens the circuit."""
        self.errors += 1
        self.last_error = str(exc)
        self.malformed = exc if isinstance(exc, EndpointMalformed) else None
        self._failures += 1
        if self._failures >= self.threshold:
            self.trip(exc)

    def noted(self, exc: EndpointError) -> None:
        """A request failed in a way that may be its content's fault (an HTTP 500): shown,
        but not counted towards opening the circuit (the probe decides, see worker.retry)."""
        self.errors += 1
        self.last_error = str(exc)

    def succeeded(self) -> None:
        self._failures = 0
        self.malformed = None

    def trip(self, cause: EndpointError) -> None:
        """Open the circuit: requests in flight give up, no work is taken, probing starts."""
        if not self._open.is_set():
            self.lost = isinstance(cause, EndpointRetryable) and cause.lost
            log.warning(
                "%s: circuit open after repeated failures (%s); probing the endpoint",
                self.label,
                cause,
            )
            self._open.set()

    async def opened_within(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early if the circuit opens; True if it is open."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), timeout=seconds)
        return self._open.is_set()

    async def unless_open(self, call: Awaitable[T]) -> T:
        """``call``'s value; but once the circuit opens, its request is cancelled and
        :class:`GiveUp` raised at once."""
        task = asyncio.ensure_future(call)
        opened = asyncio.ensure_future(self._open.wait())
        try:
            await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise GiveUp(EndpointRetryable(self.label, "circuit open"), lost=self.lost)
        return task.result()

    async def until_closed(
        self,
        probe: Callable[[], Awaitable[None]],
        *,
        give_up: Callable[[], Awaitable[bool]],
        sleep: Callable[[float], Awaitable[bool]],
        backoff: Callable[[int], float],
    ) -> None:
        """Wait for the endpoint's one prober, started by the first caller: ``probe`` (raising
        an EndpointError while the endpoint cannot work) is tried with ``backoff`` until it
        passes; it stops early when ``give_up`` says so after a failed probe, or ``sleep``
        says the worker is stopping."""

        async def probing() -> None:
            attempt = 0
            while self._open.is_set():
                try:
                    await probe()
                except EndpointUnusable as exc:
                    self.broken = str(exc)
                    log.error("%s: endpoint unusable, no work taken from it: %s", self.label, exc)
                    return
                except EndpointError as exc:
                    self.probed = True
                    self.last_error = str(exc)
                    if self.was_ready and self.down_since is None:
                        self.down_since = time.monotonic()
                    self.malformed = exc if isinstance(exc, EndpointMalformed) else None
                    # Probe first, then ask whether to give up: a healthy endpoint at start
                    # goes straight to work, whatever the job list looks like yet.
                    if await give_up():
                        return
                    attempt += 1
                    if await sleep(backoff(attempt)):
                        return
                    continue
                self.probed = self.was_ready = True
                log.info("%s: endpoint ready; taking work", self.label)
                self.down_since = None
                self._failures = 0
                self.malformed = None
                self._open.clear()

        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(probing(), name="swarm-probe")
        await asyncio.shield(self._prober)

    async def close(self) -> None:
        """Stop the prober, if one runs (the worker is stopping)."""
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
