"""The pipeline's flow: moves each step's answers into the next step as they are committed.

The pump of a later step (one at a time: see :mod:`flows.flow`) takes the answers of the step
before, builds the next prompts (the step's template, unless its filter keeps an answer back)
and queues them. When the step before has finished and every answer has moved on, it seals
the next step with its count.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import msgspec

from swarm_queue.common.keys import step_name, step_of
from swarm_queue.common.models import JobSpec, PromptItem, Result, decode_item, result_or_failure
from swarm_queue.common.output import JobOutput
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore
from swarm_queue.common.store.steps import Landed, Move
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.flow import Flow
from swarm_queue.flows.pipeline.output import PipelineOutput
from swarm_queue.flows.pipeline.spec import KIND, Keep, Link, link_of, next_item

__all__ = ["PipelineFlow"]

log = logging.getLogger("swarm.pump")


class PipelineFlow(Flow):
    """Moves answers on for every pipeline of one Redis: its work is each later step not yet
    sealed, with the spec of the step before."""

    name = KIND
    output: ClassVar[type[JobOutput[Any]] | None] = PipelineOutput

    def __init__(self, store: FlowStore, settings: Settings, **given: Any) -> None:
        super().__init__(store, settings, **given)
        self._keeps: dict[tuple[str, str], Keep] = {}

    async def find(self) -> dict[str, JobSpec]:
        steps = [n for n in await self.job_names() if step_of(n) is not None]
        befores: dict[str, str] = {}
        for name in await self.store.unfinished(steps):
            if Meta.TOTAL in await self.store.meta(name):
                continue  # sealed: its pump is done with it
            job, k = step_of(name) or ("", 0)
            befores[name] = step_name(job, k - 1)
        sources = await self.current_specs(list(befores.values()))
        links: dict[str, JobSpec] = {}
        for name, before in befores.items():
            source = sources.get(before)
            if source is None:
                self.store.warn_once(
                    f"{self.name} step {name}", f"the step before, {before}, is gone"
                )
            elif self.target(source) == name:
                links[name] = source
        return links

    def target(self, source: JobSpec) -> str | None:
        """The step ``source``'s answers go on into, when this flow moves them."""
        link = link_of(source)
        return link.job if link is not None else None

    def key(self, source: JobSpec, origin: int) -> int:
        """The first key input ``origin`` moves under (its items are queued, or it is
        dropped, under all its keys at once)."""
        return origin

    def moves(
        self, source: JobSpec, item: PromptItem, result: Result | None, index: int
    ) -> list[Move]:
        """What becomes of ``item``'s input at the next step, given its ``result`` at this
        one (None: gone from Redis): items numbered from ``index``, or dropped with why."""
        link = self.settings_of(source, Link)
        origin = item.origin if item.origin is not None else item.index
        why: str | None = "its answer was not in Redis any more (collected with --evict?)"
        if result is not None and result.ok and result.text is not None:
            why = self._keep(source).why_not(result.text)
        if why is not None or result is None or result.text is None:
            return [Move(origin, reason=why or "")]
        return [Move(origin, item=next_item(link, index, item, result.text, result.samples))]

    def runs(self, name: str, spec: JobSpec) -> bool:
        """Whether this pump can feed step ``name``: its filter's function is one this worker
        runs. If not, the step is left to a pump that can (said once): none of its answers is
        ever stopped for it."""
        refused = self._keep(spec).refused
        if refused is not None:
            self.store.warn_once(f"pipeline step {name}", f"left to a worker that has {refused}")
        return refused is None

    async def advance(self, name: str, spec: JobSpec) -> bool:
        if not await self.lock(name):
            return False  # another pump feeds this step
        target = await self.spec(name)
        landed = await self.take(spec.job, spec.generation)
        if landed:
            await self._move(spec, target, landed)
            return True
        return await self._seal_when_done(spec, target)

    async def _move(self, source: JobSpec, target: JobSpec, landed: list[Landed]) -> None:
        raws = await self.store.results_at(source.job, [x.index for x in landed])
        candidates = []
        for x, raw in zip(landed, raws, strict=True):
            try:
                item = decode_item(x.payload or b"")
            except msgspec.DecodeError:
                log.warning("%s %s: unreadable landed entry %r skipped", self.name, source.job, x)
                continue
            origin = item.origin if item.origin is not None else item.index
            result = result_or_failure(x.index, raw) if raw is not None else None
            candidates.append((self.key(source, origin), item, result))
        done = await self.store.moved(target.job, [key for key, _, _ in candidates])
        first = await self.store.enqueued_count(target.job)
        moves: list[Move] = []
        seen, queued = set(done), 0
        for key, item, result in candidates:
            if key in seen:
                continue
            seen.add(key)
            made = self.moves(source, item, result, first + queued)
            moves += made
            queued += sum(1 for m in made if m.item is not None)
        acked = [x.entry_id for x in landed]
        await self.store.move_on(source.job, target.job, first, moves, acked, gen=target.generation)

    def _keep(self, source: JobSpec) -> Keep:
        key = (source.job, source.generation)
        if key not in self._keeps:
            link = link_of(source)
            assert link is not None
            self._keeps[key] = Keep(link, self.allowed)
        return self._keeps[key]

    async def _seal_when_done(self, source: JobSpec, target: JobSpec) -> bool:
        """Seal ``target`` once ``source`` has finished and every answer has moved on."""
        status = await self.store.status(source.job, rate=False)
        if not (status.finished or status.cancelled):
            return False
        if await self.store.landed_backlog(source.job):
            return False
        count = await self.store.enqueued_count(target.job)
        await self.store.seal(target.job, count, gen=target.generation)
        await self.store.release_producer_lock(target.job, self.token)
        self.work.pop(target.job, None)
        log.info("%s step %s sealed with %d prompts", self.name, target.job, count)
        return True
