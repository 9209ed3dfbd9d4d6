"""Agents: each agent's state between its turns, the agents waiting on tool calls (they hold
no slot of any endpoint), and each agent's result, written once (see flows/agents.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import msgspec

from common.store.base import StoreBase
from common.store.connection import redis_errors
from common.vocab import Meta

__all__ = ["AgentCounts", "Agents"]

EMPTY: Mapping[int, bytes] = MappingProxyType({})


class AgentCounts(msgspec.Struct, frozen=True):
    """An agent job's agents by state, as swarm-status, the dashboard and the metrics show
    them: ``thinking`` (a turn queued or at an endpoint), ``waiting`` for a tool (in no queue,
    holding no slot), ``done`` (finished, with an output or a failure)."""

    thinking: int
    waiting: int
    done: int


class Agents(StoreBase):
    """An agent job's agents between their turns."""

    async def agent_states(self, job: str, agents: Sequence[int]) -> list[bytes | None]:
        if not agents:
            return []
        async with redis_errors(self.url, job):
            return list(await self.redis.hmget(self.keys.agents(job), [str(a) for a in agents]))

    async def parked(self, job: str) -> dict[int, bytes]:
        """Every agent of ``job`` waiting on tool calls."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.agents_waiting(job))
        return {int(a): p for a, p in raw.items()}

    async def record_agents(
        self,
        job: str,
        *,
        gen: str,
        states: Mapping[int, bytes] = EMPTY,
        waits: Mapping[int, bytes] = EMPTY,
        results: Mapping[int, bytes] = EMPTY,
        unparked: Sequence[int] = (),
    ) -> int:
        """Write what a pump learnt of ``job``'s agents at once (``lua/agents.lua``): their
        ``states``, the ``waits`` of agents now waiting on tool calls, their ``results``
        (each once, in the order they finish; a finished agent's state and wait go), and the
        agents ``unparked``. Returns how many results were new; :class:`JobGoneError` when
        ``job`` is not of generation ``gen`` (its agents are others now)."""
        if not (states or waits or results or unparked):
            return 0
        k = self.keys
        keys = [k.agents_done(job), k.agents(job), k.agents_waiting(job), k.agents_finished(job)]
        args: list[str | bytes | int] = [gen]
        for group in (states, waits, results):
            args.append(len(group))
            args += [x for a, blob in group.items() for x in (str(a), blob)]
        args += [str(a) for a in unparked]
        async with redis_errors(self.url, job):
            return int(await self.scripts.agents(keys=[*keys, k.meta(job)], args=args))

    async def finished_since(
        self, job: str, after: bytes, count: int = 1000
    ) -> tuple[list[int], bytes]:
        """The agents that finished after the entry ``after`` (``b"0"``: from the first), in
        that order, and the last entry read."""
        async with redis_errors(self.url, job):
            reply = await self.redis.xrange(
                self.keys.agents_finished(job), b"(" + after if after != b"0" else b"-", count=count
            )
        if not reply:
            return [], after
        return [int(f[b"a"]) for _, f in reply], reply[-1][0]

    async def agent_results(self, job: str, start: int, count: int) -> list[bytes | None]:
        """The results of agents ``start .. start+count-1`` (None: not finished)."""
        async with redis_errors(self.url, job):
            return list(
                await self.redis.hmget(
                    self.keys.agents_done(job), [str(a) for a in range(start, start + count)]
                )
            )

    async def agent_results_of(self, job: str, agents: Sequence[int]) -> list[bytes | None]:
        """The results of ``agents`` (None: not finished)."""
        if not agents:
            return []
        async with redis_errors(self.url, job):
            return list(
                await self.redis.hmget(self.keys.agents_done(job), [str(a) for a in agents])
            )

    async def agent_counts(self, job: str) -> AgentCounts:
        """``job``'s agents by state, in one round trip (its agents are its first turns)."""
        k = self.keys
        async with redis_errors(self.url, job), self.redis.pipeline(transaction=False) as pipe:
            pipe.hlen(k.agents_done(job))
            pipe.hlen(k.agents_waiting(job))
            pipe.hget(k.meta(job), Meta.ENQUEUED)
            done, waiting, enqueued = await pipe.execute()
        return AgentCounts(max(0, int(enqueued or 0) - done - waiting), waiting, done)

    async def agents_finished(self, job: str) -> int:
        async with redis_errors(self.url, job):
            return int(await self.redis.hlen(self.keys.agents_done(job)))
