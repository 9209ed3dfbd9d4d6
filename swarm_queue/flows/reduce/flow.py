"""The reduce's flow: every job whose current stage has finished and whose reduce has not,
advanced a step (its aggregate written, or its tree's next level queued) by whichever worker
finds it first; the others meet the next level's lock, or find the step taken.

A step runs in a task of its own (a tree's level asks the endpoints to count its groups'
tokens, which may take a while): the other flows go on meanwhile, and a step past
``SWARM_REDUCE_TIMEOUT_S`` ends the reduce with that reason. A step that could not run (Redis
out of reach, another worker on it) is found again at the next look, ``jobs_refresh_s`` later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from swarm_queue.common.abilities import has_numpy
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore
from swarm_queue.flows.flow import Flow, Names
from swarm_queue.flows.reduce.reducer import Reducer, Sizer, StageBusy

__all__ = ["ReduceFlow"]

log = logging.getLogger("swarm.reduce")


class ReduceFlow(Flow):
    """Advances the reduce of every job of one Redis: its work is each job whose current
    stage has finished (a pipeline's reduce: its last step's), with that job's spec."""

    name = "reduce"

    def __init__(
        self,
        store: FlowStore,
        settings: Settings,
        *,
        token: str = "",
        allowed: set[str] | None = None,
        endpoints: Sequence[Sizer] = (),
        names: Names | None = None,
    ) -> None:
        super().__init__(
            store, settings, token=token, allowed=allowed, endpoints=endpoints, names=names
        )
        self.reducer = Reducer(store, endpoints, self.allowed, numpy=has_numpy())
        # The finished stage each job of the work was found at.
        self._levels: dict[str, int] = {}
        self._steps: dict[str, asyncio.Task[str]] = {}

    async def find(self) -> dict[str, JobSpec]:
        pending = await self.store.reduces_pending(await self.job_names())
        levels = {job: level for job, level, finished in pending if finished}
        work = await self.current_specs(list(levels))
        self._levels = {job: levels[job] for job in work}
        return work

    def runs(self, name: str, spec: JobSpec) -> bool:
        return self.reducer.runs(spec)

    async def advance(self, name: str, spec: JobSpec) -> bool:
        """Start the step of ``name``'s reduce in the background, unless one runs."""
        if name in self._steps:
            return False
        level = self._levels.get(name, 0)
        timeout_s = self.settings.reduce_timeout_s
        step = asyncio.create_task(self.reducer.advance(name, level, timeout_s), name=name)
        self._steps[name] = step
        step.add_done_callback(lambda t: self._done(name, level, t))
        return True

    def _done(self, name: str, level: int, step: asyncio.Task[str]) -> None:
        """A step ended: its job is looked at again at the next refresh, never before."""
        self._steps.pop(name, None)
        self.work.pop(name, None)
        exc = None if step.cancelled() else step.exception()
        if exc is not None:
            level_ = logging.DEBUG if isinstance(exc, StageBusy) else logging.WARNING
            log.log(level_, "job %s: stage %d not advanced yet: %s", name, level, exc)

    async def has_work(self) -> bool:
        return bool(self._steps) or await super().has_work()

    async def close(self) -> None:
        for step in list(self._steps.values()):
            step.cancel()
        await asyncio.gather(*self._steps.values(), return_exceptions=True)
