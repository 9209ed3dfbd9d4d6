"""The worker's one retry loop: every request to an endpoint goes through
:meth:`RetryLoop.send`, under its circuit, with one rule for when to give up (the attempts run
out, or the circuit opens). What is retried, what counts against the endpoint and when a list
is to be bisected are decided here and nowhere else."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from swarm_queue.common.errors import (
    EndpointError,
    EndpointMalformed,
    EndpointRejected,
    EndpointRetryable,
    EndpointServerError,
)
from swarm_queue.common.settings import Settings
from swarm_queue.worker.backend import Backend
from swarm_queue.worker.circuit import Circuit, GiveUp
from swarm_queue.worker.metrics import NO_METRICS, Metrics
from swarm_queue.worker.replies import CompletionUsage
from swarm_queue.worker.usage import Tally

__all__ = ["SPLIT_AFTER", "RetryLoop", "split_after"]

log = logging.getLogger("swarm.worker")

T = TypeVar("T")

# A list failed with HTTP 500 twice in a row is bisected (once may be a passing fault); a part
# of a bisected list, at its first. A prompt alone failed with it on every one of its attempts
# is blamed for it if the endpoint then answers its probe: fewer would blame prompts for an
# endpoint's passing 500s (seen: 2 of 400 failed at a 30% error rate, blamed after 3).
SPLIT_AFTER = 2


def split_after(items: int, prior: int) -> int:
    """After how many HTTP 500s in a row a list of ``items`` is bisected (0: a prompt alone
    is not); ``prior``: the requests that carried it before (a bisected part's)."""
    return 0 if items == 1 else 1 if prior else SPLIT_AFTER


class _Billed(Protocol):
    """An answer that may say what it cost."""

    @property
    def usage(self) -> CompletionUsage | None: ...


B = TypeVar("B", bound=_Billed)


class RetryLoop:
    """Requests to the endpoint of ``client``, retried with ``backoff(attempt)`` under
    ``circuit``; ``check`` is the endpoint's probe, asking for what failed (raises an
    :class:`EndpointError` while it cannot work): what tells a prompt's HTTP 500, or its
    answer left out, from the server's fault (None: every such failure is the server's)."""

    def __init__(
        self,
        client: Backend,
        settings: Settings,
        circuit: Circuit,
        backoff: Callable[[int], float],
        metrics: Metrics = NO_METRICS,
        check: Callable[[EndpointError], Awaitable[None]] | None = None,
    ) -> None:
        self.client, self.settings, self.circuit = client, settings, circuit
        self.backoff, self.metrics, self.check = backoff, metrics, check
        self.retries = 0

    async def send(
        self,
        job: str,
        call: Callable[[], Awaitable[B]],
        tally: Tally,
        prior: int,
        flaw: Callable[[B], EndpointMalformed | None] | None = None,
        *,
        split: int = 0,
    ) -> tuple[B, int]:
        """``call`` through :meth:`attempts`, its usage tallied; the attempts it took counted
        on from ``prior`` (a bisected half's). A refusal is the caller's to handle."""
        body, attempts = await self.attempts(job, call, flaw, split=split)
        if body.usage is not None:
            tally.add(body.usage)
        return body, attempts + prior

    async def attempts(
        self,
        job: str,
        call: Callable[[], Awaitable[T]],
        flaw: Callable[[T], EndpointMalformed | None] | None = None,
        *,
        split: int = 0,
    ) -> tuple[T, int]:
        """Run ``call`` (a request of ``job``) with the one retry policy of the worker; returns
        its value and the attempts it took. Gives up when the attempts run out or the circuit
        opens meanwhile. An answer with a ``flaw`` (choices left out) is used, but counts as
        the endpoint's failure: one that keeps leaving some out opens its circuit.

        An HTTP 500 may be one prompt's fault, so it does not count against the circuit: a
        list raises its ``split``-th in a row (0: it cannot be split; the caller bisects); a
        prompt alone is asked again, and when its attempts run out the endpoint's probe tells
        whose fault it is: the server's (the probe fails: :class:`GiveUp`, its circuit open)
        or the prompt's (it passes: the :class:`EndpointServerError` is raised, the prompt's
        to fail, or to try elsewhere)."""
        circuit, metrics, label = self.circuit, self.metrics, self.client.label
        attempt, lost = 0, False
        while True:
            if circuit.is_open:
                raise GiveUp(EndpointRetryable(label, "circuit open"), lost=lost)
            attempt += 1
            sent = time.monotonic()
            try:
                value = await circuit.unless_open(call())
            except EndpointRetryable as exc:
                metrics.request(job, label, time.monotonic() - sent, "retryable")
                lost = lost or exc.lost
                server = exc if isinstance(exc, EndpointServerError) and self.check else None
                if server is not None:
                    circuit.noted(server)
                else:
                    circuit.failed(exc)
                exc.tries = attempt
                if split and server is not None and attempt >= split:
                    raise
                last = attempt >= self.settings.max_attempts
                if server and not split and last and not circuit.is_open:
                    await self._blame(server)
                if attempt >= self.settings.max_attempts or circuit.is_open:
                    raise GiveUp(exc, lost=lost) from None
                self.retries += 1
                metrics.retry(job, label)
                delay = self.backoff(attempt - 1)
                log.debug("%s: %s; retry %d in %.2f s", label, exc, attempt, delay)
                await circuit.opened_within(delay)  # wakes early if the circuit opens
                continue
            except EndpointRejected:
                metrics.request(job, label, time.monotonic() - sent, "rejected")
                raise
            except EndpointError:  # unusable: a wrong key, a model not served
                metrics.request(job, label, time.monotonic() - sent, "unusable")
                raise
            metrics.request(job, label, time.monotonic() - sent, "ok")
            flawed = flaw(value) if flaw is not None else None
            if flawed is None:
                circuit.succeeded()
            elif flawed.partial or (not split and self.check):
                # The others answered whole, or a prompt alone: maybe the prompts' fault.
                # Each left out is asked again alone; on its last attempt the probe decides.
                if flawed.partial:
                    circuit.succeeded()
                circuit.noted(flawed)
            else:
                circuit.failed(flawed)
            return value, attempt

    async def _blame(self, exc: EndpointServerError) -> None:
        """A prompt alone kept failing with ``exc``: raise it if the endpoint answers its
        probe (the prompt's fault), else open the circuit (the server's)."""
        if await self.prompts_fault(exc):
            raise exc

    async def prompts_fault(self, failure: EndpointError) -> bool:
        """Whether a prompt alone that kept failing with ``failure`` is at fault: the
        endpoint answers its probe, which asks for what failed (a malformed answer's samples,
        its route). If the probe fails, the endpoint is, and its circuit opens."""
        if self.check is None:
            return True
        try:
            await self.check(failure)
        except EndpointError as probe:
            self.circuit.trip(probe)
            return False
        return True
