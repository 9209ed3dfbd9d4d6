"""All of swarm-queue's Redis traffic: one class, one place where redis errors are translated.

Layout of one job (keys from :class:`common.keys.Keys`, all in the job's hash slot):

* stream ``q``: one entry per prompt, entry ID ``0-(index+1)``, field ``d`` = msgpack
  :class:`~common.models.PromptItem`. Explicit IDs make enqueueing idempotent: a rerun resumes
  after the stream's last generated ID. Entries are deleted as they are acknowledged, so the
  stream holds only work not yet done, and its length is "pending + in flight".
* hash ``results``: decimal index -> msgpack :class:`~common.models.Result`; first write wins.
* hash ``meta``: ``spec``, ``total`` (set when the producer has read all input), counters
  ``done``/``failed``/``prompt_tokens``/``completion_tokens``, timestamps ``*_s``.
* hash ``running``: entry ID -> runs started and never finished (see :meth:`JobStore.start`);
  a count left behind is a worker that died running the entry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Container, Iterable, Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    OutOfMemoryError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import (
    BadRecordError,
    ConfigError,
    JobCancelledError,
    JobConflictError,
    JobNameError,
    JobNotFoundError,
    StoreAccessDenied,
    StoreFull,
    StoreUnavailable,
)
from common.keys import GROUP, Keys, parse_stage, stage_name
from common.models import (
    EndpointInfo,
    EndpointStats,
    JobSpec,
    PromptItem,
    ReduceOutput,
    Result,
    decode_endpoint_info,
    decode_endpoint_stats,
    decode_final,
    decode_item,
    decode_spec,
    encode,
    encode_final,
    result_or_failure,
)
from common.settings import Settings, mask_url
from common.vocab import FailureKind

__all__ = [
    "RELEASED_IDLE_MS",
    "RETRY_ON",
    "Commit",
    "JobStatus",
    "JobStore",
    "connect",
    "decode_entry",
    "index_of",
    "producer_token",
    "redis_errors",
    "redis_retry",
]

# The worker's atomic "write results + ack": first write wins (HSETNX), counters move only for
# new results, a failure keeps its original entry (for swarm-retry) and counts under its kind,
# acknowledged entries are deleted, and the job is marked finished when the last result lands.
# KEYS: results, meta, stream, failed. ARGV: group, now_s, prompt_tokens, completion_tokens, then
# per entry (entry_id, index, result blob, error kind or '' on success, original entry payload).
# Its ``running`` marks go with the ack (KEYS[5]).
_COMMIT_LUA = """
local results, meta, stream, failed_h, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, now = ARGV[1], ARGV[2]
local done, failed, ids = 0, 0, {}
for b = 5, #ARGV, 5 do
  ids[#ids + 1] = ARGV[b]
  if redis.call('HSETNX', results, ARGV[b + 1], ARGV[b + 2]) == 1 then
    local kind = ARGV[b + 3]
    if kind == '' then
      done = done + 1
    else
      failed = failed + 1
      redis.call('HINCRBY', meta, 'failed:' .. kind, 1)
      redis.call('HSET', failed_h, ARGV[b + 1], ARGV[b + 4])
    end
  end
end
for i = 1, #ids, 500 do
  local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
  redis.call('XACK', stream, group, unpack(chunk))
  redis.call('XDEL', stream, unpack(chunk))
  redis.call('HDEL', running, unpack(chunk))
end
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', meta, 'prompt_tokens', ARGV[3]) end
if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', meta, 'completion_tokens', ARGV[4]) end
if done + failed > 0 then
  if done > 0 then redis.call('HINCRBY', meta, 'done', done) end
  if failed > 0 then redis.call('HINCRBY', meta, 'failed', failed) end
  redis.call('HSETNX', meta, 'first_result_s', now)
  redis.call('HSET', meta, 'last_result_s', now)
  local total = redis.call('HGET', meta, 'total')
  if total then
    local d = tonumber(redis.call('HGET', meta, 'done') or '0')
    local f = tonumber(redis.call('HGET', meta, 'failed') or '0')
    if d + f >= tonumber(total) then redis.call('HSETNX', meta, 'finished_s', now) end
  end
end
return {done, failed}
"""

# Queues failed prompts again: drops their results, re-adds their original entries to the stream
# under IDs ``round-(index+1)`` (greater than every earlier ID, same index), and reopens the job.
# KEYS: results, meta, stream, failed. ARGV: round, then per prompt (index, kind).
_RETRY_LUA = """
local results, meta, stream, failed_h = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local round, n = ARGV[1], 0
for b = 2, #ARGV, 2 do
  local idx, kind = ARGV[b], ARGV[b + 1]
  local payload = redis.call('HGET', failed_h, idx)
  if payload then
    redis.call('HDEL', results, idx)
    redis.call('HDEL', failed_h, idx)
    redis.call('XADD', stream, round .. '-' .. (tonumber(idx) + 1), 'd', payload)
    redis.call('HINCRBY', meta, 'failed:' .. kind, -1)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', meta, 'failed', -n)
  redis.call('HDEL', meta, 'finished_s', 'cancelled_s')
end
return n
"""

# Records the total once all input is queued, and finishes the job if its results are all in
# already (a rerun of swarm-enqueue on a job the workers completed meanwhile).
_SEAL_LUA = """
local meta = KEYS[1]
local total, now = ARGV[1], ARGV[2]
local old = redis.call('HGET', meta, 'total')
if old and old ~= total then return {0, old} end
redis.call('HSET', meta, 'total', total)
redis.call('HSETNX', meta, 'sealed_s', now)
local d = tonumber(redis.call('HGET', meta, 'done') or '0')
local f = tonumber(redis.call('HGET', meta, 'failed') or '0')
if d + f >= tonumber(total) then redis.call('HSETNX', meta, 'finished_s', now) end
return {1, total}
"""

# Re-claims, for the calling consumer, those of the given entries it still owns: resets their
# idle time (a heartbeat) or, with an idle time, marks them long idle (a release). Entries another
# worker has taken over meanwhile are left alone, so a slow worker never steals them back. A
# release also takes back the run's ``running`` mark: handing work back is no death.
# KEYS: stream, running. ARGV: group, consumer, idle_ms ('' for none), then the entry IDs (sorted).
_CLAIM_MINE_LUA = """
local stream, running, group, consumer, idle = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local wanted = {}
for i = 4, #ARGV do wanted[ARGV[i]] = true end
local pending = redis.call('XPENDING', stream, group, ARGV[4], ARGV[#ARGV], 100000, consumer)
local ids = {}
for _, e in ipairs(pending) do
  if wanted[e[1]] then ids[#ids + 1] = e[1] end
end
for i = 1, #ids, 500 do
  -- unpack() only expands as the last argument, so build the whole argument list first.
  local args = {'XCLAIM', stream, group, consumer, 0}
  for j = i, math.min(i + 499, #ids) do args[#args + 1] = ids[j] end
  if idle ~= '' then
    args[#args + 1] = 'IDLE'
    args[#args + 1] = idle
  end
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
if idle ~= '' then
  for _, id in ipairs(ids) do
    if redis.call('HINCRBY', running, id, -1) <= 0 then redis.call('HDEL', running, id) end
  end
end
return #ids
"""

# Marks entries as started by a worker (see JobStore.start). KEYS: running. ARGV: entry IDs.
_START_LUA = """
for i = 1, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[i], 1) end
return #ARGV
"""

# Appends one chunk of prompts, all or nothing: refused if the job was cancelled or if the chunk
# does not start exactly where the stream ends (a resume from the wrong point). The digest of
# the input up to the chunk's end is kept with the resume point, so a resume can check it goes
# on with the same input. KEYS: meta, stream. ARGV: first index, input digest ('' for none),
# then the payloads in index order. Returns {status, enqueued}.
_ADD_LUA = """
local meta, stream = KEYS[1], KEYS[2]
if redis.call('HEXISTS', meta, 'cancelled_s') == 1 then return {-1, 0} end
local have = tonumber(redis.call('HGET', meta, 'enqueued') or '0')
local first = tonumber(ARGV[1])
if have ~= first then return {-2, have} end
for i = 3, #ARGV do
  redis.call('XADD', stream, string.format('0-%d', first + i - 2), 'd', ARGV[i])
end
redis.call('HSET', meta, 'enqueued', first + #ARGV - 2)
if ARGV[2] ~= '' then redis.call('HSET', meta, 'input_digest', ARGV[2]) end
return {1, first + #ARGV - 2}
"""

# Takes or refreshes the per-job producer lock. ARGV: token, ttl_ms.
_LOCK_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""


# Writes a job's per-endpoint figures, unless the job is gone (deleted meanwhile: no orphan key).
# KEYS: meta, endpoints. ARGV: field, value, field, value...
_PUBLISH_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV))
return 1
"""


log = logging.getLogger("swarm.store")

# What "released" entries are marked idle for: longer than any sane claim_idle_ms.
RELEASED_IDLE_MS = 10**10


# Retried by redis-py itself: a Redis restart (or failover) of up to about a minute and a half
# is ridden out inside a single command; swarm-queue's own loops retry beyond that.
# OSError matters: redis-py's connect retry only catches its own ConnectionError, but a refused
# connection (Redis restarting) arrives as the builtin ConnectionRefusedError.
RETRY_ON: list[type[Exception]] = [RedisConnectionError, RedisTimeoutError, OSError]


class _Refused(Exception):
    """Carries an authentication error past the retry loop, which would otherwise retry it
    (redis-py's AuthenticationError is a ConnectionError)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Retry(Retry):
    async def call_with_retry(self, do: Any, fail: Any) -> Any:
        async def once() -> Any:
            try:
                return await do()
            except (AuthenticationError, AuthorizationError) as exc:
                raise _Refused(exc) from None

        try:
            return await super().call_with_retry(once, fail)
        except _Refused as refused:
            raise refused.error from None


def redis_retry(retries: int = 30) -> Retry:
    """Capped exponential backoff for reconnecting to Redis (shared with arq's pool); wrong
    credentials fail at once, since no wait will fix them."""
    return _Retry(ExponentialBackoff(cap=5.0, base=0.05), retries)


def connect(url: str, *, patient: bool = True, ca_file: str = "") -> aioredis.Redis:
    """A Redis client for ``url`` that rides out connection loss with capped backoff.

    ``patient`` (workers, producer, collector) waits out a Redis restart of a minute or two;
    otherwise (one-shot commands such as swarm-status) a missing Redis is reported at once.
    Responses stay bytes (``decode_responses=False``): payloads are msgpack. ``ca_file``
    verifies a ``rediss://`` server against that CA.
    """
    tls: dict[str, Any] = {"ssl_ca_certs": ca_file} if ca_file else {}
    try:
        return aioredis.from_url(
            url,
            retry=redis_retry(30 if patient else 3),
            retry_on_error=RETRY_ON,
            health_check_interval=30,
            socket_keepalive=True,
            **tls,
        )
    except ValueError as exc:
        raise StoreUnavailable(f"invalid Redis URL {mask_url(url)}: {exc}") from None


@contextlib.asynccontextmanager
async def redis_errors(url: str) -> AsyncIterator[None]:
    """Translate redis connection failures into :class:`StoreUnavailable` (the one boundary)."""
    try:
        yield
    except (AuthenticationError, AuthorizationError, NoPermissionError) as exc:
        raise StoreAccessDenied(
            f"Redis at {mask_url(url)} refused access: {exc} (check the user and password in "
            "the URL, and the user's ACL: it needs the key prefix's keys and stream commands)"
        ) from None
    except ResponseError as exc:
        if not _is_oom(exc):
            raise
        raise StoreFull(
            f"Redis at {mask_url(url)} is out of memory (its maxmemory is reached) and refuses "
            "writes: collect finished jobs with swarm-collect --evict, delete them with "
            "swarm-jobs --delete-finished, or give Redis more memory"
        ) from None
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise StoreUnavailable(f"Redis at {mask_url(url)} unavailable: {exc}") from None


def _redis_code(exc: ResponseError) -> str:
    """The error code of a Redis error reply: its first word (``BUSYGROUP``, ``OOM``...), the
    protocol's machine-readable part, as redis-py itself maps replies to classes."""
    text = str(exc.args[0]) if exc.args else ""
    return text.split(" ", 1)[0]


def _is_oom(exc: ResponseError) -> bool:
    """Redis refused a write for want of memory: redis-py maps the reply's error code ``OOM``
    to OutOfMemoryError, except inside a script, whose error carries the code as ``-OOM``.
    (Redis refuses a script's first write when over maxmemory and lets one that has written
    go on, so a refused script changed nothing.)"""
    return isinstance(exc, OutOfMemoryError) or " -OOM " in f" {exc.args[0] if exc.args else ''}"


def _id_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq)


def index_of(entry_id: bytes | str) -> int:
    """The prompt index encoded in a stream entry ID ``0-(index+1)``."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2]) - 1


class JobStatus(msgspec.Struct, frozen=True):
    """A job's progress as ``swarm-status`` shows it."""

    job: str
    enqueued: int
    total: int | None
    done: int
    failed: int
    in_flight: int
    pending: int
    rate_per_s: float
    finished: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cancelled: bool = False
    failed_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    # The reduce stage, if the job has one: its kind, the tree level running (0: the job's own
    # prompts), and whether its output is written.
    reduce: str | None = None
    stage: int = 0
    reduced: bool = False


class Commit(msgspec.Struct, frozen=True):
    """What one commit changed: new results written (duplicates of a redelivery are not counted)."""

    done: int
    failed: int


class JobStore:
    """Job operations on one Redis, shared by producer, workers and collector."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, url: str = "") -> None:
        self.redis = redis
        self.keys = keys
        self.url = url
        self._commit = redis.register_script(_COMMIT_LUA)
        self._seal = redis.register_script(_SEAL_LUA)
        self._lock = redis.register_script(_LOCK_LUA)
        self._publish = redis.register_script(_PUBLISH_LUA)
        self._claim_mine = redis.register_script(_CLAIM_MINE_LUA)
        self._retry = redis.register_script(_RETRY_LUA)
        self._add = redis.register_script(_ADD_LUA)
        self._start = redis.register_script(_START_LUA)
        self._warned: set[str] = set()  # bad records already logged once

    @classmethod
    def from_settings(cls, settings: Settings, *, patient: bool = True) -> JobStore:
        """The store of ``settings``' Redis and key prefix (see :func:`connect` for patience)."""
        redis = connect(settings.redis_url, patient=patient, ca_file=settings.redis_ca_file)
        return cls(redis, settings.keys, settings.redis_url)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> None:
        """Reach Redis once: StoreAccessDenied for wrong credentials (at once), else
        StoreUnavailable after the client's patience."""
        async with redis_errors(self.url):
            await self.redis.ping()

    def _script_keys(self, job: str) -> list[str]:
        """KEYS of the commit and retry scripts, in their order: results, meta, stream, failed,
        running."""
        k = self.keys
        return [k.results(job), k.meta(job), k.stream(job), k.failed(job), k.running(job)]

    # -- jobs ---------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec) -> JobSpec:
        """Register ``spec`` (first time) or check it matches the stored one; returns the stored.
        A job with a reduce stage is flagged in its meta, where the workers look for it."""
        job = spec.job
        parse_stage(job)  # validates: a user's name, or one of its reduce stages
        meta = self.keys.meta(job)
        async with redis_errors(self.url):
            created = await self.redis.hsetnx(meta, "spec", encode(spec))
            if created and spec.reduce is not None:
                await self.redis.hset(meta, "reduce", spec.reduce.kind)
            stored = spec if created else _spec_of(job, await self.redis.hget(meta, "spec"))
            if not created and not stored.same_settings(spec):
                others = [
                    f"{name} {getattr(stored, name)!r} (asked: {getattr(spec, name)!r})"
                    for name in ("chat", "template", "schema", "reduce", "priority")
                    if getattr(stored, name) != getattr(spec, name)
                ]
                raise JobConflictError(
                    f"job {job!r} already exists with model={stored.model!r}, "
                    f"params={msgspec.to_builtins(stored.params)}; you asked for "
                    f"model={spec.model!r}, params={msgspec.to_builtins(spec.params)}"
                    + (f"; it differs in {', '.join(others)}" if others else "")
                    + ". Use another job name."
                )
            await self.ensure_group(job)
            await self.redis.sadd(self.keys.jobs, job)
        return stored

    async def ensure_group(self, job: str) -> None:
        """Create the job's consumer group (and stream) unless it exists; any other refusal
        (an ACL denial, a full Redis) surfaces."""
        async with redis_errors(self.url):
            try:
                await self.redis.xgroup_create(self.keys.stream(job), GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if _redis_code(exc) != "BUSYGROUP":  # BUSYGROUP: it exists already
                    raise

    async def arq_worker_alive(self) -> bool:
        """True while some arq worker of this prefix writes its health-check key."""
        async with redis_errors(self.url):
            return bool(await self.redis.exists(self.keys.arq_health_check))

    async def load_spec(self, job: str) -> JobSpec:
        async with redis_errors(self.url):
            raw = await self.redis.hget(self.keys.meta(job), "spec")
        if raw is None:
            raise JobNotFoundError(
                f"no job named {job!r} in this Redis (prefix {self.keys.prefix!r})"
            )
        return _spec_of(job, raw)

    async def list_jobs(self) -> list[str]:
        """Every job (and reduce stage) in the registry, sorted. A member that is no valid
        name (a stray write by another tool) is skipped, with a warning the first time."""
        return (await self.job_names())[0]

    async def job_names(self) -> tuple[list[str], list[str]]:
        """The registry's valid names, and the members that are not (shown by ``swarm-jobs``)."""
        async with redis_errors(self.url):
            members = await self.redis.smembers(self.keys.jobs)
        good, bad = [], []
        for raw in members:
            name = raw.decode(errors="replace")
            try:
                parse_stage(name)
            except JobNameError:
                bad.append(name)
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("ignoring %r in %s: not a job name", name, self.keys.jobs)
                continue
            good.append(name)
        return sorted(good), sorted(bad)

    async def unfinished(self, names: Sequence[str]) -> list[str]:
        """The jobs among ``names`` not yet finished (one pipelined round trip)."""
        if not names:
            return []
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                pipe.hmget(self.keys.meta(name), ["finished_s", "cancelled_s"])
            flags = await pipe.execute()
        return [n for n, f in zip(names, flags, strict=True) if f[0] is None and f[1] is None]

    async def meta(self, job: str) -> dict[str, bytes]:
        async with redis_errors(self.url):
            raw = await self.redis.hgetall(self.keys.meta(job))
        return {k.decode(): v for k, v in raw.items()}

    # -- producer -----------------------------------------------------------------------

    async def enqueued_count(self, job: str) -> int:
        """How many prompts the producer has queued: the resume point of a rerun."""
        async with redis_errors(self.url):
            return int(await self.redis.hget(self.keys.meta(job), "enqueued") or 0)

    async def acquire_producer_lock(self, job: str, token: str, ttl_ms: int) -> str | None:
        """Take or refresh the job's producer lock; returns the other holder's token if held."""
        async with redis_errors(self.url):
            holder = await self._lock(keys=[self.keys.producer_lock(job)], args=[token, ttl_ms])
        return holder.decode() if holder else None

    async def release_producer_lock(self, job: str, token: str) -> None:
        key = self.keys.producer_lock(job)
        async with redis_errors(self.url):
            if await self.redis.get(key) == token.encode():
                await self.redis.delete(key)

    async def resume_point(self, job: str) -> tuple[int, str | None]:
        """How many prompts the producer has queued, and the digest of the input they came
        from (None for a job queued before digests were kept)."""
        async with redis_errors(self.url):
            have, digest = await self.redis.hmget(self.keys.meta(job), ["enqueued", "input_digest"])
        return int(have or 0), None if digest is None else digest.decode()

    async def add_items(self, job: str, items: Sequence[PromptItem], digest: str = "") -> None:
        """Append ``items`` (consecutive indices from the current end) in one atomic step;
        ``digest``: of the whole input up to the last of them, kept with the resume point."""
        if not items:
            return
        args: list[Any] = [items[0].index, digest, *(encode(item) for item in items)]
        async with redis_errors(self.url):
            status, have = await self._add(
                keys=[self.keys.meta(job), self.keys.stream(job)], args=args
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

    async def cancel(self, job: str) -> tuple[bool, int]:
        """Stop ``job``: every prompt not yet answered gets a failed result of kind ``cancelled``
        (its entry kept for ``swarm-retry``). Returns (newly cancelled, prompts cancelled now)."""
        meta = self.keys.meta(job)
        await self.load_spec(job)
        async with redis_errors(self.url):
            newly = bool(await self.redis.hsetnx(meta, "cancelled_s", f"{time.time():.3f}"))
            total = await self.redis.hget(meta, "total")
        if total is None:  # the producer had not finished: the job ends where its input stopped
            await self.seal(job, await self.enqueued_count(job))
        count = 0
        while True:
            async with redis_errors(self.url):
                entries = await self.redis.xrange(self.keys.stream(job), count=1000)
            if not entries:
                return newly, count
            batch = [
                (
                    eid,
                    Result(
                        index=index_of(eid),
                        error="cancelled by operator (swarm-cancel)",
                        error_kind=FailureKind.CANCELLED,
                    ),
                    fields.get(b"d"),
                )
                for eid, fields in entries
            ]
            count += (await self.commit(job, batch)).failed

    async def seal(self, job: str, total: int) -> None:
        async with redis_errors(self.url):
            ok, stored = await self._seal(
                keys=[self.keys.meta(job)], args=[total, f"{time.time():.3f}"]
            )
        if not ok:
            raise JobConflictError(
                f"job {job!r} was sealed with {int(stored)} prompts; this input has {total}. "
                "Use another job name."
            )

    # -- worker -------------------------------------------------------------------------

    async def read_new(
        self, job: str, consumer: str, count: int, block_ms: int | None = None
    ) -> list[tuple[bytes, bytes | None]]:
        """Up to ``count`` never-delivered entries for ``consumer``: ``(entry_id, payload)``.

        ``block_ms`` None returns at once; otherwise waits up to that long for new entries.
        """
        async with redis_errors(self.url):
            reply = await self.redis.xreadgroup(
                GROUP, consumer, {self.keys.stream(job): ">"}, count=count, block=block_ms
            )
        if not reply:
            return []
        return [(eid, fields.get(b"d") if fields else None) for eid, fields in reply[0][1]]

    async def claim_own_pending(
        self,
        job: str,
        consumer: str,
        count: int,
        after: bytes = b"-",
        exclude: Container[bytes] = (),
    ) -> tuple[list[tuple[bytes, bytes | None, int]], bytes | None]:
        """Re-deliver to ``consumer`` its own unacknowledged entries (a restarted worker's
        leftovers, or entries whose read reply was lost): ``(entry_id, payload, deaths)``, and
        the last ID looked at (None when done). ``deaths``: how often workers died running the
        entry (taking it back is none). ``exclude``: entries this consumer is still working
        on."""
        stream = self.keys.stream(job)
        start = after if after == b"-" else b"(" + after
        async with redis_errors(self.url):
            pending = await self.redis.xpending_range(stream, GROUP, start, "+", count, consumer)
            if not pending:
                return [], None
            ids = [p["message_id"] for p in pending if p["message_id"] not in exclude]
            claimed = await self.redis.xclaim(stream, GROUP, consumer, 0, ids) if ids else []
            entries = await self._with_deaths(job, claimed)
        return entries, pending[-1]["message_id"]

    async def _with_deaths(
        self, job: str, claimed: list[tuple[bytes, dict[bytes, bytes] | None]]
    ) -> list[tuple[bytes, bytes | None, int]]:
        """``(entry_id, payload, deaths)`` of claimed entries (inside a redis_errors block)."""
        if not claimed:
            return []
        marks = await self.redis.hmget(self.keys.running(job), [eid for eid, _ in claimed])
        return [
            (eid, f.get(b"d") if f else None, int(n or 0))
            for (eid, f), n in zip(claimed, marks, strict=True)
        ]

    async def autoclaim(
        self, job: str, consumer: str, min_idle_ms: int, count: int
    ) -> list[tuple[bytes, bytes | None, int]]:
        """Take over up to ``count`` entries idle for ``min_idle_ms`` in any consumer's hands
        (released, or orphaned by a dead worker): ``(entry_id, payload, deaths)``."""
        stream = self.keys.stream(job)
        async with redis_errors(self.url):
            reply = await self.redis.xautoclaim(
                stream, GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            )
            return await self._with_deaths(job, reply[1])

    async def start(self, job: str, entry_ids: Sequence[bytes]) -> None:
        """Mark entries as running: a mark is taken back by their commit or release, so a mark
        still there when the entry is taken again is a worker that died running it."""
        if entry_ids:
            async with redis_errors(self.url):
                await self._start(keys=[self.keys.running(job)], args=list(entry_ids))

    async def touch(self, job: str, consumer: str, entry_ids: Sequence[bytes]) -> int:
        """Reset the idle time of entries this consumer still owns, so none takes them as
        orphaned; returns how many it still owns."""
        return await self._claim_own(job, consumer, entry_ids, "")

    async def release(self, job: str, consumer: str, entry_ids: Sequence[bytes]) -> int:
        """Hand entries back at once: mark the ones still ours long idle, so any worker's
        reclaim takes them without waiting for the claim idle time."""
        return await self._claim_own(job, consumer, entry_ids, str(RELEASED_IDLE_MS))

    async def _claim_own(
        self, job: str, consumer: str, entry_ids: Sequence[bytes], idle: str
    ) -> int:
        if not entry_ids:
            return 0
        ids = sorted(entry_ids, key=_id_key)
        keys = [self.keys.stream(job), self.keys.running(job)]
        async with redis_errors(self.url):
            return int(await self._claim_mine(keys=keys, args=[GROUP, consumer, idle, *ids]))

    async def commit(
        self,
        job: str,
        entries: Iterable[tuple[bytes, Result, bytes | None]],
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> Commit:
        """Write each result under its index (first write wins) and ack its entry, atomically.

        ``entries`` are ``(entry_id, result, original payload)``; a failure's payload is kept so
        that ``swarm-retry`` can queue the prompt again.
        """
        args: list[Any] = [GROUP, f"{time.time():.3f}", prompt_tokens, completion_tokens]
        for entry_id, result, payload in entries:
            kind = "" if result.ok else (result.error_kind or "error")
            args += [
                entry_id,
                str(result.index),
                encode(result),
                kind,
                b"" if result.ok else (payload or b""),
            ]
        keys = self._script_keys(job)
        async with redis_errors(self.url):
            done, failed = await self._commit(keys=keys, args=args)
        return Commit(int(done), int(failed))

    async def failed_indices(
        self, job: str, kinds: set[str] | None = None
    ) -> list[tuple[int, str]]:
        """``(index, kind)`` of every failed prompt that can be queued again, in index order."""
        found: list[tuple[int, str]] = []
        async with redis_errors(self.url):
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

    async def requeue(self, job: str, failed: Sequence[tuple[int, str]]) -> int:
        """Queue the given failed prompts again (see ``_RETRY_LUA``); returns how many."""
        if not failed:
            return 0
        keys = self._script_keys(job)
        async with redis_errors(self.url):
            round_ = await self.redis.hincrby(self.keys.meta(job), "retry_round", 1)
            n = 0
            for start in range(0, len(failed), 1000):
                args: list[Any] = [round_]
                for index, kind in failed[start : start + 1000]:
                    args += [index, kind]
                n += int(await self._retry(keys=keys, args=args))
        return n

    # -- reduce stage ---------------------------------------------------------------------

    async def reduces_pending(self, names: Sequence[str]) -> list[tuple[str, int, bool]]:
        """For each job among ``names`` whose reduce has not finished (nor been cancelled):
        ``(job, level of its current stage, whether that stage has finished)``."""
        parents = [n for n in names if ":" not in n]
        if not parents:
            return []
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            for name in parents:
                pipe.hmget(self.keys.meta(name), ["reduce", "stage", "reduced_s", "cancelled_s"])
            rows = await pipe.execute()
            todo = [
                (name, int(stage or 0))
                for name, (kind, stage, reduced, cancelled) in zip(parents, rows, strict=True)
                if kind is not None and reduced is None and cancelled is None
            ]
            if not todo:
                return []
            pipe = self.redis.pipeline(transaction=False)
            for name, level in todo:
                pipe.hget(self.keys.meta(stage_name(name, level)), "finished_s")
            finished = await pipe.execute()
        return [(n, lv, f is not None) for (n, lv), f in zip(todo, finished, strict=True)]

    async def set_stage(self, job: str, level: int, **info: int) -> None:
        """Record that ``job``'s reduce now runs stage ``level`` (``info``: counts about how it
        was built, kept in the stage's meta)."""
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=True)
            if info:
                pipe.hset(self.keys.meta(stage_name(job, level)), mapping=info)
            pipe.hset(self.keys.meta(job), "stage", level)
            await pipe.execute()

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

    async def write_final(self, job: str, output: ReduceOutput) -> bool:
        """Store the reduce output, once; False if one was there already."""
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(self.keys.final(job), encode_final(output), nx=True)
            pipe.hsetnx(self.keys.meta(job), "reduced_s", f"{time.time():.3f}")
            written, _ = await pipe.execute()
        return bool(written)

    async def read_final(self, job: str) -> ReduceOutput | None:
        async with redis_errors(self.url):
            raw = await self.redis.get(self.keys.final(job))
        return None if raw is None else decode_final(raw)

    async def delete_job(self, job: str) -> int:
        """Delete every key of ``job`` and of its reduce stages, and unlist them; returns how
        many keys went. The caller checks the job is finished: this does not."""
        n = 0
        async with redis_errors(self.url):
            async for key in self.redis.scan_iter(match=self.keys.job_pattern(job), count=1000):
                n += int(await self.redis.unlink(key))
            names = [m for m in await self.list_jobs() if parse_stage(m)[0] == job]
            if names:
                await self.redis.srem(self.keys.jobs, *names)
        return n

    async def job_has_work(self, job: str) -> bool:
        """True while the job has entries not yet acked, or is not sealed and a live producer
        is still feeding it. (An unsealed job whose producer died or refused its input has no
        work until it is resumed: a burst worker does not wait for it.)"""
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hmget(self.keys.meta(job), ["total", "finished_s", "cancelled_s"])
            pipe.xlen(self.keys.stream(job))
            pipe.exists(self.keys.producer_lock(job))
            (total, finished, cancelled), length, feeding = await pipe.execute()
        if finished is not None or cancelled is not None:
            return False
        return int(length) > 0 or (total is None and bool(feeding))

    # -- collector and status -----------------------------------------------------------

    async def fetch_results(self, job: str, start: int, count: int) -> list[bytes | None]:
        """Raw result blobs for indices ``start .. start+count-1`` (None where not yet written)."""
        fields = [str(i) for i in range(start, start + count)]
        async with redis_errors(self.url):
            return list(await self.redis.hmget(self.keys.results(job), fields))

    async def evict_results(self, job: str, start: int, end: int) -> None:
        """Delete the results of indices ``start .. end-1`` (written out by a collector)."""
        async with redis_errors(self.url):
            for lo in range(start, end, 5000):
                fields = [str(i) for i in range(lo, min(end, lo + 5000))]
                await self.redis.hdel(self.keys.results(job), *fields)

    async def publish_endpoints(self, stats: dict[str, dict[str, EndpointStats]]) -> None:
        """Write each job's per-endpoint figures: ``{job: {consumer: stats}}``; jobs deleted
        meanwhile are skipped."""
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            for job, by_consumer in stats.items():
                if by_consumer:
                    args = [x for c, st in by_consumer.items() for x in (c, encode(st))]
                    keys = [self.keys.meta(job), self.keys.endpoints(job)]
                    await self._publish(keys=keys, args=args, client=pipe)
            await pipe.execute()

    async def publish_fleet(self, rows: Sequence[EndpointInfo], gone: Sequence[str] = ()) -> None:
        """Write a worker's endpoints to the fleet registry (field ``worker|endpoint``) and
        remove the fields ``gone`` (a worker that stops takes its endpoints out)."""
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            if rows:
                pipe.hset(
                    self.keys.fleet,
                    mapping={f"{r.worker}|{r.endpoint}": encode(r) for r in rows},
                )
            if gone:
                pipe.hdel(self.keys.fleet, *gone)
            await pipe.execute()

    async def read_fleet(self, prune_after_s: float = 3600.0) -> list[EndpointInfo]:
        """Every endpoint in the fleet registry, by endpoint then worker. Undecodable rows are
        skipped; rows not refreshed for ``prune_after_s`` (workers killed long ago) are
        deleted on the way."""
        async with redis_errors(self.url):
            raw = await self.redis.hgetall(self.keys.fleet)
            out, stale = [], []
            now = time.time()
            for field, value in raw.items():
                try:
                    info = decode_endpoint_info(value)
                except msgspec.DecodeError:
                    continue
                if now - info.updated_s > prune_after_s:
                    stale.append(field)
                else:
                    out.append(info)
            if stale:
                await self.redis.hdel(self.keys.fleet, *stale)
        return sorted(out, key=lambda e: (e.endpoint, e.worker))

    async def read_endpoints(self, job: str) -> list[EndpointStats]:
        """Every endpoint's latest figures for ``job`` (undecodable entries skipped), by
        endpoint then worker."""
        async with redis_errors(self.url):
            raw = await self.redis.hgetall(self.keys.endpoints(job))
        out = []
        for value in raw.values():
            with contextlib.suppress(msgspec.DecodeError):
                out.append(decode_endpoint_stats(value))
        return sorted(out, key=lambda st: (st.endpoint, st.worker))

    async def status(self, job: str) -> JobStatus:
        meta_key, stream = self.keys.meta(job), self.keys.stream(job)
        async with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hgetall(meta_key)
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
            raw, length, pending = await pipe.execute(raise_on_error=False)
        if not raw or b"spec" not in raw:
            raise JobNotFoundError(
                f"no job named {job!r} in this Redis (prefix {self.keys.prefix!r})"
            )
        meta = {k.decode(): v.decode() for k, v in raw.items() if k != b"spec"}
        in_flight = 0 if isinstance(pending, Exception) else int(pending["pending"])
        length = 0 if isinstance(length, Exception) else int(length)
        done, failed = int(meta.get("done", 0)), int(meta.get("failed", 0))
        rate = 0.0
        if "first_result_s" in meta:
            end = float(meta.get("finished_s") or time.time())
            span = end - float(meta["first_result_s"])
            rate = (done + failed) / span if span > 0 else 0.0
        total = int(meta["total"]) if "total" in meta else None
        return JobStatus(
            job=job,
            enqueued=await self.enqueued_count(job),
            total=total,
            done=done,
            failed=failed,
            in_flight=in_flight,
            pending=max(0, length - in_flight),
            rate_per_s=rate,
            finished="finished_s" in meta,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", 0)),
            cancelled="cancelled_s" in meta,
            failed_by_kind={
                k.removeprefix("failed:"): int(v)
                for k, v in sorted(meta.items())
                if k.startswith("failed:") and int(v) > 0
            },
            reduce=meta.get("reduce"),
            stage=int(meta.get("stage", 0)),
            reduced="reduced_s" in meta,
        )


def _spec_of(job: str, raw: bytes) -> JobSpec:
    try:
        return decode_spec(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, ConfigError) as exc:
        raise BadRecordError(f"job {job!r}: its spec in Redis cannot be read: {exc}") from None


def producer_token() -> str:
    """Identifies this process as lock holder: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def decode_entry(entry_id: bytes, payload: bytes | None) -> PromptItem | str:
    """The entry's :class:`PromptItem`, or a reason string when it cannot be decoded."""
    if payload is None:
        return "stream entry has no payload"
    try:
        item = decode_item(payload)
    except msgspec.DecodeError as exc:
        return f"undecodable stream entry: {exc}"
    if item.index != index_of(entry_id):
        return f"stream entry {entry_id.decode()} holds index {item.index}"
    return item
