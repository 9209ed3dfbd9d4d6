"""What every part of the job store shares: the client, the key names, the scripts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Self

import msgspec
from redis.asyncio.cluster import RedisCluster

from swarm_queue.common.errors import BadRecordError, ConfigError, StoreCommandDenied
from swarm_queue.common.keys import ARQ_ABORT, Keys
from swarm_queue.common.models import JobSpec, decode_spec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.connection import (
    Client,
    connect,
    connection_losses,
    reachable,
)
from swarm_queue.common.store.resultfields import block_of, chunk_field, split_chunk
from swarm_queue.common.store.scripts import Scripts
from swarm_queue.common.vocab import Meta

__all__ = ["ACL_COMMANDS", "Memory", "StoreBase", "acl_rules", "spec_of"]

log = logging.getLogger("swarm.store")


# The command rules of a project's ACL user (docs/HPC.md): everything but the dangerous
# commands, except INFO, which arq's worker reads once at its start.
ACL_COMMANDS = ("&*", "+@all", "-@dangerous", "+info")


def acl_rules(keys: Keys) -> str:
    """The ACL rules a Redis user of ``keys``' prefix needs, as redis-server's ``--user``
    takes them (quoted for a shell)."""
    return " ".join(f"'{rule}'" for rule in (*(f"~{p}" for p in keys.acl_keys), *ACL_COMMANDS))


class Memory(msgspec.Struct, frozen=True):
    """A Redis server's memory as its INFO shows it: bytes used, its ``maxmemory`` (0: no
    limit) and what it does when full (``maxmemory-policy``)."""

    used: int
    maxmemory: int
    policy: str


class StoreBase:
    """One Redis client under one key prefix; the parts of :class:`JobStore` build on it."""

    def __init__(self, redis: Client, keys: Keys, url: str = "") -> None:
        self.redis = redis
        self.keys = keys
        self.url = url
        self.scripts = Scripts(redis)
        self._warned: set[str] = set()  # bad records already logged once
        self._packing: dict[str, int] = {}  # job -> its chunk, where it was seen packing them

    @classmethod
    def from_settings(
        cls, settings: Settings, *, patient: bool = True, connections: int | None = None
    ) -> Self:
        """The store of ``settings``' Redis and key prefix (see :func:`connect` for patience
        and ``connections``)."""
        redis = connect(
            settings.redis_url,
            patient=patient,
            ca_file=settings.redis_ca_file,
            cluster=settings.redis_cluster,
            connections=connections,
        )
        return cls(redis, settings.keys, settings.redis_url)

    async def close(self) -> None:
        await self.redis.aclose()

    def warn_once(self, what: str, why: str) -> None:
        """Log, the first time for ``what``, that a bad record is skipped and why."""
        if what not in self._warned:
            self._warned.add(what)
            log.warning("skipping %s: %s", what, why)

    def skip_unreadable_meta(self, job: str) -> None:
        """``job``'s meta is no hash (another tool's key under its name): it is no job."""
        self.warn_once(f"job {job}", f"its meta {self.keys.meta(job)!r} is unreadable")

    @property
    def reachable(self) -> bool:
        """Whether Redis answered this store's last attempt (False from the first failure of
        an outage, while commands still wait it out)."""
        return reachable(self.redis)

    @property
    def connection_losses(self) -> int:
        """How many of this store's attempts failed on a lost connection so far (each tried
        again on a new one): a stream read's reply lost so may have delivered entries."""
        return connection_losses(self.redis)

    async def server_time(self) -> float:
        """Redis's clock, in seconds: what every time stored or compared across machines is
        taken from (a worker's clock may be hours off the others')."""
        async with redis_errors(self.url):
            reply = await self.redis.time()
        if isinstance(reply, dict):  # a Cluster client may ask every node: any one will do
            reply = next(iter(reply.values()))
        seconds, micros = reply
        return round(float(seconds) + float(micros) / 1e6, 3)

    def on_job_node(self, job: str) -> dict[str, Any]:
        """The keyword that sends a node-wide command (INFO, SCAN) to the node holding
        ``job``'s keys on a Cluster (all of them share its hash tag); none on one server. Not
        "every primary": that goes by the client's idea of which nodes are primaries, seen
        wrong for a while after a failover."""
        if isinstance(self.redis, RedisCluster):
            return {"target_nodes": self.redis.get_node_from_key(self.keys.meta(job))}
        return {}

    async def memory(self, job: str) -> Memory | None:
        """How full the Redis server holding ``job``'s keys is (on a Cluster, their node's);
        None when the user's ACL forbids INFO (``-@dangerous``), which touches no key."""
        kwargs = self.on_job_node(job)
        try:
            async with redis_errors(self.url):
                info = await self.redis.info("memory", **kwargs)
        except StoreCommandDenied:
            return None
        if info and all(isinstance(v, dict) for v in info.values()):  # per node: the one asked
            info = next(iter(info.values()))
        return Memory(
            used=int(info.get("used_memory", 0)),
            maxmemory=int(info.get("maxmemory", 0)),
            policy=str(info.get("maxmemory_policy", "")),
        )

    async def check_worker_access(self) -> None:
        """Fail at once, naming the ACL rules a worker needs, if this Redis user may not do
        what arq's worker does first (INFO, its queue's and its own fixed keys): else arq
        ends in a traceback, or a worker starts that can never serve its queue."""
        try:
            async with redis_errors(self.url):
                await self.redis.info("server")
                await self.redis.exists(self.keys.arq_health_check, ARQ_ABORT)
        except StoreCommandDenied as exc:
            raise StoreCommandDenied(
                f"{exc}. A worker's Redis user needs these ACL rules: {acl_rules(self.keys)}"
            ) from None

    async def ping(self) -> None:
        """Reach Redis once: StoreAccessDenied for wrong credentials (at once), else
        StoreUnavailable after the client's patience."""
        async with redis_errors(self.url):
            await self.redis.ping()

    async def result_blobs(
        self, job: str, indices: Sequence[int], *, leading: bool = False
    ) -> list[bytes | None]:
        """The raw result of each of ``indices`` (None where there is none), wherever it is
        kept: in its own field, or in its chunk's (common/store/resultfields.py). The one
        reader of a job's results hash. A job last seen packing its chunks is read by its
        chunks' fields first (a sixteenth of the fields a poll asks for), then the fields of
        the indices those did not hold; any other by its indices' fields, then the chunks'
        fields of those missing. The job's layout is read in the same round trip as the
        first fields, and a layout that is not the one assumed is read again by it.
        ``leading``: only the results up to the first one missing are wanted (a collector's,
        which stops there): those after it may be left None."""
        if not indices:
            return []
        key = self.keys.results(job)
        async with redis_errors(self.url, job):
            chunk, blocks, got = await self._first_read(job, indices)
            if blocks:
                out = self._from_chunks(indices, blocks, got, chunk)
                await self._loose(key, indices, out, chunk, leading)
                return out
            out = list(got)
            if not chunk or all(b is not None for b in out):
                return out
            blocks = sorted(
                {block_of(i, chunk) for i, b in zip(indices, out, strict=True) if b is None}
            )
            fields = await self.redis.hmget(key, [chunk_field(b) for b in blocks])
        for k, b in enumerate(self._from_chunks(indices, blocks, fields, chunk)):
            out[k] = out[k] if out[k] is not None else b
        return out

    async def _first_read(
        self, job: str, indices: Sequence[int]
    ) -> tuple[int, list[int], list[bytes | None]]:
        """The job's chunk if it packs them (else 0), with the fields read beside it: its
        chunks' (the blocks, returned) where the job was seen packing them last and still
        does, else its indices' (no blocks). A layout other than the one assumed is learned,
        and the fields read again by it."""
        key = self.keys.results(job)
        for _ in range(3):
            assumed = self._packing.get(job, 0)
            blocks = sorted({block_of(i, assumed) for i in indices}) if assumed else []
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.meta(job), [Meta.CHUNK, Meta.PACKED])
                pipe.hmget(key, [chunk_field(b) for b in blocks] or [str(i) for i in indices])
                (chunk_raw, packed), got = await pipe.execute()
            chunk = int(chunk_raw or 1) if packed == b"1" else 0
            chunk = chunk if chunk > 1 else 0
            if chunk == assumed or not blocks:  # (read by index: any layout's first read)
                self._learn_packing(job, chunk)
                return chunk, blocks, got
            self._learn_packing(job, chunk)
        return chunk, [], await self.redis.hmget(key, [str(i) for i in indices])

    async def _loose(
        self, key: str, indices: Sequence[int], out: list[bytes | None], chunk: int, leading: bool
    ) -> None:
        """Fill ``out`` (``indices``' results as their chunks' fields held them) from the
        indices' own fields, for the chunks that held none. ``leading``: only the results up
        to the first missing one are wanted, so the chunks are read in order, 1, 2, 4... at a
        time, up to one with a prompt unanswered (the rest are left None): a collector's poll
        does not read a field for each prompt of the chunks not answered yet."""
        todo = sorted({block_of(indices[k], chunk) for k, b in enumerate(out) if b is None})
        step = 1 if leading else len(todo)
        while todo:
            now, todo = set(todo[:step]), todo[step:]
            ks = [k for k, b in enumerate(out) if b is None and block_of(indices[k], chunk) in now]
            loose = await self.redis.hmget(key, [str(indices[k]) for k in ks])
            for k, b in zip(ks, loose, strict=True):
                out[k] = b
            if leading and any(b is None for b in loose):
                return
            step *= 2

    @staticmethod
    def _from_chunks(
        indices: Sequence[int], blocks: list[int], fields: list[bytes | None], chunk: int
    ) -> list[bytes | None]:
        """Each of ``indices``' result held by ``blocks``' chunk fields (read as ``fields``)."""
        held = {b: split_chunk(v, chunk) for b, v in zip(blocks, fields, strict=True) if v}
        out: list[bytes | None] = []
        for i in indices:
            found = held.get(block_of(i, chunk))
            out.append(None if found is None else found[i % chunk])
        return out

    def _learn_packing(self, job: str, chunk: int) -> None:
        """Remember whether ``job`` packs its chunks (``chunk``: its chunk, else 0)."""
        if not chunk:
            self._packing.pop(job, None)
            return
        if len(self._packing) >= 4096:  # (a store that reads many jobs: forget the oldest)
            del self._packing[next(iter(self._packing))]
        self._packing[job] = chunk

    def script_keys(self, job: str) -> list[str]:
        """KEYS of the commit and retry scripts, in their order: results, meta, stream, failed,
        cached, running, reopened, chunks."""
        k = self.keys
        return [
            k.results(job),
            k.meta(job),
            k.stream(job),
            k.failed(job),
            k.cached(job),
            k.running(job),
            k.reopened(job),
            k.chunks(job),
        ]


def spec_of(job: str, raw: bytes) -> JobSpec:
    """The stored spec of ``job``; an unreadable one is a :class:`BadRecordError`."""
    try:
        return decode_spec(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, ConfigError) as exc:
        raise BadRecordError(f"job {job!r}: its spec in Redis cannot be read: {exc}", job) from None
