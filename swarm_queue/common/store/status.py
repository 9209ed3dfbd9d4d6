"""What is shown: a job's status, each endpoint's figures for it, the fleet registry."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import msgspec

from swarm_queue.common.errors import BadRecordError, ConfigError, JobNotFoundError
from swarm_queue.common.fleet import (
    EndpointInfo,
    EndpointStats,
    decode_endpoint_info,
    decode_endpoint_stats,
)
from swarm_queue.common.keys import GROUP
from swarm_queue.common.models import decode_spec, encode
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.delivery import RELEASED_IDLE_MS
from swarm_queue.common.vocab import FAILED_KIND_PREFIX, FailureKind, Meta

__all__ = ["JobStatus", "Status"]


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
    # Of those, the prompt tokens the engines found cached and the completion tokens spent
    # reasoning, where they report them (vLLM: --enable-prompt-tokens-details, a reasoning
    # parser; /v1/responses always).
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cancelled: bool = False
    failed_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    # The reduce stage, if the job has one: its kind, the tree level running (0: the job's own
    # prompts), and whether its output is written.
    reduce: str | None = None
    stage: int = 0
    reduced: bool = False
    # Of ``done``, the prompts answered from the response cache.
    cache_hits: int = 0
    # Every index below it was collected with --evict: its result is no longer in Redis.
    evicted: int = 0
    # swarm-retry rounds that queued something again: a collected file may be out of date.
    revision: int = 0
    # Which life of the job's name this is (see JobSpec.generation).
    generation: str = ""


def _job_status(job: str, meta: dict[str, str], in_flight: int, now: float) -> JobStatus:
    done, failed = int(meta.get(Meta.DONE, 0)), int(meta.get(Meta.FAILED, 0))
    enqueued = int(meta.get(Meta.ENQUEUED, 0))
    rate = 0.0
    if Meta.FIRST_RESULT_S in meta:
        end = float(meta.get(Meta.FINISHED_S) or now)
        span = end - float(meta[Meta.FIRST_RESULT_S])
        # Prompts an operator cancelled were not answered: no part of the rate.
        cancelled = int(meta.get(FAILED_KIND_PREFIX + FailureKind.CANCELLED, 0))
        rate = max(0, done + failed - cancelled) / span if span > 0 else 0.0
    return JobStatus(
        job=job,
        enqueued=enqueued,
        total=int(meta[Meta.TOTAL]) if Meta.TOTAL in meta else None,
        done=done,
        failed=failed,
        in_flight=in_flight,
        # Every queued prompt is answered, in a worker's hands, or waiting: the counters say
        # which exactly (the stream's length does not: acknowledged entries wait for a trim).
        pending=max(0, enqueued - done - failed - in_flight),
        rate_per_s=rate,
        finished=Meta.FINISHED_S in meta,
        prompt_tokens=int(meta.get(Meta.PROMPT_TOKENS, 0)),
        completion_tokens=int(meta.get(Meta.COMPLETION_TOKENS, 0)),
        cached_tokens=int(meta.get(Meta.CACHED_TOKENS, 0)),
        reasoning_tokens=int(meta.get(Meta.REASONING_TOKENS, 0)),
        cancelled=Meta.CANCELLED_S in meta,
        failed_by_kind={
            k.removeprefix(FAILED_KIND_PREFIX): int(v)
            for k, v in sorted(meta.items())
            if k.startswith(FAILED_KIND_PREFIX) and int(v) > 0
        },
        reduce=meta.get(Meta.REDUCE),
        stage=int(meta.get(Meta.STAGE, 0)),
        reduced=Meta.REDUCED_S in meta,
        cache_hits=int(meta.get(Meta.CACHE_HITS, 0)),
        evicted=int(meta.get(Meta.EVICTED, 0)),
        revision=int(meta.get(Meta.REVISION, 0)),
        generation=meta.get(Meta.GENERATION, ""),
    )


class Status(StoreBase):
    """Progress and per-endpoint figures, written by workers and read by the commands."""

    async def status(self, job: str, *, rate: bool = True) -> JobStatus:
        """The job's progress; its rate (which asks Redis's clock of a job still running)
        only with ``rate``: a collector polling between its chunks needs none."""
        meta_key, stream = self.keys.meta(job), self.keys.stream(job)
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(meta_key)
            backlog = await self.scripts.backlog(keys=[stream], args=[GROUP, 1, RELEASED_IDLE_MS])
        if not raw or Meta.SPEC.encode() not in raw:
            raise JobNotFoundError(
                f"no job named {job!r} in this Redis (prefix {self.keys.prefix!r})"
            )
        meta = {k.decode(): v.decode() for k, v in raw.items() if k != Meta.SPEC.encode()}
        running = Meta.FIRST_RESULT_S in meta and Meta.FINISHED_S not in meta
        now = await self.server_time() if rate and running else 0.0
        # An entry waiting in an endpoint's lane is queued, in no worker's hands yet; so is
        # one an endpoint gave up and released, until another takes it.
        held = int(backlog[0]) - int(backlog[2]) - int(backlog[3])
        chunk = 1
        with contextlib.suppress(msgspec.DecodeError, ConfigError):  # (a bad one: told elsewhere)
            chunk = decode_spec(raw[Meta.SPEC.encode()]).chunk
        if chunk > 1:  # a chunk's prompts, whole (some may be answered): at most what is left
            left = int(meta.get(Meta.ENQUEUED, 0)) - int(meta.get(Meta.DONE, 0))
            held = min(held * chunk, max(0, left - int(meta.get(Meta.FAILED, 0))))
        return _job_status(job, meta, held, now)

    async def bad_keys(self, job: str) -> list[str]:
        """Which of ``job``'s keys hold another type than swarm-queue keeps there (another
        tool's or a person's value): the workers skip the job while one does. Each as
        ``'KEY' holds a string, not a hash``."""
        k = self.keys
        expected = {
            k.stream(job): "stream",
            k.meta(job): "hash",
            k.results(job): "hash",
            k.failed(job): "hash",
            k.cached(job): "hash",
            k.running(job): "hash",
            k.reopened(job): "hash",
            k.chunks(job): "hash",
            k.endpoints(job): "hash",
            k.copies(job): "set",
            k.final(job): "string",
            k.producer_lock(job): "string",
        }
        async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
            for key in expected:
                pipe.type(key)
            types = await pipe.execute()
        return [
            f"{key!r} holds a {held}, not a {want}"
            for (key, want), raw in zip(expected.items(), types, strict=True)
            if (held := raw.decode() if isinstance(raw, bytes) else str(raw)) not in ("none", want)
        ]

    async def publish_endpoints(self, stats: dict[str, dict[str, EndpointStats]]) -> None:
        """Write each job's per-endpoint figures: ``{job: {consumer: stats}}``; jobs deleted
        meanwhile are skipped, and so is a job with a bad key (the first is raised after the
        others are written)."""
        bad: list[BadRecordError] = []
        for job, by_consumer in stats.items():
            if by_consumer:
                args = [x for c, st in by_consumer.items() for x in (c, encode(st))]
                keys = [self.keys.meta(job), self.keys.endpoints(job)]
                try:
                    async with redis_errors(self.url, job):
                        await self.scripts.publish(keys=keys, args=args)
                except BadRecordError as exc:  # one job's bad key spoils no other's figures
                    bad.append(exc)
        if bad:
            raise bad[0]

    async def read_endpoints(self, job: str) -> list[EndpointStats]:
        """Every endpoint's latest figures for ``job`` (undecodable entries skipped), by
        endpoint then worker."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.endpoints(job))
        out = []
        for value in raw.values():
            with contextlib.suppress(msgspec.DecodeError):
                out.append(decode_endpoint_stats(value))
        return sorted(out, key=lambda st: (st.endpoint, st.worker))

    async def publish_fleet(self, rows: Sequence[EndpointInfo], gone: Sequence[str] = ()) -> None:
        """Write a worker's endpoints to the fleet registry (field ``worker|endpoint``) and
        remove the fields ``gone`` (a worker that stops takes its endpoints out)."""
        async with (
            redis_errors(self.url, "", self.keys.fleet),
            self.redis.pipeline(transaction=False) as pipe,
        ):
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
        async with redis_errors(self.url, "", self.keys.fleet):
            raw = await self.redis.hgetall(self.keys.fleet)
            out, stale = [], []
            now = await self.server_time()
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
