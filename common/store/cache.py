"""The response cache in Redis (see :mod:`common.cache` for what it keeps): look answers up,
keep new ones, and its size and clearing for ``swarm-jobs``."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from common.store.base import StoreBase
from common.store.connection import redis_errors

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
        async with redis_errors(self.url):
            values = await self.scripts.cache_get(
                keys=self._cache_keys(), args=[ttl_s, *keys]
            )
        return [v if v else None for v in values]

    async def cache_put(
        self, answers: Sequence[tuple[str, bytes]], ttl_s: float, max_answers: int
    ) -> int:
        """Keep ``(key, answer)`` pairs, then evict (see ``lua/cache_put.lua``); returns how
        many answers were evicted."""
        args: list[str | bytes | float | int] = [ttl_s, max_answers]
        for key, blob in answers:
            args += [key, blob]
        async with redis_errors(self.url):
            return int(await self.scripts.cache_put(keys=self._cache_keys(), args=args))

    async def cache_size(self) -> CacheSize:
        async with redis_errors(self.url):
            answers = await self.redis.hlen(self.keys.cache_answers)
            used = 0
            for key in self._cache_keys():
                used += int(await self.redis.memory_usage(key) or 0)
        return CacheSize(int(answers), used)

    async def cache_clear(self) -> int:
        """Delete every answer; returns how many there were."""
        size = await self.cache_size()
        async with redis_errors(self.url):
            await self.redis.delete(*self._cache_keys())
        return size.answers
