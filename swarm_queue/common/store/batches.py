"""The OpenAI Batch API's records in Redis (``swarm-gateway``): each project's files and
batches, which batches are not over yet, and which gateway process drives each.

All under one hash tag (``{~batches}``: a few small records per batch, in one Cluster slot).
A batch's record is written by the one process holding its lease; a cancel is a field of its
own beside it, written once by whoever asks, so neither writes over the other.
"""

from __future__ import annotations

from swarm_queue.common.batchapi import (
    BatchObject,
    FileObject,
    decode_batch,
    decode_file,
    encode,
)
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors

__all__ = ["Batches", "StoredBatch"]

_OBJ, _CANCEL, _PREFIX = "obj", "cancel", "prefix"


class StoredBatch:
    """A batch as stored: its object, the key prefix its job is queued under, and when a
    cancel was asked (None: never)."""

    __slots__ = ("batch", "cancel_at", "prefix")

    def __init__(self, batch: BatchObject, prefix: str, cancel_at: int | None) -> None:
        self.batch = batch
        self.prefix = prefix
        self.cancel_at = cancel_at


class Batches(StoreBase):
    """Files, batches and their leases, per project."""

    async def put_file(self, project: str, file: FileObject) -> None:
        """Keep ``file``'s record, and its expiry where it has one."""
        keys = [self.keys.batch_files(project), self.keys.batch_expiring]
        async with (
            redis_errors(self.url, "", *keys),
            self.redis.pipeline(transaction=True) as tx,
        ):
            # A value of bytes, as redis-py sends it (its annotation says str).
            tx.hset(keys[0], file.id, encode(file))  # type: ignore[arg-type]
            if file.expires_at is not None:
                tx.zadd(keys[1], {f"{project}/{file.id}": file.expires_at})
            await tx.execute()

    async def expired(self, now: int) -> list[tuple[str, str]]:
        """``(project, file id)`` of the files whose expiry is ``now`` or before."""
        key = self.keys.batch_expiring
        async with redis_errors(self.url, "", key):
            raw = await self.redis.zrangebyscore(key, "-inf", now)
        return [(p, f) for p, _, f in (m.decode().partition("/") for m in raw)]

    async def file(self, project: str, file_id: str) -> FileObject | None:
        key = self.keys.batch_files(project)
        async with redis_errors(self.url, "", key):
            raw = await self.redis.hget(key, file_id)
        return None if raw is None else decode_file(raw)

    async def files(self, project: str) -> list[FileObject]:
        """``project``'s files, oldest first."""
        key = self.keys.batch_files(project)
        async with redis_errors(self.url, "", key):
            raw = await self.redis.hvals(key)
        return sorted((decode_file(r) for r in raw), key=lambda f: (f.created_at, f.id))

    async def delete_file(self, project: str, file_id: str) -> bool:
        keys = [self.keys.batch_files(project), self.keys.batch_expiring]
        async with (
            redis_errors(self.url, "", *keys),
            self.redis.pipeline(transaction=True) as tx,
        ):
            tx.hdel(keys[0], file_id)
            tx.zrem(keys[1], f"{project}/{file_id}")
            deleted, _ = await tx.execute()
        return bool(deleted)

    async def create_batch(self, project: str, batch: BatchObject, prefix: str) -> None:
        """Keep a new batch (its job to be queued under ``prefix``), list it first in its
        project's order, and mark it to be driven."""
        keys = [
            self.keys.batch(project, batch.id),
            self.keys.batch_order(project),
            self.keys.batches_active,
        ]
        async with (
            redis_errors(self.url, "", *keys),
            self.redis.pipeline(transaction=True) as tx,
        ):
            tx.hset(keys[0], mapping={_OBJ: encode(batch), _PREFIX: prefix})
            tx.lpush(keys[1], batch.id)
            tx.sadd(keys[2], f"{project}/{batch.id}")
            await tx.execute()

    async def batch(self, project: str, batch_id: str) -> StoredBatch | None:
        key = self.keys.batch(project, batch_id)
        async with redis_errors(self.url, "", key):
            obj, prefix, cancel = await self.redis.hmget(key, [_OBJ, _PREFIX, _CANCEL])
        if obj is None or prefix is None:
            return None
        asked = None if cancel is None else int(cancel)
        return StoredBatch(decode_batch(obj), prefix.decode(), asked)

    async def save_batch(self, project: str, batch: BatchObject) -> None:
        """Write the batch's object (its driver's alone); once it is over, it is driven no
        more."""
        key = self.keys.batch(project, batch.id)
        async with (
            redis_errors(self.url, "", key, self.keys.batches_active),
            self.redis.pipeline(transaction=True) as tx,
        ):
            # A value of bytes, as redis-py sends it (its annotation says str).
            tx.hset(key, _OBJ, encode(batch))  # type: ignore[arg-type]
            if batch.status.over:
                tx.srem(self.keys.batches_active, f"{project}/{batch.id}")
            await tx.execute()

    async def ask_cancel(self, project: str, batch_id: str, at: int) -> int:
        """Note that a cancel of the batch was asked at ``at`` (the first time counts); returns
        when it was first asked."""
        key = self.keys.batch(project, batch_id)
        async with redis_errors(self.url, "", key):
            await self.redis.hsetnx(key, _CANCEL, str(at))
            first = await self.redis.hget(key, _CANCEL)
        return int(first) if first is not None else at

    async def batch_ids(self, project: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` of ``project``'s batch ids, newest first, after the id ``after``
        (none: from the newest; an id not listed: none)."""
        key = self.keys.batch_order(project)
        async with redis_errors(self.url, "", key):
            start = 0
            if after is not None:
                at = await self.redis.lpos(key, after)
                if at is None:
                    return []
                start = int(at) + 1
            raw = await self.redis.lrange(key, start, start + limit - 1)
        return [r.decode() for r in raw]

    async def active_batches(self) -> list[tuple[str, str]]:
        """``(project, batch id)`` of every batch not over yet."""
        async with redis_errors(self.url, "", self.keys.batches_active):
            raw = await self.redis.smembers(self.keys.batches_active)
        out = []
        for r in raw:
            project, _, batch_id = r.decode().partition("/")
            out.append((project, batch_id))
        return sorted(out)

    async def hold_lease(self, batch_id: str, token: str, ttl_ms: int) -> bool:
        """Take or keep the lease of driving ``batch_id``; False while another holds it."""
        key = self.keys.batch_lease(batch_id)
        async with redis_errors(self.url, "", key):
            other = await self.scripts.lock(keys=[key], args=[token, ttl_ms])
        return other is None

    async def drop_lease(self, batch_id: str, token: str) -> None:
        """Let go of the lease of driving ``batch_id``, if ``token`` holds it."""
        key = self.keys.batch_lease(batch_id)
        async with redis_errors(self.url, "", key):
            await self.scripts.lock(keys=[key], args=[token, 0])
