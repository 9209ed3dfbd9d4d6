"""The Lua scripts, loaded from ``lua/*.lua`` and registered once per Redis client.

Each file opens with its KEYS/ARGV contract. The loader writes each meta field a script names
(``META.DONE``) as the string :mod:`common.vocab` gives it (``'done'``), so the names Python
reads are the names Lua writes, puts the failure-kind prefix, the lanes' prefix, the trim
period and the prefix of a chunk's results field in front, and then those functions of
``lua/lib/`` the script calls: ``clock.lua`` (Redis's own time: no caller's clock is stored or
compared), ``streams.lua`` (how far the consumer group has read, trimming its acknowledged
head) and ``jobs.lua`` (whether work in hand still belongs to the job's generation). What runs
at every call is only what the script uses: a table of every field, or a closure of every
function, built at each call was a sixth of a bare call's work and fed Lua's collector
(issue 50).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import cache
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from swarm_queue.common.keys import LANE_PREFIX
from swarm_queue.common.vocab import FAILED_KIND_PREFIX, RESULT_CHUNK_PREFIX, TRIM_EVERY, Meta

__all__ = ["SCRIPT_NAMES", "Script", "Scripts", "source"]

SCRIPT_NAMES = (
    "add",
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
    "give_back",
    "lane_steal",
    "lane_take",
    "lock",
    "move",
    "outcomes",
    "publish",
    "retry",
    "route",
    "seal",
    "stage",
    "start",
    "tool_ask",
    "tool_hold",
    "tool_rate",
    "tool_runners",
    "tool_serve",
)


def _lua_string(text: str) -> str:
    if not text.replace("_", "").replace(":", "").isalnum():
        raise ValueError(f"not a plain field name: {text!r}")
    return f"'{text}'"


_META_FIELD = re.compile(r"\bMETA\.([A-Za-z_]+)\b")
_LIB_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end$", re.M | re.S)


def _meta_field(found: re.Match[str]) -> str:
    try:
        return _lua_string(Meta[found.group(1)].value)
    except KeyError:
        raise ValueError(f"META.{found.group(1)} is not a field of common.vocab.Meta") from None


@cache
def _library() -> tuple[tuple[str, str], ...]:
    """The functions of ``lua/lib/``, in their order: (name, text)."""
    text = "".join(
        files(__package__).joinpath("lua", "lib", name).read_text("utf-8")
        for name in ("clock.lua", "streams.lua", "jobs.lua")
    )
    return tuple((m.group(1), m.group(0)) for m in _LIB_FUNCTION.finditer(text))


def _calls(text: str, name: str) -> bool:
    return re.search(rf"\b{name}\(", text) is not None


@cache
def source(name: str) -> str:
    """The full text of script ``name`` as Redis runs it: the constants, the library
    functions it calls (and those they call), then the file, its meta fields written out."""
    body = files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
    library = _library()
    used: set[str] = set()
    need = body
    while True:
        more = {n for n, text in library if n not in used and _calls(need, n)}
        if not more:
            break
        used |= more
        need = "".join(text for n, text in library if n in more)
    head = (
        f"local FAILED_KIND_PREFIX = {_lua_string(FAILED_KIND_PREFIX)}\n"
        f"local LANE_PREFIX = {_lua_string(LANE_PREFIX)}\nlocal TRIM_EVERY = {TRIM_EVERY:d}\n"
        f"local RESULT_CHUNK_PREFIX = {_lua_string(RESULT_CHUNK_PREFIX)}\n"
    )
    lib = "".join(text + "\n" for n, text in library if n in used)
    return _META_FIELD.sub(_meta_field, head + lib + body)


class Script:
    """One script on one client, run by its SHA1 (EVALSHA) and, where the node serving its
    keys does not know it, by its text (EVAL, which also caches it there).

    A node's script cache is in memory only: a Redis restarted, or a replica promoted in a
    failover, has none. redis-py's own fallback loads the script on the primaries its cluster
    client believes in, which after a failover may leave out the new one (seen: every script
    call refused from then on); EVAL goes where the keys are, like the call itself."""

    __slots__ = ("client", "sha", "text")

    def __init__(self, client: aioredis.Redis | RedisCluster, text: str) -> None:
        self.client, self.text = client, text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        try:
            return await self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self.client.eval(self.text, len(keys), *keys, *args)

    async def pipelined(
        self, keys: Sequence[Any], args: Sequence[Any], *more: Callable[[Any], Any]
    ) -> tuple[Any, list[Any]]:
        """The script and, right after it in the same round trip, the commands each of
        ``more`` queues on the pipeline: the script's reply, or its error as an exception (not
        raised, so that what the others did is known), and theirs (errors as exceptions). A
        cluster's pipelines take no script (redis-py): there, the script first, on its own."""
        alone = isinstance(self.client, RedisCluster)
        reply: Any = await self._reply(keys, args) if alone else None
        async with self.client.pipeline(transaction=False) as pipe:
            if not alone:
                pipe.evalsha(self.sha, len(keys), *keys, *args)
            for queue in more:
                queue(pipe)
            rest = await pipe.execute(raise_on_error=False)
        if not alone:
            reply, *rest = rest
        if isinstance(reply, NoScriptError):
            reply = await self._reply(keys, args)
        return reply, rest

    async def _reply(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply, or its error reply as an exception, not raised."""
        try:
            return await self(keys, args)
        except ResponseError as exc:
            return exc


class Scripts:
    """Every script on one client (see :class:`Script`)."""

    __slots__ = SCRIPT_NAMES

    def __init__(self, redis: aioredis.Redis | RedisCluster) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, Script(redis, source(name)))

    add: Script
    backlog: Script
    board: Script
    cache_get: Script
    cache_put: Script
    claim_mine: Script
    commit: Script
    copy: Script
    create: Script
    dim: Script
    evict: Script
    final: Script
    give_back: Script
    lane_steal: Script
    lane_take: Script
    lock: Script
    move: Script
    outcomes: Script
    publish: Script
    retry: Script
    route: Script
    seal: Script
    stage: Script
    start: Script
    tool_ask: Script
    tool_hold: Script
    tool_rate: Script
    tool_runners: Script
    tool_serve: Script
