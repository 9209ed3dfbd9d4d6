"""A job spread over shards (:mod:`common.shards`), worked on as a whole: the operations a
producer, a collector or an operator runs on a job go to each of its shards and their answers
are put together. The workers know nothing of it: to them each shard is a job."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from redis.asyncio.cluster import RedisCluster

from swarm_queue.common.errors import JobNotFoundError
from swarm_queue.common.fleet import EndpointStats
from swarm_queue.common.keys import parse_stage, shard_of
from swarm_queue.common.models import JobSpec, PromptItem
from swarm_queue.common.shards import Shards
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.feeding import Feeding
from swarm_queue.common.store.registry import Registry
from swarm_queue.common.store.results import Results
from swarm_queue.common.store.status import JobStatus, Status
from swarm_queue.common.vocab import Meta

__all__ = ["Sharded", "combined", "merged_endpoints"]


def combined(job: str, parts: Sequence[JobStatus]) -> JobStatus:
    """The status of ``job`` from its shards' (shard 0's first): counts summed, finished
    when every shard is, cancelled when one is."""
    first = parts[0]
    kinds: dict[str, int] = {}
    for p in parts:
        for kind, n in p.failed_by_kind.items():
            kinds[kind] = kinds.get(kind, 0) + n
    totals = [p.total for p in parts]
    summed = {
        name: sum(getattr(p, name) for p in parts)
        for name in (
            "enqueued", "done", "failed", "in_flight", "pending", "rate_per_s",
            "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
            "cache_hits",
        )
    }  # fmt: skip
    return msgspec.structs.replace(
        first,
        job=job,
        total=None if None in totals else sum(t for t in totals if t is not None),
        finished=all(p.finished for p in parts),
        cancelled=any(p.cancelled for p in parts),
        failed_by_kind=dict(sorted(kinds.items())),
        evicted=min(p.evicted for p in parts),
        revision=max(p.revision for p in parts),
        **summed,
    )


def merged_endpoints(stats: Sequence[EndpointStats]) -> list[EndpointStats]:
    """One row per worker and endpoint from its rows of each shard: the job's counts and rates
    summed, the rest (its circuit, window, errors, all the endpoint's own) its latest row's."""
    rows: dict[tuple[str, str], EndpointStats] = {}
    for st in sorted(stats, key=lambda st: st.updated_s):
        key = (st.endpoint, st.worker)
        had = rows.get(key)
        if had is not None:
            st = msgspec.structs.replace(
                st,
                done=st.done + had.done,
                failed=st.failed + had.failed,
                rate_per_s=st.rate_per_s + had.rate_per_s,
                in_flight=st.in_flight + had.in_flight,
            )
        rows[key] = st
    return [rows[k] for k in sorted(rows)]


class Sharded(Registry, Feeding, Status, Results):
    """The job-wide operations of a job of several shards; of one, as they are."""

    async def layout(self, job: str) -> Shards:
        """How ``job`` is spread (read from its meta; one shard for a job of one, for a name
        of a shard, and for no job)."""
        if parse_stage(job)[0] != job:  # a shard, a step, a stage: one of its own
            return Shards(job)
        async with redis_errors(self.url, job):
            count, chunk = await self.redis.hmget(self.keys.meta(job), [Meta.SHARDS, Meta.CHUNK])
        return Shards.of(job, int(count or 1), int(chunk or 1))

    async def primaries(self) -> int:
        """How many primaries serve the Redis Cluster (1: one Redis server)."""
        if not isinstance(self.redis, RedisCluster):
            return 1
        async with redis_errors(self.url):
            await self.redis.initialize()
            return len(self.redis.get_primaries())

    async def create_job(self, spec: JobSpec, *, generation: str | None = None) -> JobSpec:
        """Create the job and each of its shards, of one generation; ``shards`` 0 (``auto``):
        one a primary of the cluster, or as many as the job has if it exists."""
        if spec.shards == 0:
            try:
                count = (await self.load_spec(spec.job)).shards
            except JobNotFoundError:
                count = await self.primaries()
            spec = msgspec.structs.replace(spec, shards=count)
        stored = await super().create_job(spec, generation=generation)
        if spec.shards > 1 and not shard_of(spec.job)[1]:
            for name in Shards.of(spec.job, spec.shards, spec.chunk).names[1:]:
                shard = msgspec.structs.replace(spec, job=name)
                await super().create_job(shard, generation=stored.generation)
        return stored

    async def enqueued_count(self, job: str) -> int:
        layout = await self.layout(job)
        return sum([await Registry.enqueued_count(self, name) for name in layout.names])

    async def resume_point(self, job: str) -> tuple[int, str | None]:
        """Where the producer goes on: after the last prompt its shards hold (the producer
        queues in input order, so every prompt before it is queued)."""
        layout = await self.layout(job)
        if layout.shards == 1:
            return await super().resume_point(job)
        best: tuple[int, str | None] = (0, None)
        for name in layout.names:
            async with redis_errors(self.url, name):
                at, digest = await self.redis.hmget(
                    self.keys.meta(name), [Meta.NEXT, Meta.INPUT_DIGEST]
                )
            if int(at or 0) > best[0]:
                best = (int(at or 0), None if digest is None else digest.decode())
        return best

    async def add_items(
        self,
        job: str,
        items: Sequence[PromptItem],
        digest: str = "",
        *,
        gen: str,
        affinity: Sequence[str] = (),
        chunk: int = 1,
        after: int | None = None,
    ) -> None:
        """Queue ``items`` (consecutive), each block's into its shard; ``digest`` (of the input
        up to the last of them) goes with the last block only: a shard whose block ends before
        keeps none, so that a resume there checks nothing rather than the wrong digest (the
        producer cuts its calls where blocks end, so each has one)."""
        layout = await self.layout(job) if items else Shards(job)
        if layout.shards == 1:
            await super().add_items(job, items, digest, gen=gen, affinity=affinity, chunk=chunk)
            return
        first, end = items[0].index, items[0].index + len(items)
        for lo, hi in layout.runs(first, end):
            part = slice(lo - first, hi - first)
            await super().add_items(
                layout.name_of(lo),
                items[part],
                digest if hi == end else "",
                gen=gen,
                affinity=affinity[part] if affinity else (),
                chunk=chunk,
                after=layout.after_before(lo),
            )

    async def seal(self, job: str, total: int, *, gen: str) -> None:
        """Seal each shard with its share of ``total``."""
        layout = await self.layout(job)
        for name, share in zip(layout.names, layout.shares(total), strict=True):
            await super().seal(name, share, gen=gen)

    async def status(self, job: str, *, rate: bool = True) -> JobStatus:
        layout = await self.layout(job)
        parts = [await Status.status(self, name, rate=rate) for name in layout.names]
        return parts[0] if layout.shards == 1 else combined(job, parts)

    async def unanswered_beside(self, layout: Shards, name: str) -> tuple[int, bool]:
        """Of ``layout``'s job, the prompts queued and not yet answered in its shards on the
        Redis server holding shard ``name`` (a Cluster node; one server holds them all), and
        whether the job was cancelled: the answers that server must keep room for (see
        :mod:`common.room`)."""
        names = layout.names
        if isinstance(self.redis, RedisCluster):
            node = self.redis.get_node_from_key(self.keys.meta(name)).name
            names = [
                n for n in names if self.redis.get_node_from_key(self.keys.meta(n)).name == node
            ]
        parts = [await Status.status(self, n, rate=False) for n in names]
        unanswered = sum(max(0, p.enqueued - p.done - p.failed) for p in parts)
        return unanswered, any(p.cancelled for p in parts)

    async def read_endpoints(self, job: str) -> list[EndpointStats]:
        layout = await self.layout(job)
        if layout.shards == 1:
            return await super().read_endpoints(job)
        stats = []
        for name in layout.names:
            stats += await Status.read_endpoints(self, name)
        return merged_endpoints(stats)

    async def fetch_results(
        self, job: str, start: int, count: int, *, leading: bool = False
    ) -> list[bytes | None]:
        layout = await self.layout(job)
        if layout.shards == 1:
            return await super().fetch_results(job, start, count, leading=leading)
        out: list[bytes | None] = []
        for lo, hi in layout.runs(start, start + count):
            out += await super().fetch_results(layout.name_of(lo), lo, hi - lo, leading=leading)
            if leading and None in out:
                break
        return out + [None] * (count - len(out))

    async def evict_results(self, job: str, start: int, end: int, *, gen: str) -> int:
        """Each shard's results among ``start .. end-1`` evicted, and every shard's mark
        raised to ``end``."""
        layout = await self.layout(job)
        if layout.shards == 1:
            return await super().evict_results(job, start, end, gen=gen)
        ranges: dict[str, list[tuple[int, int]]] = {name: [] for name in layout.names}
        for lo, hi in layout.runs(start, end):
            ranges[layout.name_of(lo)].append((lo, hi))
        marks = []
        for name, own in ranges.items():
            for lo, hi in own:
                await super().evict_results(name, lo, hi, gen=gen)
            marks.append(await super().evict_results(name, end, end, gen=gen))
        return min(marks)

    async def failed_indices(
        self, job: str, kinds: set[str] | None = None
    ) -> list[tuple[int, str]]:
        layout = await self.layout(job)
        found = []
        for name in layout.names:
            found += await Results.failed_indices(self, name, kinds)
        return sorted(found)

    async def cached_indices(self, job: str) -> list[int]:
        layout = await self.layout(job)
        found = []
        for name in layout.names:
            found += await Results.cached_indices(self, name)
        return sorted(found)

    async def requeue(self, job: str, failed: Sequence[tuple[int, str]], *, gen: str) -> int:
        layout = await self.layout(job)
        if layout.shards == 1:
            return await super().requeue(job, failed, gen=gen)
        kinds = dict(failed)
        n = 0
        for name, indices in layout.split(i for i, _ in failed).items():
            n += await super().requeue(name, [(i, kinds[i]) for i in indices], gen=gen)
        return n
