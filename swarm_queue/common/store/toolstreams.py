"""Tool calls shared by agents across jobs: a call queued on its tool's stream and claimed,
taken by a runner (or taken over from one that died), and its answer (see
:mod:`common.toolcall`). Their keys share the tag ``{~tools}``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from swarm_queue.common.keys import GROUP
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.connection import redis_code
from swarm_queue.common.store.delivery import RELEASED_IDLE_MS
from swarm_queue.common.toolcall import HAND_OVER_S, ToolAnswer, decode_answer, encode_answer

__all__ = ["ToolCall", "Tools"]


# A call taken from its tool's stream: (tool, entry ID, the call's key, its arguments).
ToolCall = tuple[str, bytes, str, str]


class Tools(StoreBase):
    """Asking for a tool call, the runners' side of its stream, and its answer."""

    async def ask_tool(
        self, key: str, name: str, arguments: str, ttl_s: float
    ) -> ToolAnswer | bool:
        """The answer kept for the call ``key`` (kept from now on at least HAND_OVER_S more),
        or else whether this asker queued it now for ``name``'s runners, claimed for
        ``ttl_s``: False when it is queued or running already (its claim renewed)."""
        keys = [self.keys.tool_answer(key), self.keys.tool_claim(key), self.keys.tool_calls(name)]
        args = [int(ttl_s * 1000), int(HAND_OVER_S * 1000), GROUP, key, arguments]
        async with redis_errors(self.url, "", *keys):
            got = await self.scripts.tool_ask(keys=keys, args=args)
        if isinstance(got, bytes):
            return _decoded(got)
        return bool(got)

    async def open_tool_calls(self, tools: Sequence[str]) -> None:
        """Make each of ``tools``' streams readable by the runners (created empty if none)."""
        for tool in tools:
            async with redis_errors(self.url, "", self.keys.tool_calls(tool)):
                try:
                    await self.redis.xgroup_create(
                        self.keys.tool_calls(tool), GROUP, id="0", mkstream=True
                    )
                except ResponseError as exc:
                    if redis_code(exc) != "BUSYGROUP":  # BUSYGROUP: it exists already
                        raise

    async def take_tool_calls(
        self, tools: Sequence[str], consumer: str, count: int, block_ms: int
    ) -> list[ToolCall]:
        """Up to ``count`` new calls of ``tools`` for runner ``consumer``, waiting up to
        ``block_ms`` for one. A stream deleted meanwhile is made again (its calls, if any
        are asked again by their askers, who find their claims' entries gone)."""
        names = [self.keys.tool_calls(t) for t in tools]
        streams: dict[KeyT, StreamIdT] = dict.fromkeys(names, ">")
        by_stream = dict(zip(names, tools, strict=True))
        async with redis_errors(self.url, ""):
            try:
                reply = await self.redis.xreadgroup(
                    GROUP, consumer, streams, count=count, block=block_ms
                )
            except ResponseError as exc:
                if redis_code(exc) != "NOGROUP":
                    raise
                await self.open_tool_calls(tools)
                return []
        return _calls(by_stream, reply or [])

    async def take_over_tool_calls(
        self, tool: str, consumer: str, idle_ms: int, count: int
    ) -> list[ToolCall]:
        """Up to ``count`` calls of ``tool`` idle ``idle_ms`` in another runner's hands (it
        died, or stopped and let them go), taken over by ``consumer``."""
        stream = self.keys.tool_calls(tool)
        async with redis_errors(self.url, "", stream):
            try:
                reply = await self.redis.xautoclaim(
                    stream, GROUP, consumer, idle_ms, start_id="0-0", count=count
                )
            except ResponseError as exc:
                if redis_code(exc) != "NOGROUP":
                    raise
                return []
        return _calls({stream: tool}, [(stream, reply[1])])

    async def hold_tool_call(
        self, tool: str, entry_id: bytes, consumer: str, key: str, ttl_s: float
    ) -> bool:
        """Say that ``consumer`` still runs the call ``key`` (entry ``entry_id``): its entry
        is not taken over, its claim renewed for ``ttl_s``; False when another runner took it
        over meanwhile."""
        keys = [self.keys.tool_calls(tool), self.keys.tool_claim(key)]
        args = [GROUP, consumer, entry_id, int(ttl_s * 1000)]
        async with redis_errors(self.url, "", *keys):
            return bool(await self.scripts.tool_hold(keys=keys, args=args))

    async def let_go_tool_calls(self, tool: str, consumer: str, entry_ids: Sequence[bytes]) -> None:
        """``consumer`` stops without running ``entry_ids``: they are made idle long enough
        for any runner to take them over at once."""
        if entry_ids:
            stream = self.keys.tool_calls(tool)
            async with redis_errors(self.url, "", stream):
                await self.redis.xclaim(
                    stream, GROUP, consumer, 0, list(entry_ids), idle=RELEASED_IDLE_MS, justid=True
                )

    async def answer_tool_call(
        self, tool: str, entry_id: bytes, key: str, answer: ToolAnswer, keep_s: float
    ) -> None:
        """Keep ``answer`` of the call ``key`` for ``keep_s`` and let go of its claim and its
        entry (``entry_id``), in one step; its runs are counted anew from here (the next
        asker's run, another job's, is its own)."""
        stream = self.keys.tool_calls(tool)
        async with redis_errors(self.url, "", stream), self.redis.pipeline() as pipe:
            pipe.set(self.keys.tool_answer(key), encode_answer(answer), px=int(keep_s * 1000))
            pipe.delete(self.keys.tool_claim(key), self.keys.tool_runs(key))
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()

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
        """How many calls of each of ``tools`` wait in its stream for a runner to take them."""
        if not tools:
            return {}
        streams = [self.keys.tool_calls(t) for t in tools]
        async with redis_errors(self.url, ""), self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xlen(stream)
                pipe.xpending(stream, GROUP)
            replies = await pipe.execute(raise_on_error=False)
        out = {}
        for t, length, pending in zip(tools, replies[::2], replies[1::2], strict=True):
            held = pending["pending"] if isinstance(pending, dict) else 0
            out[t] = max(0, int(length) - held) if isinstance(length, int) else 0
        return out

    async def tool_answers(self, keys: Sequence[str]) -> list[ToolAnswer | None]:
        """The answers kept for ``keys`` (None: none yet; an unreadable one is an error)."""
        if not keys:
            return []
        async with redis_errors(self.url, ""):
            raws = await self.redis.mget([self.keys.tool_answer(k) for k in keys])
        return [None if raw is None else _decoded(raw) for raw in raws]

    async def in_hand(self, keys: Sequence[str]) -> list[bool]:
        """Whether each call is claimed (queued for a runner, or running)."""
        if not keys:
            return []
        async with redis_errors(self.url, ""):
            raws = await self.redis.mget([self.keys.tool_claim(k) for k in keys])
        return [raw is not None for raw in raws]

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


def _calls(by_stream: dict[str, str], reply: Any) -> list[ToolCall]:
    """The calls in an XREADGROUP-shaped ``reply`` (an entry gone from its stream, whose
    fields are nil, is left out: its asker queues it again)."""
    out = []
    for stream, entries in reply:
        tool = by_stream[stream.decode() if isinstance(stream, bytes) else stream]
        for eid, fields in entries:
            if fields:
                out.append((tool, eid, fields[b"k"].decode(), fields[b"a"].decode()))
    return out


def _decoded(raw: bytes) -> ToolAnswer:
    """A kept answer; an unreadable one is the call's error (another tool wrote the key)."""
    try:
        return decode_answer(raw)
    except msgspec.DecodeError as exc:
        return ToolAnswer(error=f"unreadable tool answer in Redis: {exc}")
