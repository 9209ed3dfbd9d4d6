"""Lanes: entries queued for the endpoint whose engine holds their prefix in its cache. A lane
is a consumer of the job's group that no worker is (:func:`common.keys.lane_name`). An agent's
turn is handed to the lane of the endpoint that served the turn before, by the pump as it
queues the turn; a prompt of an affinity key (:mod:`common.affinity`) to the lane of the
endpoint the key was given to (the live one holding the fewest keys), by whichever endpoint
reads it.
An endpoint's drain loops take their lane's entries before anything new, and any endpoint with
nothing else to do takes entries that have waited in another's lane too long, or that an
endpoint too busy for them handed on to the open lane. Orphans are reclaimed as ever, so a
lane never holds an entry longer than the claim idle time."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from swarm_queue.common.keys import GROUP, OPEN_LANE
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.entries import deaths, id_key

__all__ = ["Hungry", "Lanes"]

# The most entries of one lane a steal looks at for whole groups of one affinity key.
STEAL_SCAN = 1024

# (entry_id, payload, deaths), as Delivery takes them.
Taken = tuple[bytes, bytes | None, int]


class Hungry(msgspec.Struct, frozen=True):
    """What an endpoint with nothing to do says of its pace (seconds a completion token;
    0.0: not known): from a request's start to its answer, its engine's queue counted
    (``pace_s``), and its decoding alone (``decode_s``, from the gaps between the answers
    of one batch of requests); and its lane, so that an endpoint never takes its own word
    for another's."""

    pace_s: float = 0.0
    decode_s: float = 0.0
    lane: str = ""


_encode_hungry = msgspec.msgpack.Encoder().encode
_decode_hungry = msgspec.msgpack.Decoder(Hungry).decode


class Lanes(StoreBase):
    """Taking entries from lanes: one's own, or others' that waited too long; and handing
    new entries of another endpoint's affinity key to its lane."""

    async def route(
        self, job: str, lane: str, live: Sequence[str], keyed: Sequence[tuple[bytes, str]]
    ) -> set[bytes]:
        """Send each of ``keyed`` (an entry just read by the endpoint of ``lane``, and its
        affinity key) to the lane its key is given to, among the ``live`` lanes (see
        ``route.lua``): the entries handed to other lanes."""
        if not keyed:
            return set()
        args = [GROUP, lane, len(live), *live, *(x for pair in keyed for x in pair)]
        async with redis_errors(self.url, job):
            keys = [self.keys.stream(job), self.keys.owners(job), self.keys.running(job)]
            return set(await self.scripts.route(keys=keys, args=args))

    async def keyed(self, job: str) -> bool:
        """Whether some of ``job``'s affinity keys have been given to lanes (its lanes may hold
        entries: what a worker that never read a keyed entry of it must know)."""
        async with redis_errors(self.url, job):
            return bool(await self.redis.exists(self.keys.owners(job)))

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
        ``own_lane``, claimed to ``consumer``: of the oldest (four times ``count`` a lane),
        those of one affinity key together, so a prefix taken over is computed once."""
        args = [GROUP, own_lane, consumer, count, min_idle_ms, min(4 * count, STEAL_SCAN)]
        async with redis_errors(self.url, job):
            flat = await self.scripts.lane_steal(keys=[self.keys.stream(job)], args=args)
            return await self._marked(job, flat)

    async def give_back(
        self, job: str, consumer: str, entry_ids: Sequence[bytes], *, idle_ms: int, gen: str
    ) -> int:
        """Hand ``consumer``'s entries ``entry_ids`` (those it still holds) to the open lane,
        as if they had waited ``idle_ms`` there (the lane wait: others take them at once);
        how many were handed on. :class:`JobGoneError` for work of another generation."""
        if not entry_ids:
            return 0
        ids = sorted(entry_ids, key=id_key)
        keys = [self.keys.stream(job), self.keys.running(job), self.keys.meta(job)]
        args = [GROUP, consumer, OPEN_LANE, idle_ms, gen, *ids]
        async with redis_errors(self.url, job):
            return int(await self.scripts.give_back(keys=keys, args=args))

    async def note_hungry(self, job: str, ttl_ms: int, said: Hungry) -> None:
        """Say for ``ttl_ms`` that an endpoint has nothing to do but ``job``'s laned turns
        held elsewhere, and its paces."""
        async with redis_errors(self.url, job):
            await self.redis.set(self.keys.hungry(job), _encode_hungry(said), px=ttl_ms)

    async def hungry(self, job: str, asker: str) -> Hungry | None:
        """The paces of an endpoint that said lately it has nothing to do but ``job``'s
        turns held elsewhere, or None: nobody did, or the last to say so was the asking
        endpoint (lane ``asker``) itself, since busy again."""
        async with redis_errors(self.url, job):
            raw = await self.redis.get(self.keys.hungry(job))
        if raw is None:
            return None
        try:
            said = _decode_hungry(raw)
        except msgspec.DecodeError:
            return Hungry()  # another tool's value (or an older worker's): paces not known
        if said.lane == asker:
            return None
        return Hungry(max(0.0, said.pace_s), max(0.0, said.decode_s), said.lane)

    async def _marked(self, job: str, flat: list[bytes]) -> list[Taken]:
        """Claimed entries (ID, payload...) with their death marks (inside redis_errors)."""
        if not flat:
            return []
        ids, payloads = flat[::2], flat[1::2]
        marks = await self.redis.hmget(self.keys.running(job), ids)
        return [
            (eid, payload or None, deaths(n))
            for eid, payload, n in zip(ids, payloads, marks, strict=True)
        ]
