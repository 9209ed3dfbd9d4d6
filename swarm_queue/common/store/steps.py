"""Pipeline steps: a step's answers, as its commits append them to its ``landed`` stream, taken
by the pump of the next step and moved into it, once each (see ``lua/move.lua``)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from redis.exceptions import ResponseError

from swarm_queue.common.errors import JobConflictError
from swarm_queue.common.keys import GROUP, PUMP_GROUP
from swarm_queue.common.models import PromptItem, encode
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_code, redis_errors

__all__ = ["Landed", "Move", "Steps"]


class Landed(msgspec.Struct, frozen=True):
    """One answer of a step as its commit appended it: the ``landed`` entry's ID, the answered
    prompt's index in the step and its queued entry (None if unreadable)."""

    entry_id: bytes
    index: int
    payload: bytes | None


class Move(msgspec.Struct, frozen=True):
    """What becomes of one input index at the next step: ``item`` queued (handed to
    ``lane`` if one is named: see :mod:`common.store.lanes`), or dropped with ``reason``."""

    origin: int
    item: PromptItem | None = None
    reason: str = ""
    lane: str = ""


class StepMap(StoreBase):
    """Where a workflow's inputs are in a later step: each input's item there, each item's
    input, why an input was not queued there; the raw results of a step's items. What a flow
    moving answers on and a collector following inputs through the steps both read."""

    async def results_at(self, job: str, indices: Sequence[int]) -> list[bytes | None]:
        """Raw result blobs of ``indices`` (None where there is none)."""
        return await self.result_blobs(job, indices)

    async def step_indices(self, job: str, origins: Sequence[int]) -> list[int | None]:
        """Each input index's item index in step ``job`` (None: not queued there)."""
        if not origins:
            return []
        async with redis_errors(self.url, job):
            raw = await self.redis.hmget(self.keys.fed(job), [str(o) for o in origins])
        return [None if r is None else int(r) for r in raw]

    async def step_origins(self, job: str) -> dict[int, int]:
        """Step ``job``'s item indices -> the input index each came from."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.fed(job))
        return {int(i): int(o) for o, i in raw.items()}

    async def drop_reasons(self, job: str, origins: Sequence[int]) -> list[str | None]:
        """Why each input index was not queued into step ``job`` (None: it was not dropped)."""
        if not origins:
            return []
        async with redis_errors(self.url, job):
            raw = await self.redis.hmget(self.keys.dropped(job), [str(o) for o in origins])
        return [None if r is None else r.decode(errors="replace") for r in raw]


class Steps(StepMap):
    """Moving a step's answers, as they land, into the job its flow feeds."""

    async def ensure_pump_group(self, job: str) -> None:
        """Create the pump's consumer group on ``job``'s landed stream unless it exists."""
        async with redis_errors(self.url, job):
            try:
                await self.redis.xgroup_create(
                    self.keys.landed(job), PUMP_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if redis_code(exc) != "BUSYGROUP":
                    raise

    async def take_landed(self, job: str, consumer: str, count: int) -> list[Landed]:
        """Up to ``count`` answers of step ``job`` not yet moved on: first any a pump took and
        never acknowledged (it died: the one pump of a step holds its lock, so whatever is
        pending is a dead one's), then new ones."""
        stream = self.keys.landed(job)
        async with redis_errors(self.url, job):
            reply = await self.redis.xautoclaim(
                stream, PUMP_GROUP, consumer, 0, start_id="0-0", count=count
            )
            entries = list(reply[1])
            if not entries:
                read = await self.redis.xreadgroup(PUMP_GROUP, consumer, {stream: ">"}, count)
                entries = list(read[0][1]) if read else []
        out = []
        for eid, fields in entries:
            raw = (fields or {}).get(b"i", b"")
            out.append(
                Landed(eid, int(raw) if raw.isdigit() else -1, (fields or {}).get(b"d") or None)
            )
        return out

    async def ack_landed(self, job: str, ids: Sequence[bytes]) -> None:
        """Acknowledge (and delete) answers of ``job`` taken from its landed stream that move
        nowhere (the agent finished, or waits on tools)."""
        if ids:
            stream = self.keys.landed(job)
            # No MULTI (a Redis Cluster client has none): an entry acknowledged and left
            # undeleted is never delivered again, and the next ack deletes nothing twice.
            async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
                pipe.xack(stream, PUMP_GROUP, *ids)
                pipe.xdel(stream, *ids)
                await pipe.execute()

    async def landed_backlog(self, job: str) -> bool:
        """True while step ``job`` has answers not yet moved on (taken or not)."""
        async with redis_errors(self.url, job):
            pending, undelivered, *_ = await self.scripts.backlog(
                keys=[self.keys.landed(job)], args=[PUMP_GROUP]
            )
        return int(pending) > 0 or bool(undelivered)

    async def moved(self, job: str, origins: Sequence[int]) -> set[int]:
        """The input indices among ``origins`` already queued into, or dropped before, step
        ``job``."""
        if not origins:
            return set()
        fields = [str(o) for o in origins]
        async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self.keys.fed(job), fields)
            pipe.hmget(self.keys.dropped(job), fields)
            fed, dropped = await pipe.execute()
        return {o for o, f, d in zip(origins, fed, dropped, strict=True) if f or d}

    async def move_on(
        self,
        source: str,
        target: str,
        first: int,
        moves: Sequence[Move],
        acked: Sequence[bytes],
        *,
        gen: str,
    ) -> int:
        """Queue ``moves`` into step ``target`` (items numbered from ``first``, as ``target``
        holds ``first`` items now) and acknowledge ``acked`` on ``source``'s landed stream, in
        one step; returns the items ``target`` holds. :class:`JobConflictError` when another
        pump moved some of them, or from another starting point, meanwhile (read again);
        :class:`JobGoneError` when ``target`` is not of generation ``gen``."""
        k = self.keys
        keys = [k.meta(target), k.stream(target), k.fed(target), k.dropped(target)]
        keys += [k.landed(source), k.running(target)]
        args: list[bytes | str | int] = [gen, first, PUMP_GROUP, GROUP, len(acked), *acked]
        for m in moves:
            if m.item is not None:
                args += [m.origin, f"@{m.lane}" if m.lane else "+", encode(m.item)]
            else:
                args += [m.origin, "-", m.reason]
        async with redis_errors(self.url, target):
            status, value = await self.scripts.move(keys=keys, args=args)
        if int(status) == -2:
            raise JobConflictError(f"step {target!r} holds {int(value)} items, not {first}")
        if int(status) == -3:
            raise JobConflictError(f"input {int(value)} was moved into {target!r} meanwhile")
        return int(value)
