"""A continuous-batching engine that behaves like vLLM's scheduler, in simulated time.

At most ``max_num_seqs`` sequences decode at once; the rest wait in FIFO order. Each decode step
produces one token for every running sequence and costs ``step_base_ms + step_per_seq_ms *
running`` (divided by ``speed``), so a fuller batch is slower per step but faster per sequence,
as on a GPU. A request (one prompt or a list) answers when all its sequences have finished.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import time
from collections import deque
from collections.abc import Sequence

import msgspec

__all__ = ["LATENCY_BUCKETS_S", "EngineConfig", "EngineStopped", "Histogram", "SimEngine"]

# vLLM's bucket bounds for its request latency histograms.
LATENCY_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    """A Prometheus-style histogram: counts per upper bound, plus sum and count."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, as Prometheus exposes them."""
        out, total = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.buckets, strict=True):
            total += n
            out.append((bound, total))
        return out


class EngineStopped(Exception):
    """The engine was stopped (the endpoint "died") while a request was in it."""


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One simulated GPU server."""

    max_num_seqs: int = 256
    max_model_len: int = 4096
    speed: float = 1.0
    step_base_ms: float = 10.0
    step_per_seq_ms: float = 0.05
    # Answer at once, with no decode time: measures the cost of everything but the model.
    instant: bool = False
    # Prefill time per prompt token not found in the engine's prefix cache (0: free, as the
    # throughput scenarios assume; the agent scenarios set it).
    prefill_ms_per_token: float = 0.0
    # Every request as if it set vLLM's ignore_eos: exactly max_tokens tokens each.
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_model_len < 2:
            raise ValueError("max_num_seqs must be >= 1 and max_model_len >= 2")
        if self.speed <= 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.prefill_ms_per_token < 0:
            raise ValueError(f"prefill_ms_per_token must be >= 0, got {self.prefill_ms_per_token}")

    def step_s(self, running: int) -> float:
        """Wall time of one decode step with ``running`` sequences."""
        return (self.step_base_ms + self.step_per_seq_ms * running) / 1000.0 / self.speed

    def capacity_seqs_per_s(self, mean_tokens: float) -> float:
        """Upper bound on finished sequences per second: a full batch, every step."""
        if self.instant:
            return float("inf")
        return self.max_num_seqs / (mean_tokens * self.step_s(self.max_num_seqs))


class _Request:
    __slots__ = ("arrived", "future", "remaining")

    def __init__(self, n: int, future: asyncio.Future[None] | None) -> None:
        self.remaining = n
        self.future = future
        self.arrived = time.monotonic()


class SimEngine:
    """The scheduler loop of one simulated server. Call :meth:`start` inside a running loop."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._waiting: deque[tuple[int, _Request]] = deque()
        self._running: list[tuple[int, int, _Request]] = []  # heap of (finish_step, seq, req)
        self._seq = itertools.count()
        self._step = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.finished_seqs = 0
        self.aborted_seqs = 0
        # Of those, the sequences aborted while running: their decoded tokens thrown away.
        self.aborted_running = 0
        # The most sequences ever running at once: what an observer polling num_running on a
        # loaded machine may miss.
        self.peak_running = 0
        self.generated_tokens = 0
        # Per sequence, as vLLM's histograms of the same names: time spent waiting for a slot,
        # and from arrival to the last token.
        self.queue_time = Histogram()
        self.e2e_latency = Histogram()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")

    async def stop(self) -> None:
        """Stop stepping and fail every request still inside."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for req in [r for _, r in self._waiting] + [r for _, _, r in self._running]:
            if req.future is not None and not req.future.done():
                req.future.set_exception(EngineStopped())
        self._waiting.clear()
        self._running.clear()

    def load(self, lengths: Sequence[int]) -> None:
        """Queue sequences with no request waiting on them: for offline what-if runs of
        :meth:`step` with no event loop."""
        req = _Request(len(lengths), None)
        self._waiting.extend((max(1, n), req) for n in lengths)

    def submit(self, lengths: list[int]) -> asyncio.Future[None]:
        """Queue one request with a sequence of each length (tokens); the future resolves when
        all its sequences have finished."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.config.instant or not lengths:
            self.finished_seqs += len(lengths)
            self.generated_tokens += sum(lengths)
            future.set_result(None)
            return future
        req = _Request(len(lengths), future)
        self._waiting.extend((max(1, n), req) for n in lengths)
        self._wake.set()
        return future

    async def generate(self, lengths: list[int]) -> None:
        """Run one request to completion (see :meth:`submit`). Cancelled (its client went
        away), its sequences leave the engine at once, as vLLM aborts a disconnected request."""
        future = self.submit(lengths)
        try:
            await future
        except asyncio.CancelledError:
            self._abort(future)
            raise

    def _abort(self, future: asyncio.Future[None]) -> None:
        waiting = [x for x in self._waiting if x[1].future is not future]
        running = [x for x in self._running if x[2].future is not future]
        self.aborted_seqs += len(self._waiting) - len(waiting) + len(self._running) - len(running)
        self.aborted_running += len(self._running) - len(running)
        self._waiting = deque(waiting)
        heapq.heapify(running)
        self._running = running

    def admit(self) -> None:
        """Move waiting sequences into the running batch while there is room, FIFO."""
        now = time.monotonic() if self._waiting else 0.0
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            n, req = self._waiting.popleft()
            self.queue_time.observe(now - req.arrived)
            heapq.heappush(self._running, (self._step + n, next(self._seq), req))
        self.peak_running = max(self.peak_running, len(self._running))

    def step(self) -> int:
        """One decode step: admit, one token for every running sequence, retire finished ones.

        Returns how many sequences finished. The loop calls this on the simulated clock; tests
        call it directly.
        """
        self.admit()
        self._step += 1
        self.generated_tokens += len(self._running)
        finished = 0
        now = time.monotonic() if self._running else 0.0
        while self._running and self._running[0][0] <= self._step:
            _, _, req = heapq.heappop(self._running)
            self.e2e_latency.observe(now - req.arrived)
            finished += 1
            req.remaining -= 1
            if req.remaining == 0 and req.future is not None and not req.future.done():
                req.future.set_result(None)
        self.finished_seqs += finished
        return finished

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while True:
            self.admit()
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                next_t = loop.time()
                continue
            # Keep to the simulated clock even when the event loop is late, so capacity stays
            # what the config says; but never bank more than a second of lost steps.
            next_t = max(next_t, loop.time() - 1.0) + self.config.step_s(len(self._running))
            delay = next_t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.step()
