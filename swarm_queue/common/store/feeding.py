"""The producer's side: queuing prompts under a lock, resuming, sealing the job's total."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from typing import Any

from swarm_queue.common.errors import JobCancelledError, JobConflictError
from swarm_queue.common.models import PromptItem, encode
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.entries import encode_chunk
from swarm_queue.common.vocab import Meta

__all__ = ["Feeding", "producer_token"]


def producer_token() -> str:
    """Identifies this process as lock holder: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _runs(
    items: Sequence[PromptItem], keys: Sequence[str], chunk: int
) -> Iterator[tuple[list[PromptItem], str]]:
    """``items`` in runs of up to ``chunk`` consecutive ones of one affinity key, each within
    one multiple of ``chunk`` (index // chunk), so that where a chunk starts does not depend
    on how the input was cut into calls (a resume's, a window's)."""
    run: list[PromptItem] = []
    run_key = ""
    for item, key in zip(items, keys, strict=True):
        if run and (item.index % chunk == 0 or key != run_key):
            yield run, run_key
            run = []
        if not run:
            run_key = key
        run.append(item)
    if run:
        yield run, run_key


class Feeding(StoreBase):
    """Filling a job's stream: one producer at a time, all or nothing per chunk."""

    async def acquire_producer_lock(self, job: str, token: str, ttl_ms: int) -> str | None:
        """Take or refresh the job's producer lock; returns the other holder's token if held."""
        async with redis_errors(self.url, job):
            holder = await self.scripts.lock(
                keys=[self.keys.producer_lock(job)], args=[token, ttl_ms]
            )
        return holder.decode() if holder else None

    async def release_producer_lock(self, job: str, token: str) -> None:
        """Let go of the job's producer lock, if ``token`` holds it."""
        async with redis_errors(self.url, job):
            await self.scripts.lock(keys=[self.keys.producer_lock(job)], args=[token, 0])

    async def resume_point(self, job: str) -> tuple[int, str | None]:
        """How many prompts the producer has queued, and the digest of the input they came
        from (None for a job queued before digests were kept)."""
        async with redis_errors(self.url, job):
            have, digest = await self.redis.hmget(
                self.keys.meta(job), [Meta.ENQUEUED, Meta.INPUT_DIGEST]
            )
        return int(have or 0), None if digest is None else digest.decode()

    async def add_items(
        self,
        job: str,
        items: Sequence[PromptItem],
        digest: str = "",
        *,
        gen: str,
        affinity: Sequence[str] = (),
        chunk: int = 1,
        after: int | None = None,
    ) -> None:
        """Append ``items`` (consecutive indices from the current end) in one atomic step,
        each with its ``affinity`` key if given (see :mod:`common.affinity`), up to ``chunk``
        consecutive ones of one key to an entry (see :mod:`common.store.entries`);
        ``digest``: of the whole input up to the last of them, kept with the resume point;
        ``after``: a shard's, the index after its prompts before (see :mod:`common.shards`).
        :class:`JobGoneError` if the job is no longer of generation ``gen``."""
        if not items:
            return
        # Keys only where some prompt has one: an argument more a prompt is the Redis client's
        # time (the producer's CPU, scenario 4).
        keyed = any(affinity)
        args: list[Any] = [items[0].index, digest, gen, "1" if keyed else "0", ""]
        args.append("" if after is None else after)
        if chunk > 1:
            args[4] = chunk
            for run, key in _runs(items, affinity if keyed else [""] * len(items), chunk):
                payload = encode(run[0]) if len(run) == 1 else encode_chunk(list(map(encode, run)))
                args += [payload, key, len(run)] if keyed else [payload, len(run)]
        elif keyed:
            for item, key in zip(items, affinity, strict=True):
                args += [encode(item), key]
        else:
            args += [encode(item) for item in items]
        async with redis_errors(self.url, job):
            status, have = await self.scripts.add(
                keys=[self.keys.meta(job), self.keys.stream(job), self.keys.chunks(job)],
                args=args,
            )
        if status == -1:
            raise JobCancelledError(
                f"job {job!r} was cancelled (swarm-cancel); nothing more queued"
            )
        if status == -2:
            raise JobConflictError(
                f"job {job!r}: prompts from index {items[0].index} were to be queued but the job "
                f"holds {have}; is another swarm-enqueue writing to it?"
            )

    async def seal(self, job: str, total: int, *, gen: str) -> None:
        """Record that ``job`` has ``total`` prompts, all queued; a different total is refused."""
        async with redis_errors(self.url, job):
            ok, stored = await self.scripts.seal(keys=[self.keys.meta(job)], args=[total, gen])
        if not ok:
            raise JobConflictError(
                f"job {job!r} was sealed with {int(stored)} prompts; this input has {total}. "
                "Use another job name."
            )

    async def result_bytes(self, job: str) -> tuple[int, int]:
        """``(results held, about how many bytes of Redis memory they take)``: what a producer
        learns the size of an answer from (Redis estimates the bytes from a sample)."""
        key = self.keys.results(job)
        async with redis_errors(self.url, job):
            held = int(await self.redis.hlen(key))
            used = int(await self.redis.memory_usage(key, samples=50) or 0) if held else 0
            if held:
                # A field may hold a chunk's results (common/store/resultfields.py): the
                # answers held are those counted but below the eviction mark.
                counts = await self.redis.hmget(
                    self.keys.meta(job), [Meta.PACKED, Meta.DONE, Meta.FAILED, Meta.EVICTED]
                )
                if counts[0] == b"1":
                    done, failed, evicted = (int(c or 0) for c in counts[1:])
                    held = max(held, done + failed - evicted)
        return held, used
