"""Admission control: a producer queues prompts only while Redis keeps room for their answers.

A Redis with a ``maxmemory`` filled with queued prompts had no room left for their answers: no
commit landed, ``swarm-collect --evict`` had nothing to free, and the job made no progress.
Two things prevent it. A commit frees its prompts before it writes their answers, so computed
answers always land (see ``lua/commit.lua``). And a producer waits before each chunk until the
Redis server holds, besides what it holds now, the chunk and an answer for every prompt of the
job still unanswered, within :data:`SHARE` of ``maxmemory``: the job's default window, derived
from ``maxmemory`` and the size of its answers (measured once it has some, bounded from
``max_tokens`` before). A Redis without ``maxmemory`` is not limited here. A job spread over
several shards (:mod:`common.shards`) is checked on the server its chunk goes to, for the
answers of its shards that server holds: on a Cluster, each node for its own.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from swarm_queue.common.models import JobSpec
from swarm_queue.common.shards import Shards
from swarm_queue.common.store import Memory, ProducerStore

__all__ = ["SHARE", "Room"]

# Of maxmemory, what a producer fills counting the answers to come; the rest is for other
# jobs' answers, Redis's own buffers and what the estimate of an answer's size misses.
SHARE = 0.8
# An answer's bytes in Redis before any is measured: about 4 bytes per token of max_tokens (the
# most it can be, for English text), plus the result's fields and the hash's own overhead.
_BYTES_PER_TOKEN = 4
_RESULT_OVERHEAD = 300
_DEFAULT_MAX_TOKENS = 1024  # vLLM's own default is up to the context; this is the guess then
# Answers held before their measured size replaces the guess, and the margin put on it.
_MEASURE_FROM = 64
_MARGIN = 1.25
_POLL_S = 0.25
_SAY_EVERY_S = 60.0
# A Redis without maxmemory: how long before INFO is read again (not at every chunk).
_UNLIMITED_RECHECK_S = 5.0


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


class Room:
    """Whether ``spec``'s job may queue its next chunk in the Redis of ``store``, and waiting
    (saying why, with ``say``) until it may."""

    def __init__(self, store: ProducerStore, spec: JobSpec, say: Callable[[str], None]) -> None:
        self.store = store
        self.job = spec.job
        self.say = say
        self.answer_bytes = float(
            (spec.params.max_tokens or _DEFAULT_MAX_TOKENS) * _BYTES_PER_TOKEN + _RESULT_OVERHEAD
        )
        self._said_at = -math.inf
        self._unlimited_until = -math.inf
        self._policy_said = False
        self._layout: Shards | None = None

    async def wait(
        self,
        prompts: int,
        size: Callable[[], int],
        keep_alive: Callable[[], Awaitable[None]],
        first: int,
    ) -> None:
        """Return once ``prompts`` more prompts of ``size()`` bytes (measured only under a
        maxmemory), from index ``first``, leave room for every answer to come of the job on
        the server they go to; ``keep_alive`` is called while waiting (the producer's lock)."""
        if time.monotonic() < self._unlimited_until:
            return
        prompt_bytes = -1
        if self._layout is None:
            self._layout = await self.store.layout(self.job)
        shard = self._layout.name_of(first)
        while True:
            mem = await self.store.memory(shard)
            if mem is None:
                # The ACL forbids INFO: no room check, said once (a full Redis then refuses
                # writes and the producer waits, as without a maxmemory check).
                self._unlimited_until = math.inf
                self.say(
                    "note: this Redis user may not run INFO (its ACL), so its maxmemory is not "
                    "read: prompts are queued without waiting for room for their answers"
                )
                return
            if not mem.maxmemory:
                # No limit: asked again only now and then (an operator may set one).
                self._unlimited_until = time.monotonic() + _UNLIMITED_RECHECK_S
                return
            if prompt_bytes < 0:
                prompt_bytes = size()
            self._check_policy(mem)
            unanswered, cancelled = await self.store.unanswered_beside(self._layout, shard)
            if cancelled:
                return
            # The answers' size is measured only when the estimate says to wait.
            if self._fits(mem, unanswered, prompts, prompt_bytes):
                return
            await self._measure()
            if self._fits(mem, unanswered, prompts, prompt_bytes):
                return
            self._say_waiting(mem, unanswered, prompt_bytes, prompts)
            await keep_alive()
            await asyncio.sleep(_POLL_S)

    def _fits(self, mem: Memory, unanswered: int, prompts: int, prompt_bytes: int) -> bool:
        """Whether the chunk and every answer to come fit within the budget. With nothing of
        its own unanswered, the job only needs room for the chunk: else a chunk whose answers
        alone exceed the budget would never be queued."""
        budget = mem.maxmemory * SHARE
        need = prompt_bytes + (unanswered + prompts) * self.answer_bytes
        return mem.used + need <= budget or (unanswered == 0 and mem.used + prompt_bytes <= budget)

    async def _measure(self) -> None:
        """Replace the guess of an answer's size by the job's own, once it holds enough."""
        held, used = await self.store.result_bytes(self.job)
        if held >= _MEASURE_FROM and used > 0:
            self.answer_bytes = used / held * _MARGIN

    def _say_waiting(self, mem: Memory, unanswered: int, prompt_bytes: int, prompts: int) -> None:
        now = time.monotonic()
        if now - self._said_at < _SAY_EVERY_S:
            return
        self._said_at = now
        per_prompt = prompt_bytes / max(prompts, 1) + self.answer_bytes
        fits = int(max(0.0, mem.maxmemory * SHARE - mem.used) / per_prompt) + unanswered
        if unanswered:
            why = (
                f"the answers of its {unanswered:,} unanswered prompts need about "
                f"{_mib(unanswered * self.answer_bytes)}; about {fits:,} prompts of it fit "
                "unanswered at a time (its window). Its prompts are queued as its answers "
                f"leave Redis: run swarm-collect {self.job} --out FILE --evict (it frees each "
                "answer once written out)"
            )
        else:
            why = (
                "other jobs' prompts and answers fill it: swarm-collect --evict the finished "
                "jobs, or delete them (swarm-jobs --delete-finished)"
            )
        self.say(
            f"job {self.job}: waiting for room in Redis ({_mib(mem.used)} used of maxmemory "
            f"{_mib(mem.maxmemory)}, {SHARE:.0%} of it for queued work and its answers): {why}; "
            "or give Redis more maxmemory"
        )

    def _check_policy(self, mem: Memory) -> None:
        """Say once that a Redis evicting any key when full would delete jobs' keys."""
        if mem.policy.startswith("allkeys") and not self._policy_said:
            self._policy_said = True
            self.say(
                f"warning: Redis's maxmemory-policy is {mem.policy}: when full it deletes any "
                "key, jobs' prompts and answers among them. Set it to noeviction (redis-cli "
                "CONFIG SET maxmemory-policy noeviction)"
            )
