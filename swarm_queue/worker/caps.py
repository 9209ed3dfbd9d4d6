"""Projects' caps on their lines in flight, kept by each worker process: before a slot looks
for a batch of a capped project's job, it is granted the lines the project has left (the
fleet's count read from Redis, plus what this process has been granted and not yet taken),
and what it did not take is settled back. In one process the cap is exact; processes
granted lines within the same round trip may pass it together by their batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import WorkerStore

__all__ = ["NO_CAPS", "Caps", "ProjectCaps"]


class Caps(Protocol):
    """How many lines a slot may take of a job (see :class:`ProjectCaps`)."""

    async def grant(self, spec: JobSpec, want: int) -> int:
        """At most ``want`` lines of ``spec``'s job, reserved until :meth:`settle`."""
        ...

    async def settle(self, spec: JobSpec, granted: int) -> None:
        """The lines granted are taken (now counted by Redis), or were not taken at all."""
        ...

    def capped(self, spec: JobSpec) -> bool:
        """Whether a look for ``spec``'s lines must ask for a grant first."""
        ...


class _NoCaps:
    """No project capped: every look takes a whole batch."""

    async def grant(self, spec: JobSpec, want: int) -> int:
        return want

    async def settle(self, spec: JobSpec, granted: int) -> None:
        return None

    def capped(self, spec: JobSpec) -> bool:
        return False


NO_CAPS: Caps = _NoCaps()


class ProjectCaps:
    """The caps of every project, read with the job registry (:meth:`read`), kept over the
    jobs this worker knows (``jobs``: every unfinished job, whatever its model)."""

    def __init__(self, store: WorkerStore, jobs: Callable[[], Mapping[str, JobSpec]]) -> None:
        self.store = store
        self.jobs = jobs
        self.caps: dict[str, int] = {}
        # Lines granted to this process's slots and not yet settled, by project: being taken,
        # so not yet among the pending entries Redis counts.
        self._granted: dict[str, int] = {}
        # One grant or settlement of a project at a time: a count read while a take lands
        # counts it once at least (in the grant, or in Redis), never not at all.
        self._locks: dict[str, asyncio.Lock] = {}

    async def read(self) -> None:
        """Read the caps again (an operator may have set or lifted one)."""
        self.caps = await self.store.project_caps()

    def capped(self, spec: JobSpec) -> bool:
        return bool(spec.project) and spec.project in self.caps

    async def grant(self, spec: JobSpec, want: int) -> int:
        cap = self.caps.get(spec.project) if spec.project else None
        if cap is None:
            return want
        async with self._lock(spec.project):
            jobs = {name: s.chunk for name, s in self.jobs().items() if s.project == spec.project}
            busy = await self.store.in_flight(jobs) + self._granted.get(spec.project, 0)
            n = max(0, min(want, cap - busy))
            if n:
                self._granted[spec.project] = self._granted.get(spec.project, 0) + n
            return n

    async def settle(self, spec: JobSpec, granted: int) -> None:
        if not granted or spec.project not in self._granted:
            return
        async with self._lock(spec.project):
            left = self._granted[spec.project] - granted
            if left > 0:
                self._granted[spec.project] = left
            else:
                del self._granted[spec.project]

    def _lock(self, project: str) -> asyncio.Lock:
        return self._locks.setdefault(project, asyncio.Lock())
