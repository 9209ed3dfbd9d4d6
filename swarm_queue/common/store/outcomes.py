"""What a flow keeps of each input of a workflow job, beside its steps' own jobs: the input's
state between its steps, whether it waits outside the fleet (parked: in no queue, holding no
slot of any endpoint), and its outcome, written once, with the order inputs finished in. The
agents' flow keeps its agents here (flows/agents/flow.py); any flow whose inputs end in an
outcome of their own may."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import msgspec

from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.vocab import Meta

__all__ = ["OutcomeCounts", "Outcomes"]

EMPTY: Mapping[int, bytes] = MappingProxyType({})


class OutcomeCounts(msgspec.Struct, frozen=True):
    """A workflow job's inputs by state: ``active`` (a step queued or at an endpoint),
    ``parked`` (waiting outside the fleet), ``done`` (its outcome written)."""

    active: int
    parked: int
    done: int


class Outcomes(StoreBase):
    """The inputs of a workflow job between their steps, and their outcomes."""

    async def input_states(self, job: str, inputs: Sequence[int]) -> list[bytes | None]:
        """The states kept of ``inputs`` (None: none kept)."""
        if not inputs:
            return []
        async with redis_errors(self.url, job):
            key = self.keys.input_states(job)
            return list(await self.redis.hmget(key, [str(i) for i in inputs]))

    async def parked(self, job: str) -> dict[int, bytes]:
        """Every input of ``job`` parked, with what it waits on."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.parked(job))
        return {int(i): p for i, p in raw.items()}

    async def record_outcomes(
        self,
        job: str,
        *,
        gen: str,
        states: Mapping[int, bytes] = EMPTY,
        waits: Mapping[int, bytes] = EMPTY,
        results: Mapping[int, bytes] = EMPTY,
        unparked: Sequence[int] = (),
    ) -> int:
        """Write what a flow learnt of ``job``'s inputs at once (``lua/outcomes.lua``): their
        ``states``, the ``waits`` of inputs now parked, their outcomes (``results``: each
        once, in the order they finish; a finished input's state and wait go), and the inputs
        ``unparked``. Returns how many outcomes were new; :class:`JobGoneError` when ``job``
        is not of generation ``gen`` (its inputs are others now)."""
        if not (states or waits or results or unparked):
            return 0
        k = self.keys
        keys = [k.outcomes(job), k.input_states(job), k.parked(job), k.finished(job)]
        args: list[str | bytes | int] = [gen]
        for group in (states, waits, results):
            args.append(len(group))
            args += [x for i, blob in group.items() for x in (str(i), blob)]
        args += [str(i) for i in unparked]
        async with redis_errors(self.url, job):
            return int(await self.scripts.outcomes(keys=[*keys, k.meta(job)], args=args))

    async def finished_since(
        self, job: str, after: bytes, count: int = 1000
    ) -> tuple[list[int], bytes]:
        """The inputs that finished after the entry ``after`` (``b"0"``: from the first), in
        that order, and the last entry read."""
        async with redis_errors(self.url, job):
            reply = await self.redis.xrange(
                self.keys.finished(job), b"(" + after if after != b"0" else b"-", count=count
            )
        if not reply:
            return [], after
        return [int(f[b"a"]) for _, f in reply], reply[-1][0]

    async def outcomes(self, job: str, start: int, count: int) -> list[bytes | None]:
        """The outcomes of inputs ``start .. start+count-1`` (None: not finished)."""
        async with redis_errors(self.url, job):
            return list(
                await self.redis.hmget(
                    self.keys.outcomes(job), [str(i) for i in range(start, start + count)]
                )
            )

    async def outcomes_of(self, job: str, inputs: Sequence[int]) -> list[bytes | None]:
        """The outcomes of ``inputs`` (None: not finished)."""
        if not inputs:
            return []
        async with redis_errors(self.url, job):
            return list(await self.redis.hmget(self.keys.outcomes(job), [str(i) for i in inputs]))

    async def outcome_counts(self, job: str) -> OutcomeCounts:
        """``job``'s inputs by state, in one round trip (its inputs are its first step's)."""
        k = self.keys
        async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
            pipe.hlen(k.outcomes(job))
            pipe.hlen(k.parked(job))
            pipe.hget(k.meta(job), Meta.ENQUEUED)
            done, parked, enqueued = await pipe.execute()
        return OutcomeCounts(max(0, int(enqueued or 0) - done - parked), parked, done)

    async def outcomes_count(self, job: str) -> int:
        """How many of ``job``'s inputs have their outcome."""
        async with redis_errors(self.url, job):
            return int(await self.redis.hlen(self.keys.outcomes(job)))
