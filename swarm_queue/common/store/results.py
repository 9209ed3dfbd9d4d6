"""Results: read back in index order, evicted once written out, failures queued again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swarm_queue.common.models import Result, result_or_failure
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.vocab import FailureKind, Meta

__all__ = ["Results"]


class Results(StoreBase):
    """A job's results hash and the failed prompts kept beside it."""

    async def fetch_results(
        self, job: str, start: int, count: int, *, leading: bool = False
    ) -> list[bytes | None]:
        """Raw result blobs for indices ``start .. start+count-1`` (None where not yet written;
        ``leading``: past the first not yet written, any may be None)."""
        return await self.result_blobs(job, range(start, start + count), leading=leading)

    async def read_results(self, job: str, total: int, chunk: int = 2000) -> list[Result]:
        """Every result of ``job`` in index order; an index with none (evicted by a collector)
        comes back as a failure saying so, never silently skipped."""
        out: list[Result] = []
        for start in range(0, total, chunk):
            blobs = await self.fetch_results(job, start, min(chunk, total - start))
            for i, blob in enumerate(blobs, start):
                if blob is None:
                    out.append(
                        Result(
                            index=i,
                            error="no result in Redis (evicted by swarm-collect --evict?)",
                            error_kind=FailureKind.MISSING,
                        )
                    )
                else:
                    out.append(result_or_failure(i, blob))
        return out

    async def evict_results(self, job: str, start: int, end: int, *, gen: str) -> int:
        """Delete the results of indices ``start .. end-1``, written out durably by a collector
        of ``job``'s generation ``gen``, and mark every index below ``end`` evicted (see
        ``lua/evict.lua``); returns the mark."""
        keys = [self.keys.results(job), self.keys.meta(job), self.keys.failed(job)]
        mark = 0
        async with redis_errors(self.url, job):
            # A slice at a time: one script call holds Redis for its whole length.
            for lo in range(start, max(end, start + 1), 50_000):
                hi = min(end, lo + 50_000)
                mark = int(await self.scripts.evict(keys=keys, args=[gen, lo, hi]))
        return mark

    async def failed_indices(
        self, job: str, kinds: set[str] | None = None
    ) -> list[tuple[int, str]]:
        """``(index, kind)`` of every failed prompt that can be queued again, in index order."""
        found: list[tuple[int, str]] = []
        async with redis_errors(self.url, job):
            indices = sorted(
                [int(i) async for i, _ in self.redis.hscan_iter(self.keys.failed(job))]
            )
            for start in range(0, len(indices), 1000):
                chunk = indices[start : start + 1000]
                blobs = await self.redis.hmget(self.keys.results(job), [str(i) for i in chunk])
                for i, blob in zip(chunk, blobs, strict=True):
                    kind = (result_or_failure(i, blob).error_kind or "error") if blob else "error"
                    if kinds is None or kind in kinds:
                        found.append((i, kind))
        return found

    async def cached_indices(self, job: str) -> list[int]:
        """Every prompt answered from the response cache whose entry is kept, in index order."""
        async with redis_errors(self.url, job):
            return sorted([int(i) async for i, _ in self.redis.hscan_iter(self.keys.cached(job))])

    async def requeue(self, job: str, failed: Sequence[tuple[int, str]], *, gen: str) -> int:
        """Queue the given prompts again, ``(index, failure kind or '+' for an answer from the
        cache)`` (see ``lua/retry.lua``); returns how many."""
        if not failed:
            return 0
        keys = self.script_keys(job)
        keys = [*keys[:5], keys[6]]  # (not running)
        async with redis_errors(self.url, job):
            round_ = await self.redis.hincrby(self.keys.meta(job), Meta.RETRY_ROUND, 1)
            n = 0
            for start in range(0, len(failed), 1000):
                args: list[Any] = [round_, gen]
                for index, kind in failed[start : start + 1000]:
                    args += [index, kind]
                n += int(await self.scripts.retry(keys=keys, args=args))
        return n
