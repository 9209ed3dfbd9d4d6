"""Tool calls shared by agents across jobs: the claim of a call in flight and its answer (see
:mod:`common.tools`). Their keys share the tag ``{~tools}``."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.tools import (
    BEGUN,
    HAND_OVER_S,
    ToolAnswer,
    decode_answer,
    encode_answer,
)

__all__ = ["Tools"]


class Tools(StoreBase):
    """Claiming a tool call, and its answer."""

    async def claim_tool(self, key: str, ttl_s: float) -> ToolAnswer | bool:
        """The answer kept for the call ``key`` (kept from now on at least HAND_OVER_S more),
        or else whether this asker took it in hand for ``ttl_s`` (its deadline and retries):
        False when another has it in hand."""
        keys = [self.keys.tool_answer(key), self.keys.tool_claim(key)]
        async with redis_errors(self.url, ""):
            args = [int(ttl_s * 1000), int(HAND_OVER_S * 1000)]
            got = await self.scripts.tool_claim(keys=keys, args=args)
        if isinstance(got, bytes):
            return _decoded(got)
        return bool(got)

    async def hold_claim(self, key: str, ttl_s: float, try_id: str) -> None:
        """Keep the claim on the call ``key`` for ``ttl_s`` from now (if it is still held),
        naming its try: its asker, once the try is queued as arq job ``try_id``."""
        async with redis_errors(self.url, ""):
            await self.redis.set(self.keys.tool_claim(key), try_id, px=int(ttl_s * 1000), xx=True)

    async def retake_claim(self, key: str, lost: bytes, ttl_s: float) -> bool:
        """Claim the call ``key`` again for ``ttl_s`` if its claim still says ``lost`` (the
        lost try's: no runner began it since, no other asker took it over): whether it did."""
        async with redis_errors(self.url, ""):
            got = await self.scripts.tool_retake(
                keys=[self.keys.tool_claim(key)], args=[lost, int(ttl_s * 1000)]
            )
        return bool(got)

    async def begin_try(self, key: str, label: str) -> None:
        """Say on the call's claim that runner ``label`` has begun a try of it (see
        ``BEGUN``)."""
        claim = BEGUN + label.encode()
        async with redis_errors(self.url, ""):
            await self.redis.set(self.keys.tool_claim(key), claim, xx=True, keepttl=True)

    async def runner_serves(self, tool: str, label: str) -> bool:
        """Whether runner ``label`` still says it serves ``tool`` (its time not run out by
        Redis's clock)."""
        async with redis_errors(self.url, ""):
            got = await self.scripts.tool_alive(keys=[self.keys.tool_runners(tool)], args=[label])
        return bool(got)

    async def tool_turn(self, tool: str, rate_per_s: float, max_wait_s: float) -> float | None:
        """A turn for one run of ``tool``, limited to ``rate_per_s`` across every runner: how
        long to wait for it (s), or None when that would be more than ``max_wait_s``."""
        args = [1.0 / rate_per_s, max_wait_s]
        async with redis_errors(self.url, ""):
            wait_ms = int(await self.scripts.tool_rate(keys=[self.keys.tool_rate(tool)], args=args))
        return None if wait_ms < 0 else wait_ms / 1000

    async def serve_tools(self, label: str, tools: Sequence[str], ttl_ms: int) -> None:
        """Say that runner ``label`` serves ``tools`` for ``ttl_ms`` from now (0: no more)."""
        keys = [self.keys.tool_runners(t) for t in tools]
        if keys:
            async with redis_errors(self.url, ""):
                await self.scripts.tool_serve(keys=keys, args=[label, ttl_ms])

    async def tool_runners(self, tools: Sequence[str]) -> dict[str, int]:
        """How many live runners serve each of ``tools``."""
        if not tools:
            return {}
        keys = [self.keys.tool_runners(t) for t in tools]
        async with redis_errors(self.url, ""):
            counts = await self.scripts.tool_runners(keys=keys, args=[])
        return {t: int(n) for t, n in zip(tools, counts, strict=True)}

    async def tool_queued(self, tools: Sequence[str]) -> dict[str, int]:
        """How many calls of each of ``tools`` wait in its queue for a runner to take them."""
        if not tools:
            return {}
        async with redis_errors(self.url, ""), self.redis.pipeline(transaction=False) as pipe:
            for t in tools:
                pipe.zcard(self.keys.tool_queue(t))
            counts = await pipe.execute()
        return {t: int(n) for t, n in zip(tools, counts, strict=True)}

    async def tool_answers(self, keys: Sequence[str]) -> list[ToolAnswer | None]:
        """The answers kept for ``keys`` (None: none yet; an unreadable one is an error)."""
        if not keys:
            return []
        async with redis_errors(self.url, ""):
            raws = await self.redis.mget([self.keys.tool_answer(k) for k in keys])
        return [None if raw is None else _decoded(raw) for raw in raws]

    async def claims(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each call's claim (None: in no one's hands): ``1`` while its try is queued, the
        try's arq job ID once it is, ``BEGUN`` and the runner's label once one began it."""
        if not keys:
            return []
        async with redis_errors(self.url, ""):
            return list(await self.redis.mget([self.keys.tool_claim(k) for k in keys]))

    async def in_hand(self, keys: Sequence[str]) -> list[bool]:
        """Whether each call is claimed (a runner has it, or it is queued for one)."""
        return [raw is not None for raw in await self.claims(keys)]

    async def count_run(self, key: str, keep_s: float) -> int:
        """Count one run of the call ``key`` (kept ``keep_s``); returns its runs so far."""
        async with redis_errors(self.url, ""), self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(self.keys.tool_runs(key))
            pipe.pexpire(self.keys.tool_runs(key), int(keep_s * 1000))
            runs, _ = await pipe.execute()
        return int(runs)

    async def count_tools(self, field: str, n: int = 1) -> None:
        """Count tool calls (``queued``, ``shared``, ``runs``: see ``Keys.tool_stats``)."""
        async with redis_errors(self.url, ""):
            await self.redis.hincrby(self.keys.tool_stats, field, n)

    async def tool_stats(self) -> dict[str, int]:
        async with redis_errors(self.url, ""):
            raw = await self.redis.hgetall(self.keys.tool_stats)
        return {k.decode(): int(v) for k, v in raw.items()}

    async def put_tool_answer(self, key: str, answer: ToolAnswer, keep_s: float) -> None:
        """Keep ``answer`` of the call ``key`` for ``keep_s`` and let go of its claim; its
        runs are counted anew from here (the next asker's run, another job's, is its own)."""
        async with redis_errors(self.url, ""), self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.tool_answer(key), encode_answer(answer), px=int(keep_s * 1000))
            pipe.delete(self.keys.tool_claim(key), self.keys.tool_runs(key))
            await pipe.execute()


def _decoded(raw: bytes) -> ToolAnswer:
    """A kept answer; an unreadable one is the call's error (another tool wrote the key)."""
    try:
        return decode_answer(raw)
    except msgspec.DecodeError as exc:
        return ToolAnswer(error=f"unreadable tool answer in Redis: {exc}")
