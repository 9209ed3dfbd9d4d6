"""The response cache in Redis (see :mod:`common.cache` for what it keeps): look answers up,
keep new ones, and its size and clearing for ``swarm-jobs``."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.cache import decode_answer
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors

__all__ = ["CacheSize", "ResponseCache"]


class CacheSize(msgspec.Struct, frozen=True):
    """How many answers the cache holds and about how many bytes of Redis memory they take."""

    answers: int
    bytes: int


class ResponseCache(StoreBase):
    """The cache's two keys (``Keys.cache_answers``, ``Keys.cache_used``), in one hash slot."""

    def _cache_keys(self) -> list[str]:
        return [self.keys.cache_answers, self.keys.cache_used]

    async def cache_get(self, keys: Sequence[str], ttl_s: float) -> list[bytes | None]:
        """The answer under each key (None: none, or unused for longer than ``ttl_s``); each
        found counts as used now."""
        if not keys:
            return []
        async with redis_errors(self.url, "", *self._cache_keys()):
            values = await self.scripts.cache_get(keys=self._cache_keys(), args=[ttl_s, *keys])
        return [v if v else None for v in values]

    async def cache_put(
        self, answers: Sequence[tuple[str, bytes]], ttl_s: float, max_answers: int
    ) -> int:
        """Keep ``(key, answer)`` pairs, then evict (see ``lua/cache_put.lua``); returns how
        many answers were evicted."""
        args: list[str | bytes | float | int] = [ttl_s, max_answers]
        for key, blob in answers:
            args += [key, blob]
        async with redis_errors(self.url, "", *self._cache_keys()):
            return int(await self.scripts.cache_put(keys=self._cache_keys(), args=args))

    async def cache_size(self) -> CacheSize:
        async with redis_errors(self.url, "", *self._cache_keys()):
            answers = await self.redis.hlen(self.keys.cache_answers)
            used = 0
            for key in self._cache_keys():
                used += int(await self.redis.memory_usage(key) or 0)
        return CacheSize(int(answers), used)

    async def cache_purge(
        self,
        *,
        endpoint: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> int:
        """Delete the answers that came from ``endpoint`` (as its label reads) and were kept
        in ``[since, until)`` (Redis's seconds); any of the three None: no condition. An answer
        kept before times were recorded matches no time window. Returns how many went."""
        gone = 0
        doomed: list[bytes] = []

        async def drop() -> None:
            nonlocal gone
            if doomed:
                async with self.redis.pipeline(transaction=False) as pipe:
                    # Fields of bytes, as redis-py sends them (its annotation says str).
                    pipe.hdel(self.keys.cache_answers, *doomed)  # type: ignore[arg-type]
                    pipe.zrem(self.keys.cache_used, *doomed)
                    gone += int((await pipe.execute())[0])
                doomed.clear()

        async with redis_errors(self.url, "", *self._cache_keys()):
            # Deleting while scanning is safe: HSCAN returns every field present throughout.
            async for key, blob in self.redis.hscan_iter(self.keys.cache_answers, count=1000):
                try:
                    answer = decode_answer(blob)
                except msgspec.DecodeError:
                    continue  # not an answer: the next put of its key replaces it
                at = answer.cached_s or None
                if (
                    (endpoint is None or answer.endpoint == endpoint)
                    and (since is None or (at is not None and at >= since))
                    and (until is None or (at is not None and at < until))
                ):
                    doomed.append(key)
                    if len(doomed) >= 1000:
                        await drop()
            await drop()
        return gone

    async def cache_clear(self) -> int:
        """Delete every answer; returns how many there were."""
        size = await self.cache_size()
        async with redis_errors(self.url, "", *self._cache_keys()):
            await self.redis.delete(*self._cache_keys())
        return size.answers
