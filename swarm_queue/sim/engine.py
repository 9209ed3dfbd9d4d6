"""A continuous-batching engine that behaves like vLLM's scheduler, in simulated time.

At most ``max_num_seqs`` sequences run at once; the rest wait in FIFO order. Each engine step
processes at most ``max_num_batched_tokens`` tokens, as vLLM's chunked prefill does: first one
token for every decoding sequence, then chunks of the prompts still to prefill (those running
first, then new ones admitted while budget and room remain), oldest first. A prompt's cached
leading blocks cost nothing (the server looks them up: see :mod:`sim.prefix`), and a prompt
wholly cached still computes its last token. The step that finishes a prompt's prefill gives
its first token. A step costs ``step_base_ms + step_per_seq_ms * running +
prefill_ms_per_token * prefilled`` (divided by ``speed``): a fuller batch is slower per step but
faster per sequence, and a prefix computed again costs the whole fleet's time, as on a GPU.
With ``prefill_ms_per_token`` 0 (the default) prefill is free and takes no budget: sequences
decode from their admission, as the throughput scenarios assume. A request (one prompt or a
list) answers when all its sequences have finished.
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
    # Step time per prompt token prefilled (not found in the engine's prefix cache). 0: prefill
    # is free and takes no step budget, as the throughput scenarios assume.
    prefill_ms_per_token: float = 0.0
    # The tokens one step processes at most, decode and prefill together (vLLM's default for
    # its API server on a GPU under 70 GiB).
    max_num_batched_tokens: int = 2048
    # The prompt blocks (16 tokens each) its prefix cache keeps, least recently used out.
    prefix_cache_blocks: int = 16_384
    # Every request as if it set vLLM's ignore_eos: exactly max_tokens tokens each.
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_model_len < 2:
            raise ValueError("max_num_seqs must be >= 1 and max_model_len >= 2")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(  # vLLM's words
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than "
                f"or equal to max_num_seqs ({self.max_num_seqs})."
            )
        if self.speed <= 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.prefill_ms_per_token < 0:
            raise ValueError(f"prefill_ms_per_token must be >= 0, got {self.prefill_ms_per_token}")

    def step_s(self, running: int, prefilled: int = 0) -> float:
        """Wall time of one step with ``running`` sequences, ``prefilled`` prompt tokens."""
        ms = self.step_base_ms + self.step_per_seq_ms * running
        return (ms + self.prefill_ms_per_token * prefilled) / 1000.0 / self.speed

    @property
    def charges_prefill(self) -> bool:
        """Whether prompts are prefilled in steps (else free, decoding from admission)."""
        return self.prefill_ms_per_token > 0 and not self.instant

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


class _Seq:
    """A sequence not yet decoding: its prompt tokens left to prefill, its answer's length."""

    __slots__ = ("prefill", "req", "tokens")

    def __init__(self, prefill: int, tokens: int, req: _Request) -> None:
        self.prefill, self.tokens, self.req = prefill, tokens, req


class SimEngine:
    """The scheduler loop of one simulated server. Call :meth:`start` inside a running loop."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._waiting: deque[_Seq] = deque()
        self._prefilling: deque[_Seq] = deque()  # running, their prompts not yet all computed
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
        self.prefilled_tokens = 0  # prompt tokens computed (not found in the prefix cache)
        # Per sequence, as vLLM's histograms of the same names: time spent waiting for a slot,
        # and from arrival to the last token.
        self.queue_time = Histogram()
        self.e2e_latency = Histogram()

    @property
    def num_running(self) -> int:
        return len(self._running) + len(self._prefilling)

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
        inside = [q.req for q in (*self._waiting, *self._prefilling)]
        for req in inside + [r for _, _, r in self._running]:
            if req.future is not None and not req.future.done():
                req.future.set_exception(EngineStopped())
        self._waiting.clear()
        self._prefilling.clear()
        self._running.clear()

    def _queue(self, lengths: Sequence[int], prefills: Sequence[int], req: _Request) -> None:
        charged = self.config.charges_prefill
        for k, n in enumerate(lengths):
            # A prompt wholly cached still computes its last token.
            prefill = max(1, prefills[k]) if charged and k < len(prefills) else 0
            self._waiting.append(_Seq(prefill, max(1, n), req))

    def load(self, lengths: Sequence[int], prefills: Sequence[int] = ()) -> None:
        """Queue sequences with no request waiting on them: for offline what-if runs of
        :meth:`step` with no event loop."""
        self._queue(lengths, prefills, _Request(len(lengths), None))

    def submit(self, lengths: list[int], prefills: Sequence[int] = ()) -> asyncio.Future[None]:
        """Queue one request with a sequence of each length (tokens), each after prefilling
        its ``prefills`` (uncached prompt tokens; none: free); the future resolves when all
        its sequences have finished."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.config.instant or not lengths:
            self.finished_seqs += len(lengths)
            self.generated_tokens += sum(lengths)
            future.set_result(None)
            return future
        self._queue(lengths, prefills, _Request(len(lengths), future))
        self._wake.set()
        return future

    async def generate(self, lengths: list[int], prefills: Sequence[int] = ()) -> None:
        """Run one request to completion (see :meth:`submit`). Cancelled (its client went
        away), its sequences leave the engine at once, as vLLM aborts a disconnected request."""
        future = self.submit(lengths, prefills)
        try:
            await future
        except asyncio.CancelledError:
            self._abort(future)
            raise

    def _abort(self, future: asyncio.Future[None]) -> None:
        waiting = [q for q in self._waiting if q.req.future is not future]
        prefilling = [q for q in self._prefilling if q.req.future is not future]
        running = [x for x in self._running if x[2].future is not future]
        gone = len(self._prefilling) - len(prefilling) + len(self._running) - len(running)
        self.aborted_seqs += len(self._waiting) - len(waiting) + gone
        self.aborted_running += gone
        self._waiting, self._prefilling = deque(waiting), deque(prefilling)
        heapq.heapify(running)
        self._running = running

    def _decode(self, q: _Seq) -> None:
        """``q`` decodes from this step: its first token is this step's."""
        heapq.heappush(self._running, (self._step + q.tokens, next(self._seq), q.req))

    def admit(self) -> None:
        """Move waiting sequences into the running batch while there is room, FIFO (with
        prefill charged, while this step's budget has a token left for them too)."""
        now = time.monotonic() if self._waiting else 0.0
        room = self.config.max_num_seqs - self.num_running
        budget = self._budget() - sum(q.prefill for q in self._prefilling)
        while self._waiting and room > 0 and (budget > 0 or not self.config.charges_prefill):
            q = self._waiting.popleft()
            self.queue_time.observe(now - q.req.arrived)
            room -= 1
            if q.prefill:
                budget -= q.prefill
                self._prefilling.append(q)
            else:
                self._decode(q)
        self.peak_running = max(self.peak_running, self.num_running)

    def _budget(self) -> int:
        """This step's tokens for prefill: the budget left once every decoding sequence has
        its token."""
        return self.config.max_num_batched_tokens - len(self._running)

    def _planned(self) -> int:
        """The prompt tokens the next step prefills."""
        return min(max(0, self._budget()), sum(q.prefill for q in self._prefilling))

    def step(self) -> int:
        """One step: admit, one token for every decoding sequence, the prefill chunks the
        budget leaves room for, retire finished sequences.

        Returns how many sequences finished. The loop calls this on the simulated clock; tests
        call it directly.
        """
        self.admit()
        budget = max(0, self._budget())
        self._step += 1
        self.generated_tokens += len(self._running)
        while self._prefilling and budget > 0:
            q = self._prefilling[0]
            chunk = min(q.prefill, budget)
            q.prefill -= chunk
            budget -= chunk
            self.prefilled_tokens += chunk
            if q.prefill:
                break  # the budget is spent mid-prompt: its next chunk goes next step
            self._prefilling.popleft()
            self.generated_tokens += 1  # the step that ends its prefill samples a token
            heapq.heappush(self._running, (self._step + q.tokens - 1, next(self._seq), q.req))
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
            if not self.num_running:
                self._wake.clear()
                await self._wake.wait()
                next_t = loop.time()
                continue
            # Keep to the simulated clock even when the event loop is late, so capacity stays
            # what the config says; but never bank more than a second of lost steps.
            cost = self.config.step_s(self.num_running, self._planned())
            next_t = max(next_t, loop.time() - 1.0) + cost
            delay = next_t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.step()
