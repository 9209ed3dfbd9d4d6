"""The job registry: creating a job, finding it, listing and deleting jobs."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import msgspec
from redis.exceptions import OutOfMemoryError, ResponseError

from swarm_queue.common.errors import JobConflictError, JobNameError, JobNotFoundError
from swarm_queue.common.keys import GROUP, parse_stage
from swarm_queue.common.models import JobSpec, encode
from swarm_queue.common.store.base import StoreBase, spec_of
from swarm_queue.common.store.boundary import redis_code, redis_errors, replies
from swarm_queue.common.vocab import Meta

__all__ = ["Registry"]

log = logging.getLogger("swarm.store")


class Registry(StoreBase):
    """Jobs as a whole: their spec, their names, whether they still have work."""

    async def create_job(self, spec: JobSpec, *, generation: str | None = None) -> JobSpec:
        """Register ``spec`` (first time, as a new generation of its name, or as
        ``generation``: a shard's, its job's) or check it matches the stored one; returns the
        stored, whose ``generation`` every write of the job's work carries. A job with a
        reduce stage is flagged in its meta, where the workers look."""
        job = spec.job
        parse_stage(job)  # validates: a user's name, or one of its stages or shards
        generation = generation or secrets.token_hex(8)
        mine = msgspec.structs.replace(
            spec, generation=generation, created_s=await self.server_time()
        )
        kind = spec.reduce.kind if spec.reduce is not None else ""
        async with redis_errors(self.url, job):
            created, raw = await self.scripts.create(
                keys=[self.keys.meta(job)],
                args=[encode(mine), generation, kind, mine.chunk, mine.shards],
            )
            stored = spec_of(job, raw)
            if not created and not stored.same_settings(spec):
                others = [
                    f"{name} {getattr(stored, name)!r} (asked: {getattr(spec, name)!r})"
                    for name in stored.differing_settings(spec)
                    if name not in ("model", "params")
                ]
                raise JobConflictError(
                    f"job {job!r} already exists with model={stored.model!r}, "
                    f"params={msgspec.to_builtins(stored.params)}; you asked for "
                    f"model={spec.model!r}, params={msgspec.to_builtins(spec.params)}"
                    + (f"; it differs in {', '.join(others)}" if others else "")
                    + ". Use another job name."
                )
        await self.ensure_group(job)
        async with redis_errors(self.url, "", self.keys.jobs):
            await self.redis.sadd(self.keys.jobs, job)
        return stored

    async def ensure_group(self, job: str) -> None:
        """Create the job's consumer group (and stream) unless it exists; any other refusal
        (an ACL denial, a full Redis) surfaces."""
        async with redis_errors(self.url, job):
            stream = self.keys.stream(job)
            try:
                await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except OutOfMemoryError:
                # A full Redis refuses the create before it would say BUSYGROUP: a group that
                # is there already is all a worker needs to drain the job (and free memory).
                groups = (
                    await self.redis.xinfo_groups(stream) if await self.redis.exists(stream) else []
                )
                if not any(g["name"] == GROUP.encode() for g in groups):
                    raise
            except ResponseError as exc:
                if redis_code(exc) != "BUSYGROUP":  # BUSYGROUP: it exists already
                    raise

    async def arq_worker_alive(self) -> bool:
        """True while some arq worker of this prefix writes its health-check key."""
        async with redis_errors(self.url):
            return bool(await self.redis.exists(self.keys.arq_health_check))

    async def load_spec(self, job: str) -> JobSpec:
        async with redis_errors(self.url, job):
            raw = await self.redis.hget(self.keys.meta(job), Meta.SPEC)
        if raw is None:
            raise JobNotFoundError(
                f"no job named {job!r} in this Redis (prefix {self.keys.prefix!r})"
            )
        return spec_of(job, raw)

    async def list_jobs(self) -> list[str]:
        """Every job (and reduce stage) in the registry, sorted. A member that is no valid
        name (a stray write by another tool) is skipped, with a warning the first time."""
        return (await self.job_names())[0]

    async def job_names(self) -> tuple[list[str], list[str]]:
        """The registry's valid names, and the members that are not (shown by ``swarm-jobs``)."""
        async with redis_errors(self.url, "", self.keys.jobs):
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
        """The jobs among ``names`` not yet finished (one pipelined round trip); one whose
        meta is unreadable is skipped, with a warning the first time."""
        if not names:
            return []
        async with redis_errors(self.url), self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hmget(self.keys.meta(name), [Meta.FINISHED_S, Meta.CANCELLED_S])
            flags = replies(await pipe.execute(raise_on_error=False))
        out = []
        for name, f in zip(names, flags, strict=True):
            if isinstance(f, Exception):  # its meta is no hash (another tool's key): no job
                self.skip_unreadable_meta(name)
            elif f[0] is None and f[1] is None:
                out.append(name)
        return out

    async def generations(self, names: Sequence[str]) -> list[str | None]:
        """Each job's generation (None: no job, or its meta unreadable), in one round trip:
        what a cache of specs is checked against."""
        if not names:
            return []
        async with redis_errors(self.url), self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(self.keys.meta(name), Meta.GENERATION)
            raws = replies(await pipe.execute(raise_on_error=False))
        return [r.decode() if isinstance(r, bytes) else None for r in raws]

    async def meta(self, job: str) -> dict[str, bytes]:
        """The job's meta hash as it is (fields: :class:`common.vocab.Meta`)."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.meta(job))
        return {k.decode(): v for k, v in raw.items()}

    async def job_has_work(self, job: str) -> bool:
        """True while the job has entries not yet acked, or is not sealed and a live producer
        is still feeding it. (An unsealed job whose producer died or refused its input has no
        work until it is resumed: a burst worker does not wait for it.)"""
        async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self.keys.meta(job), [Meta.TOTAL, Meta.FINISHED_S, Meta.CANCELLED_S])
            pipe.exists(self.keys.producer_lock(job))
            (total, finished, cancelled), feeding = await pipe.execute()
            if finished is not None or cancelled is not None:
                return False
            pending, undelivered, *_ = await self.scripts.backlog(
                keys=[self.keys.stream(job)], args=[GROUP]
            )
        return int(pending) > 0 or bool(undelivered) or (total is None and bool(feeding))

    async def delete_job(self, job: str) -> int:
        """Delete every key of ``job`` and of its reduce stages and shards, and unlist them;
        returns how many keys went. The caller checks the job is finished: this does not."""
        n = 0
        async with redis_errors(self.url, job):
            names = [m for m in await self.list_jobs() if parse_stage(m)[0] == job]
            # The metas first: from then on every write that checks a generation (a commit, a
            # move, a pump's record of agents) is refused, so none re-creates a key the scan
            # below has already removed, for a job queued again under the name to inherit.
            n += int(await self.redis.unlink(*(self.keys.meta(m) for m in {job, *names})))
            # Each hash tag's (the job's, each of its shards'), on a Cluster only on the
            # node holding its keys (see on_job_node).
            for tag in sorted({job, *(m for m in names if ":" not in m)}):
                where = self.on_job_node(tag)
                pattern = self.keys.job_pattern(tag)
                async for key in self.redis.scan_iter(match=pattern, count=1000, **where):
                    n += int(await self.redis.unlink(key))
            if names:
                await self.redis.srem(self.keys.jobs, *names)
        return n

    async def enqueued_count(self, job: str) -> int:
        """How many prompts the producer has queued: the resume point of a rerun."""
        async with redis_errors(self.url, job):
            return int(await self.redis.hget(self.keys.meta(job), Meta.ENQUEUED) or 0)
