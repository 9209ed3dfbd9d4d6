"""The job store: every job operation on one Redis, shared by producer, workers and collector."""

from __future__ import annotations

from common.models import Result
from common.store.boards import Boards
from common.store.cache import ResponseCache
from common.store.connection import redis_errors
from common.store.delivery import Delivery
from common.store.entries import index_of
from common.store.feeding import Feeding
from common.store.lanes import Lanes
from common.store.outcomes import Outcomes
from common.store.registry import Registry
from common.store.results import Results
from common.store.stages import Stages
from common.store.status import Status
from common.store.steps import Steps
from common.store.tools import Tools
from common.vocab import FailureKind, Meta

__all__ = ["JobStore"]


class JobStore(
    Registry,
    Feeding,
    Delivery,
    Lanes,
    Results,
    Stages,
    Steps,
    Boards,
    Tools,
    Outcomes,
    Status,
    ResponseCache,
):
    """Job operations on one Redis (``JobStore(redis, keys)``), grouped by who uses them:
    :class:`Registry`, :class:`Feeding` (producer), :class:`Delivery` and :class:`Lanes` (workers),
    :class:`Results` (collector, retry), :class:`Stages` (reduce), :class:`Steps` (pipelines),
    :class:`Boards` (blackboards), :class:`Tools` (tool calls), :class:`Outcomes` (a
    workflow's inputs between their steps), :class:`Status`, and the :class:`ResponseCache`
    every job shares."""

    async def cancel(self, job: str) -> tuple[bool, int]:
        """Stop ``job``: every prompt not yet answered gets a failed result of kind ``cancelled``
        (its entry kept for ``swarm-retry``). Returns (newly cancelled, prompts cancelled now)."""
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
                        index=index_of(eid),
                        error="cancelled by operator (swarm-cancel)",
                        error_kind=FailureKind.CANCELLED,
                    ),
                    fields.get(b"d"),
                )
                for eid, fields in entries
            ]
            count += (await self.commit(job, batch, gen=gen)).failed
            # A commit trims only what was delivered: the undelivered entries go here.
            async with redis_errors(self.url, job):
                await self.redis.xdel(self.keys.stream(job), *(eid for eid, _ in entries))
