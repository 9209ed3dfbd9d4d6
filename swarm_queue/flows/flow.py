"""A flow: what turns a committed answer into the next unit of work (a pipeline's next step,
an agent's next turn). Every worker runs every flow of the registry (:mod:`flows.registry`)
beside its drain loops; the drain path knows batches, not flows.

A job whose answers go on has each committed answer appended to its ``landed`` stream in the
same atomic step as the answer (``lua/commit.lua``). A flow takes them, one pump at a time per
unit of its work (it holds that unit's producer lock, so the job it feeds counts as still being
fed), and acknowledges what it took in the same script that queues what follows
(``lua/move.lua``): an answer moves on exactly once, even when a pump dies holding it (the next
holder of the lock takes what it left pending).

This base owns what every flow does alike: finding its work at most every ``jobs_refresh_s``;
one round over it, a race with another pump or a job deleted under it handled the same way;
the specs it reads (again only for a job of a new generation); the lock; each stream's
consumer group (one a generation); taking what landed. A flow says what its work is
(:meth:`Flow.find`), how one unit of it goes a step (:meth:`Flow.advance`), what it opens once
it has work (:meth:`Flow.ready`) and what the worker's metrics show of it (:meth:`Flow.gauges`).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgspec

from swarm_queue.common.errors import (
    BadRecordError,
    JobConflictError,
    JobGoneError,
    JobNotFoundError,
)
from swarm_queue.common.keys import step_of
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import JobOutput
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore, producer_token
from swarm_queue.common.store.steps import Landed

__all__ = ["BATCH", "LOCK_TTL_MS", "Flow", "Gauge", "Names"]

log = logging.getLogger("swarm.pump")

S = TypeVar("S")

# How long a pump's hold on a unit of work outlives the pump: another takes over after it.
LOCK_TTL_MS = 10_000
# Answers taken per script call.
BATCH = 500

# The job registry's names from a read sent at most that many seconds ago (a worker's flows
# and job table share one: worker.jobtable.Registry).
Names = Callable[[float], Awaitable[list[str]]]


class Gauge(NamedTuple):
    """One gauge a flow shows the worker's metrics (Prometheus' names: a metric, its help,
    its label names), with its samples as last read: label values and a value each."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...] = ()


class Flow(ABC):
    """One workflow's pump for every job of one Redis; :meth:`step` does one round."""

    # Said in logs, and part of the pump's lock token; a job's ``FlowRef.kind``.
    name: ClassVar[str]
    # How this flow's jobs are written out (see common/output.py; None: as a plain job).
    output: ClassVar[type[JobOutput[Any]] | None] = None

    def __init__(
        self,
        store: FlowStore,
        settings: Settings,
        *,
        token: str = "",
        allowed: set[str] | None = None,
        endpoints: Sequence[object] = (),
        names: Names | None = None,
    ) -> None:
        self.store, self.settings = store, settings
        self._names = names
        self._max_age_s = 0.0  # how old the registry's names :meth:`find` reads may be
        # The functions this worker may import by name (the operator's SWARM_REDUCE_FUNCTIONS;
        # a Swarm adds its own session's): a flow that runs one asks here. One set for every
        # flow of a worker (``allowed``), so that one allowed later counts for all.
        self.allowed = allowed if allowed is not None else set(settings.reduce_functions)
        # The worker's endpoints, for a flow that asks them something of its own (the reduce:
        # a prompt's token count); the drain path sends them the prompts.
        self.endpoints = list(endpoints)
        # Its own lock holder: the process's name alone (host:pid) let two pumps of one
        # process (two engines, two Swarm sessions) both hold a job's lock.
        self.token = f"{token or f'{producer_token()}/{uuid.uuid4().hex[:12]}'}/{self.name}"
        # The units of work found at the last refresh, each by its name (a pipeline's next
        # step, an agent job), with the spec of the job whose answers it moves on.
        self.work: dict[str, JobSpec] = {}
        self._specs: dict[str, JobSpec] = {}
        self._grouped: set[str] = set()
        self._refreshed_at = -math.inf
        # Each job generation's flow settings, decoded once (not once per answer moved on).
        self._settings: dict[tuple[str, str, type], object] = {}

    @abstractmethod
    async def find(self) -> dict[str, JobSpec]:
        """This flow's work as it stands in Redis (see :attr:`work`)."""

    @abstractmethod
    async def advance(self, name: str, spec: JobSpec) -> bool:
        """Move unit ``name`` on by what has landed: True when something moved or was sealed.
        A :class:`JobConflictError` (another pump moved some) or a job gone is handled by
        :meth:`step`."""

    def runs(self, name: str, spec: JobSpec) -> bool:
        """Whether this worker can move unit ``name`` (a flow whose work needs what not every
        worker has says no, once, and leaves it to a worker that has it)."""
        return True

    async def ready(self) -> None:
        """Make ready what the work needs, once there is some (nothing by default)."""
        return None

    async def gauges(self) -> list[Gauge]:
        """What the worker's metrics show of this flow, read now (none by default)."""
        return []

    async def close(self) -> None:
        """Let go of what the flow opened (nothing by default)."""
        return None

    async def refresh(self, *, force: bool = False) -> None:
        """Find the work again, at most every ``jobs_refresh_s`` unless ``force``."""
        if not force and time.monotonic() - self._refreshed_at < self.settings.jobs_refresh_s:
            return
        # Unforced, a read of the registry half a refresh old will do (another flow's, or the
        # job table's); forced (a burst deciding whether to stay), only one sent now.
        self._max_age_s = 0.0 if force else self.settings.jobs_refresh_s / 2
        self.work = await self.find()
        self._refreshed_at = time.monotonic()

    async def job_names(self) -> list[str]:
        """Every job in the registry, for :meth:`find` (see :meth:`refresh`)."""
        if self._names is None:
            return await self.store.list_jobs()
        return await self._names(self._max_age_s)

    async def has_work(self) -> bool:
        """True while some unit of work this worker can move is left: answers may still
        move on (a burst worker stays for them)."""
        await self.refresh(force=True)
        return any(self.runs(name, spec) for name, spec in self.work.items())

    async def step(self) -> bool:
        """One round over the work: True when something moved."""
        await self.refresh()
        if self.work:
            await self.ready()
        did = False
        for name, spec in list(self.work.items()):
            if not self.runs(name, spec):
                continue
            try:
                did |= await self.advance(name, spec)
            except JobConflictError as exc:  # another pump moved some: read again
                log.debug("%s %s: %s", self.name, name, exc)
                did = True
            except (JobGoneError, JobNotFoundError):
                self.work.pop(name, None)
                self.forget(spec.job)
                self.forget(name)
        return did

    def settings_of(self, spec: JobSpec, kind: type[S]) -> S:
        """``spec``'s flow settings as ``kind`` (its FlowRef's, which only the flow reads),
        decoded once a job generation."""
        assert spec.flow is not None, spec.job
        key = (spec.job, spec.generation, kind)
        if key not in self._settings:
            self._settings[key] = msgspec.convert(spec.flow.settings, kind)
        return self._settings[key]  # type: ignore[return-value]

    async def spec(self, name: str) -> JobSpec:
        """Job ``name``'s spec, read once (:meth:`forget` reads it again)."""
        if name not in self._specs:
            self._specs[name] = await self.store.load_spec(name)
        return self._specs[name]

    async def current_specs(self, names: list[str]) -> dict[str, JobSpec]:
        """The specs of those of jobs ``names`` that are there, each checked against its
        generation (one round trip for all): only a new job's, or one deleted and queued
        again under its name, is read again."""
        found: dict[str, JobSpec] = {}
        for name, gen in zip(names, await self.store.generations(names), strict=True):
            spec = self._specs.get(name)
            if spec is None or spec.generation != gen:
                self.forget(name)
                try:
                    spec = self._specs[name] = await self.store.load_spec(name)
                except (JobNotFoundError, BadRecordError):
                    continue
            found[name] = spec
        return found

    def forget(self, job: str) -> None:
        """Forget the specs read of ``job`` and of its later steps: deleted, or queued again
        under its name (a spec kept from before would have its moves refused, after what they
        wrote beside them)."""
        for name in [n for n in self._specs if n == job or (step_of(n) or ("",))[0] == job]:
            del self._specs[name]

    async def lock(self, name: str) -> bool:
        """Hold ``name``'s producer lock (or keep holding it): False while another pump
        does."""
        return await self.store.acquire_producer_lock(name, self.token, LOCK_TTL_MS) is None

    async def take(self, job: str, generation: str) -> list[Landed]:
        """Answers of ``job`` (of ``generation``) landed and not yet moved on: first those a
        pump that died left taken, then new ones, up to :data:`BATCH`."""
        # One group a generation: a job deleted and queued again under its name has a new
        # stream.
        grouped = f"{job}/{generation}"
        if grouped not in self._grouped:
            await self.store.ensure_pump_group(job)
            self._grouped.add(grouped)
        return await self.store.take_landed(job, self.token, BATCH)
