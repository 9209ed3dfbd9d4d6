"""Lanes: agent turns queued for the endpoint that served the turn before, whose engine holds
their prefix in its cache. A lane is a consumer of the job's group that no worker is
(:func:`common.keys.lane_name`): the pump hands a turn to it as it queues the turn, that
endpoint's drain loops take their lane's entries before anything new, and any endpoint with
nothing else to do takes entries that have waited in another's lane too long. Orphans are
reclaimed as ever, so a lane never holds an entry longer than the claim idle time."""

from __future__ import annotations

from swarm_queue.common.keys import GROUP
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.connection import redis_errors

__all__ = ["Lanes"]

# (entry_id, payload, deaths), as Delivery takes them.
Taken = tuple[bytes, bytes | None, int]


class Lanes(StoreBase):
    """Taking entries from lanes: one's own, or others' that waited too long."""

    async def take_lane(self, job: str, lane: str, consumer: str, count: int) -> list[Taken]:
        """Up to ``count`` entries waiting in ``lane``, claimed to ``consumer``."""
        async with redis_errors(self.url, job):
            flat = await self.scripts.lane_take(
                keys=[self.keys.stream(job)], args=[GROUP, lane, consumer, count]
            )
            return await self._marked(job, flat)

    async def steal_lanes(
        self, job: str, own_lane: str, consumer: str, count: int, min_idle_ms: int
    ) -> list[Taken]:
        """Up to ``count`` entries that waited at least ``min_idle_ms`` in lanes other than
        ``own_lane``, claimed to ``consumer``."""
        args = [GROUP, own_lane, consumer, count, min_idle_ms]
        async with redis_errors(self.url, job):
            flat = await self.scripts.lane_steal(keys=[self.keys.stream(job)], args=args)
            return await self._marked(job, flat)

    async def _marked(self, job: str, flat: list[bytes]) -> list[Taken]:
        """Claimed entries (ID, payload...) with their death marks (inside redis_errors)."""
        if not flat:
            return []
        ids, payloads = flat[::2], flat[1::2]
        marks = await self.redis.hmget(self.keys.running(job), ids)
        return [
            (eid, payload or None, int(n or 0))
            for eid, payload, n in zip(ids, payloads, marks, strict=True)
        ]
