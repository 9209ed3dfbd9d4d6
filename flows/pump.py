"""The pump: moves each pipeline step's answers into the next step as they are committed.

Every worker runs one. A step's commits append each new answer to the step's ``landed``
stream in the same atomic step (see ``lua/commit.lua``); the pump of the next step (one at a
time: it holds that step's producer lock, so the step counts as still being fed) takes them,
builds the next prompts and queues them, acknowledging what it took in the same script
(``lua/move.lua``): an answer moves on exactly once, even when a pump dies holding it (the
next holder of the lock takes what it left pending). When the step before has finished and
every answer has moved on, the pump seals the next step with its count.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

import msgspec

from common.errors import BadRecordError, JobConflictError, JobGoneError, JobNotFoundError
from common.keys import step_name, step_of
from common.models import JobSpec, decode_item, result_or_failure
from common.store import JobStore, producer_token
from common.store.steps import Landed, Move
from common.vocab import Meta
from flows.pipeline import Keep, next_item

__all__ = ["LOCK_TTL_MS", "Pump"]

log = logging.getLogger("swarm.pump")

# How long a pump's hold on a step outlives the pump: another takes over after it.
LOCK_TTL_MS = 10_000
# Answers moved per script call.
BATCH = 500


class Pump:
    """Moves answers for every pipeline of one Redis; :meth:`step` does one round."""

    def __init__(
        self,
        store: JobStore,
        allowed: Iterable[str] = (),
        *,
        refresh_s: float = 2.0,
        token: str | None = None,
    ) -> None:
        self.store = store
        # The keep functions these workers may import (a Swarm adds its own session's).
        self.allowed = set(allowed)
        self.refresh_s = refresh_s
        self.token = f"{token or producer_token()}/pump"
        # The step before each unsealed later step, by the later step's name.
        self.links: dict[str, JobSpec] = {}
        self._targets: dict[str, JobSpec] = {}
        self._keeps: dict[tuple[str, str], Keep] = {}
        self._grouped: set[str] = set()
        self._refreshed_at = -math.inf

    async def refresh(self, *, force: bool = False) -> None:
        """Find the later steps not yet sealed, and the step before each."""
        if not force and time.monotonic() - self._refreshed_at < self.refresh_s:
            return
        names = await self.store.list_jobs()
        steps = [n for n in names if step_of(n) is not None]
        links: dict[str, JobSpec] = {}
        for name in await self.store.unfinished(steps):
            if Meta.TOTAL in await self.store.meta(name):
                continue  # sealed: its pump is done with it
            job, k = step_of(name) or ("", 0)
            try:
                source = await self.store.load_spec(step_name(job, k - 1))
            except (JobNotFoundError, BadRecordError) as exc:
                self.store.warn_once(f"pipeline step {name}", str(exc))
                continue
            if source.then is not None and source.then.job == name:
                links[name] = source
        self.links = links
        self._refreshed_at = time.monotonic()

    async def has_work(self) -> bool:
        """True while some pipeline step this pump can feed is not yet sealed: answers may
        still move on."""
        await self.refresh(force=True)
        return any(self._runs(name, source) for name, source in self.links.items())

    def _runs(self, name: str, source: JobSpec) -> bool:
        """Whether this pump can feed step ``name``: its filter's function is one this worker
        runs. If not, the step is left to a pump that can (said once): none of its answers is
        ever stopped for it."""
        refused = self._keep(source).refused
        if refused is not None:
            self.store.warn_once(f"pipeline step {name}", f"left to a worker that has {refused}")
        return refused is None

    async def step(self) -> bool:
        """One round over every pipeline step: True when something moved or was sealed."""
        await self.refresh()
        did = False
        for name, source in list(self.links.items()):
            if not self._runs(name, source):
                continue
            try:
                did |= await self._step(name, source)
            except JobConflictError as exc:  # another pump moved some: read again
                log.debug("pipeline step %s: %s", name, exc)
                did = True
            except (JobGoneError, JobNotFoundError):
                self.links.pop(name, None)
                self._targets.pop(name, None)
        return did

    async def _target(self, name: str) -> JobSpec:
        if name not in self._targets:
            self._targets[name] = await self.store.load_spec(name)
        return self._targets[name]

    async def _step(self, name: str, source: JobSpec) -> bool:
        if await self.store.acquire_producer_lock(name, self.token, LOCK_TTL_MS) is not None:
            return False  # another pump feeds this step
        # Per generation: a step deleted and queued again under its name has a new stream.
        grouped = f"{source.job}/{source.generation}"
        if grouped not in self._grouped:
            await self.store.ensure_pump_group(source.job)
            self._grouped.add(grouped)
        target = await self._target(name)
        landed = await self.store.take_landed(source.job, self.token, BATCH)
        if landed:
            await self._move(source, target, landed)
            return True
        return await self._seal_when_done(source, target)

    async def _move(self, source: JobSpec, target: JobSpec, landed: list[Landed]) -> None:
        link = source.then
        assert link is not None
        raws = await self.store.results_at(source.job, [x.index for x in landed])
        keep = self._keep(source)
        candidates = []
        for x, raw in zip(landed, raws, strict=True):
            try:
                item = decode_item(x.payload or b"")
            except msgspec.DecodeError:
                log.warning("pipeline %s: unreadable landed entry %r skipped", source.job, x)
                continue
            origin = item.origin if item.origin is not None else item.index
            result = result_or_failure(x.index, raw) if raw is not None else None
            candidates.append((origin, item, result))
        done = await self.store.moved(target.job, [o for o, _, _ in candidates])
        first = await self.store.enqueued_count(target.job)
        moves: list[Move] = []
        seen, queued = set(done), 0
        for origin, item, result in candidates:
            if origin in seen:
                continue
            seen.add(origin)
            why: str | None = "its answer was not in Redis any more (collected with --evict?)"
            if result is not None and result.ok and result.text is not None:
                why = keep.why_not(result.text)
            if why is not None or result is None or result.text is None:
                moves.append(Move(origin, reason=why or ""))
                continue
            moved = next_item(link, first + queued, item, result.text, result.samples)
            moves.append(Move(origin, item=moved))
            queued += 1
        acked = [x.entry_id for x in landed]
        await self.store.move_on(source.job, target.job, first, moves, acked, gen=target.generation)

    def _keep(self, source: JobSpec) -> Keep:
        assert source.then is not None
        key = (source.job, source.generation)
        if key not in self._keeps:
            self._keeps[key] = Keep(source.then, self.allowed)
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
        self.links.pop(target.job, None)
        log.info("pipeline step %s sealed with %d prompts", target.job, count)
        return True
