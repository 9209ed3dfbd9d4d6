"""The job store: every job operation on one Redis, each role's (see :mod:`common.store.roles`)."""

from __future__ import annotations

from swarm_queue.common.models import Result
from swarm_queue.common.store.batches import Batches
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.entries import decode_entry, entry_payloads, index_of
from swarm_queue.common.store.roles import CollectorStore, FlowStore, WorkerStore
from swarm_queue.common.vocab import FailureKind, Meta

__all__ = ["JobStore"]


class JobStore(FlowStore, WorkerStore, CollectorStore, Batches):
    """Every job operation on one Redis (``JobStore(redis, keys)``): each role's
    (:mod:`common.store.roles`), an operator's (cancel), and the Batch API's records
    (``swarm-gateway``)."""

    async def cancel(
        self, job: str, why: str = "cancelled by operator (swarm-cancel)"
    ) -> tuple[bool, int]:
        """Stop ``job``: every prompt not yet answered gets a failed result of kind ``cancelled``
        saying ``why`` (its entry kept for ``swarm-retry``). Returns (newly cancelled, prompts
        cancelled now); a job of several shards, each of them."""
        done = [await self._cancel_one(name, why) for name in (await self.layout(job)).names]
        return done[0][0], sum(n for _, n in done)

    async def _cancel_one(self, job: str, why: str) -> tuple[bool, int]:
        meta = self.keys.meta(job)
        gen = (await self.load_spec(job)).generation
        async with redis_errors(self.url, job):
            now = await self.server_time()
            newly = bool(await self.redis.hsetnx(meta, Meta.CANCELLED_S, f"{now:.3f}"))
            total = await self.redis.hget(meta, Meta.TOTAL)
        if total is None:  # the producer had not finished: the job ends where its input stopped
            await self.seal(job, await self.enqueued_count(job), gen=gen)
        count = 0
        while True:
            async with redis_errors(self.url, job):
                entries = await self.redis.xrange(self.keys.stream(job), count=1000)
            if not entries:
                return newly, count
            batch = [
                (
                    eid,
                    Result(
                        index=index_of(eid) + at,
                        error=why,
                        error_kind=FailureKind.CANCELLED,
                        custom_id=_custom_id(eid, payload),
                    ),
                    payload,
                )
                for eid, fields in entries
                for at, payload in enumerate(_payloads(fields.get(b"d")))
            ]
            count += (await self.commit(job, batch, gen=gen)).failed
            # A commit trims only what was delivered: the undelivered entries go here.
            async with redis_errors(self.url, job):
                await self.redis.xdel(self.keys.stream(job), *(eid for eid, _ in entries))


def _payloads(payload: bytes | None) -> list[bytes | None]:
    """The payload of each prompt of an entry (a chunk's in order; consecutive indices)."""
    parts = entry_payloads(payload)
    return [payload] if isinstance(parts, str) else parts


def _custom_id(entry_id: bytes, payload: bytes | None) -> str | None:
    """The custom_id of a queued prompt (None: none, or one that does not decode)."""
    item = decode_entry(entry_id, payload, chunked=True)
    return None if isinstance(item, str) else item.custom_id
