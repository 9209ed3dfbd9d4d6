"""The flows (:mod:`flows.registry`) as a worker runs them beside its drain loops: one loop
for all, going round again at once after a round that moved work, and what the metrics show
of them. The worker names no flow: it runs what the registry lists. The flows find their work
in the job registry as the worker last read it (``names``: one read for all)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from swarm_queue.common.errors import SwarmError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore
from swarm_queue.flows import registry
from swarm_queue.flows.flow import Flow, Gauge, Names

__all__ = ["PUMP_IDLE_S", "Pumps"]

log = logging.getLogger("swarm.worker")

# How long the pumps rest after a round that moved nothing.
PUMP_IDLE_S = 0.05


class Pumps:
    """One worker's flows."""

    def __init__(
        self,
        store: FlowStore,
        settings: Settings,
        endpoints: Sequence[object] = (),
        names: Names | None = None,
    ) -> None:
        # The functions the flows may import by name: one set for all of them.
        self.allowed = set(settings.reduce_functions)
        self.flows: list[Flow] = [
            flow(store, settings, allowed=self.allowed, endpoints=endpoints, names=names)
            for flow in registry.FLOWS  # read here, so a flow registered later runs too
        ]
        # What the flows show the metrics, as last read.
        self.gauges: list[Gauge] = []

    def allow(self, functions: Iterable[str]) -> None:
        """Let the flows import ``functions`` by name too (a Swarm's own session's)."""
        self.allowed.update(functions)

    async def has_work(self) -> bool:
        """True while some flow may still move work on."""
        for flow in self.flows:
            if await flow.has_work():
                return True
        return False

    async def run(
        self, sleep: Callable[[float], Awaitable[bool]], stopping: Callable[[], bool]
    ) -> None:
        """Move work on until the worker stops (``stopping()``, or ``sleep`` says so)."""
        while not stopping():
            moved = False
            for flow in self.flows:
                try:
                    moved |= await flow.step()
                except SwarmError as exc:  # Redis trouble: the answers wait in their streams
                    log.warning("%s flow: %s", flow.name, exc)
                except Exception:  # a fault of a flow: said, and the others go on (the fleet too)
                    log.exception("%s flow", flow.name)
            if not moved and await sleep(PUMP_IDLE_S):
                return

    async def read_gauges(self) -> None:
        """Read what each flow shows the metrics."""
        self.gauges = [gauge for flow in self.flows for gauge in await flow.gauges()]

    def shown(self, redis_up: bool) -> list[Gauge]:
        """The gauges for a scrape: while Redis is out of reach, no figure can be vouched
        for, and none is shown."""
        return self.gauges if redis_up else [g._replace(samples=()) for g in self.gauges]

    async def close(self) -> None:
        for flow in self.flows:
            await flow.close()
