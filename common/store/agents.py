"""Agents: each agent's state between its turns, the agents waiting on tool calls (they hold
no slot of any endpoint), and each agent's result, written once (see flows/agents.py)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from common.store.base import StoreBase
from common.store.connection import redis_errors
from common.vocab import Meta

__all__ = ["AgentCounts", "Agents"]


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

    async def put_agent_states(self, job: str, states: dict[int, bytes]) -> None:
        if states:
            async with redis_errors(self.url, job):
                await self.redis.hset(
                    self.keys.agents(job), mapping={str(a): s for a, s in states.items()}
                )

    async def park(self, job: str, parked: dict[int, bytes]) -> None:
        """Agents now waiting on tool calls, with what they wait on."""
        if parked:
            async with redis_errors(self.url, job):
                await self.redis.hset(
                    self.keys.agents_waiting(job), mapping={str(a): p for a, p in parked.items()}
                )

    async def parked(self, job: str) -> dict[int, bytes]:
        """Every agent of ``job`` waiting on tool calls."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hgetall(self.keys.agents_waiting(job))
        return {int(a): p for a, p in raw.items()}

    async def unpark(self, job: str, agents: Sequence[int]) -> None:
        if agents:
            async with redis_errors(self.url, job):
                await self.redis.hdel(self.keys.agents_waiting(job), *(str(a) for a in agents))

    async def finish_agents(self, job: str, results: dict[int, bytes]) -> int:
        """Record each agent's result, once (a second is ignored), in the order they finished;
        returns how many are new. Its state and any wait go with it."""
        if not results:
            return 0
        k = self.keys
        keys = [k.agents_done(job), k.agents(job), k.agents_waiting(job), k.agents_finished(job)]
        args = [x for a, blob in results.items() for x in (str(a), blob)]
        async with redis_errors(self.url, job):
            return int(await self.scripts.finish(keys=keys, args=args))

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
