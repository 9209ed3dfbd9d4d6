"""The jobs a worker serves: each taken up as it appears in the job registry (its spec read
once), dropped as it ends, forgotten when its work is refused (deleted, lost with Redis, or
queued again under its name), and skipped while one of its keys holds another tool's value.
Swept at most every ``jobs_refresh_s``; what a sweep found is what every drain loop serves."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from swarm_queue.common.errors import (
    BadRecordError,
    JobGoneError,
    JobNotFoundError,
    StoreUnavailable,
)
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import WorkerStore

__all__ = ["UNREADABLE_RETRY_S", "JobTable", "Registry"]

log = logging.getLogger("swarm.worker")

# A job skipped for a key of another tool's value is read again after this long (not at the
# next sweep: taken up, its leftovers taken back and refused again, many times a second).
UNREADABLE_RETRY_S = 10.0


class Registry:
    """The job registry's names as this worker last read them: one read serves its job table
    and every flow (each reading on its own, a worker read the registry five times a refresh,
    and a fleet's workers that many times as often as there are processes)."""

    def __init__(self, store: WorkerStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.clock = store, clock
        self._names: list[str] = []
        self._read_at = -math.inf  # when the read that gave them was sent
        self._lock = asyncio.Lock()

    async def names(self, max_age_s: float = 0.0) -> list[str]:
        """The names, from a read sent at most ``max_age_s`` before this call (0: sent now)."""
        asked = self.clock()
        async with self._lock:  # (a read under way serves the callers waiting on it)
            if self._read_at < asked - max_age_s:
                sent = self.clock()
                self._names = await self.store.list_jobs()
                self._read_at = sent
            return list(self._names)


class JobTable:
    """The jobs one worker serves (:attr:`jobs`), kept by :meth:`sweep`."""

    def __init__(
        self,
        store: WorkerStore,
        settings: Settings,
        *,
        lacks: Callable[[JobSpec], str | None],
        on_over: Callable[[str], None],
        registry: Registry | None = None,
    ) -> None:
        self.store, self.settings = store, settings
        self.registry = registry or Registry(store)
        # Why this worker cannot serve a job's batches (None: it can): left to one that can.
        self._lacks = lacks
        # Called with a job's name when it is no longer served (its requests are cut short).
        self._on_over = on_over
        self.jobs: dict[str, JobSpec] = {}
        self._gone: set[tuple[str, str]] = set()  # (job, generation) found gone, said once
        self._skipped: dict[str, float] = {}  # job -> when to read it again (unreadable)
        self._swept_at = -math.inf

    def due(self) -> bool:
        """Whether ``jobs_refresh_s`` has passed since the last sweep."""
        return time.monotonic() - self._swept_at >= self.settings.jobs_refresh_s

    async def sweep(self) -> list[str] | None:
        """Take up new jobs and drop those over: returns every name in the job registry, or
        None when the registry cannot be read (the jobs known are served on). One sweep at a
        time: the caller holds what else must happen with it (see Engine.refresh_jobs)."""
        try:
            names = await self.registry.names()
        except BadRecordError as exc:  # the registry itself: keep serving the jobs known
            self.store.warn_once("the job registry", str(exc))
            self._swept_at = time.monotonic()
            return None
        unfinished = await self.store.unfinished(names)
        for name in unfinished:
            if name not in self.jobs:
                await self._take_up(name)
        self._drop_over(names, set(unfinished))
        self._swept_at = time.monotonic()
        return names

    def stale(self) -> None:
        """Sweep at the next chance, whatever the time."""
        self._swept_at = -math.inf

    async def _take_up(self, name: str) -> None:
        """Start serving the job ``name``, unless it cannot be read yet (the next sweep tries
        again) or at all (said once; never fatal to the other jobs), or was found unreadable
        less than :data:`UNREADABLE_RETRY_S` ago."""
        if time.monotonic() < self._skipped.get(name, -math.inf):
            return
        self._skipped.pop(name, None)
        try:
            spec = await self.store.load_spec(name)
            await self.store.ensure_group(name)
        except StoreUnavailable as exc:  # a full or lost Redis: the next sweep
            log.warning("job %s not served yet: %s", name, exc)
            return
        except JobNotFoundError:
            return  # registered but its spec is gone (deleted meanwhile)
        except BadRecordError as exc:
            self.store.warn_once(f"job {name}", str(exc))
            return
        why = self._lacks(spec)
        if why is not None:  # left to a worker that has what its batches need
            self.store.warn_once(f"job {name}", f"left to a worker that has {why}")
            return
        self.jobs[name] = spec
        log.info("serving job %s", name)

    def _drop_over(self, names: list[str], unfinished: set[str]) -> None:
        """Stop serving the jobs finished, cancelled or gone."""
        for name in list(self.jobs):
            if name in unfinished:
                continue
            spec = self.jobs.pop(name)
            self._on_over(name)
            if name in names:
                log.info("job %s finished", name)
            else:
                why = f"job {name!r} is gone: deleted, or lost with a Redis restarted empty"
                self._say_gone(name, spec.generation, why)

    def gone(self, exc: JobGoneError, spec: JobSpec | None = None) -> None:
        """Work of a job was refused: that job is gone (deleted, lost with Redis, or queued
        again under its name). Forget the spec held for it (``spec``'s, if the work came with
        one), so that the next step reads whatever holds the name now; say so once per
        generation."""
        held = self.jobs.get(exc.job)
        if held is not None and (spec is None or held.generation == spec.generation):
            del self.jobs[exc.job]
        self.stale()
        known = spec or held
        self._say_gone(exc.job, known.generation if known else "", str(exc))

    def unreadable(self, exc: BadRecordError) -> None:
        """A key of job ``exc.job`` cannot be used (another tool's value under its name): the
        job is dropped, and read again after :data:`UNREADABLE_RETRY_S` (someone may have
        deleted the key by then); said once. The other jobs go on."""
        if exc.job:
            self.jobs.pop(exc.job, None)
            self._skipped[exc.job] = time.monotonic() + UNREADABLE_RETRY_S
        self.store.warn_once(f"job {exc.job}" if exc.job else str(exc), str(exc))

    def _say_gone(self, job: str, gen: str, why: str) -> None:
        """Log, once per generation of ``job``, that this worker lost it and drops its work."""
        if (job, gen) not in self._gone:
            self._gone.add((job, gen))
            log.warning("%s; this worker drops every batch it held of it", why)
