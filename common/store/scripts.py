"""The Lua scripts, loaded from ``lua/*.lua`` and registered once per Redis client.

Each file opens with its KEYS/ARGV contract. The loader puts the meta field names, the
failure-kind prefix of :mod:`common.vocab` and the lanes' prefix in front of every script
(``META.DONE``...), so the names Python reads are the names Lua writes, and then the
functions of ``lua/lib/``:
``clock.lua`` (Redis's own time: no caller's clock is stored or compared), ``streams.lua`` (how
far the consumer group has read, trimming its acknowledged head) and ``jobs.lua`` (whether work
in hand still belongs to the job's generation).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from common.keys import LANE_PREFIX
from common.vocab import FAILED_KIND_PREFIX, Meta

__all__ = ["SCRIPT_NAMES", "Scripts", "source"]

SCRIPT_NAMES = (
    "add",
    "agents",
    "backlog",
    "board",
    "cache_get",
    "cache_put",
    "claim_mine",
    "commit",
    "copy",
    "create",
    "dim",
    "evict",
    "final",
    "lane_steal",
    "lane_take",
    "lock",
    "move",
    "publish",
    "retry",
    "seal",
    "stage",
    "start",
    "tool_claim",
    "tool_rate",
    "tool_runners",
    "tool_serve",
)


def _lua_string(text: str) -> str:
    if not text.replace("_", "").replace(":", "").isalnum():
        raise ValueError(f"not a plain field name: {text!r}")
    return f"'{text}'"


@cache
def _preamble() -> str:
    fields = ", ".join(f"{m.name} = {_lua_string(m.value)}" for m in Meta)
    lib = "".join(
        files(__package__).joinpath("lua", "lib", name).read_text("utf-8")
        for name in ("clock.lua", "streams.lua", "jobs.lua")
    )
    return (
        f"local META = {{{fields}}}\nlocal FAILED_KIND_PREFIX = {_lua_string(FAILED_KIND_PREFIX)}\n"
        f"local LANE_PREFIX = {_lua_string(LANE_PREFIX)}\n" + lib
    )


@cache
def source(name: str) -> str:
    """The full text of script ``name`` as Redis runs it: the vocabulary, then the file."""
    return _preamble() + files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


class Scripts:
    """Every script registered on one client; calling one runs it by SHA (EVALSHA, loading it
    first where Redis does not know it yet)."""

    __slots__ = SCRIPT_NAMES

    def __init__(self, redis: aioredis.Redis | RedisCluster) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, redis.register_script(source(name)))

    add: AsyncScript
    agents: AsyncScript
    backlog: AsyncScript
    board: AsyncScript
    cache_get: AsyncScript
    cache_put: AsyncScript
    claim_mine: AsyncScript
    commit: AsyncScript
    copy: AsyncScript
    create: AsyncScript
    dim: AsyncScript
    evict: AsyncScript
    final: AsyncScript
    lane_steal: AsyncScript
    lane_take: AsyncScript
    lock: AsyncScript
    move: AsyncScript
    publish: AsyncScript
    retry: AsyncScript
    seal: AsyncScript
    stage: AsyncScript
    start: AsyncScript
    tool_claim: AsyncScript
    tool_rate: AsyncScript
    tool_runners: AsyncScript
    tool_serve: AsyncScript
