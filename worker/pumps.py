"""The workflows' pumps as a worker runs them beside its drain loops: the pipeline pump and
the agent pump (:mod:`flows`), one loop for both, going round again at once after a round
that moved work; the agents' connection to the tool runners' queue; and what the metrics
show of agents and tool calls."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from arq.connections import ArqRedis

from common.arqconf import arq_pool
from common.errors import SwarmError
from common.settings import Settings
from common.store import AgentCounts, JobStore
from flows.agents import AgentPump
from flows.pump import Pump
from flows.toolcalls import ToolCaller

__all__ = ["PUMP_IDLE_S", "Pumps"]

log = logging.getLogger("swarm.worker")

# How long the pumps rest after a round that moved nothing.
PUMP_IDLE_S = 0.05


class Pumps:
    """One worker's pumps."""

    def __init__(self, store: JobStore, settings: Settings) -> None:
        self.store, self.settings = store, settings
        refresh = settings.jobs_refresh_s
        self.pipeline = Pump(store, settings.reduce_functions, refresh_s=refresh)
        self.agents = AgentPump(store, self._tool_caller, refresh_s=refresh)
        self._tool_queue: ArqRedis | None = None
        # Each agent job's agents by state, and the tool calls of this Redis (the metrics').
        self.agent_status: dict[str, AgentCounts] = {}
        self.tool_stats: dict[str, int] = {}

    async def has_work(self) -> bool:
        """True while a pipeline step may still be fed, or an agent job has agents running."""
        return await self.pipeline.has_work() or await self.agents.has_work()

    async def run(
        self, sleep: Callable[[float], Awaitable[bool]], stopping: Callable[[], bool]
    ) -> None:
        """Move work on until the worker stops (``stopping()``, or ``sleep`` says so)."""
        while not stopping():
            try:
                moved = await self.pipeline.step()
                moved |= await self.agents.step()
            except SwarmError as exc:  # Redis trouble: the answers wait in their streams
                log.warning("pipeline pump: %s", exc)
                moved = False
            except Exception:  # a fault of a pump: said, and the pumps go on (the fleet too)
                log.exception("pipeline or agent pump")
                moved = False
            if not moved and await sleep(PUMP_IDLE_S):
                return

    async def read_gauges(self) -> None:
        """Read each running agent job's agents by state, and the tool calls."""
        agents = {job: await self.store.agent_counts(job) for job in list(self.agents.jobs)}
        self.agent_status = agents
        self.tool_stats = await self.store.tool_stats() if agents else self.tool_stats

    async def _tool_caller(self) -> ToolCaller:
        """The agents' way to the tool runners: arq's queue of tool calls, connected once."""
        if self._tool_queue is None:
            self._tool_queue = await arq_pool(self.settings)
        return ToolCaller(self.store, self._tool_queue, self.settings)

    async def close(self) -> None:
        if self._tool_queue is not None:
            await self._tool_queue.aclose()
            self._tool_queue = None
