"""The drain engine: every active job served from every configured endpoint until stopped
(or, in burst mode, until nothing it can do is left).

The engine keeps the job registry (new jobs picked up, finished ones dropped, each job's spec
read once), runs one :class:`~worker.drainer.EndpointDrainer` per endpoint, schedules the reduce
of every finished stage, computes each urgent job's fair share of preemptions, runs the
flows (:mod:`worker.pumps`: whatever the registry lists), and publishes the per-endpoint
figures and served models for ``swarm-status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from common.abilities import NUMPY, Abilities, has_numpy, lacking, needs
from common.errors import (
    BadRecordError,
    ConfigError,
    JobGoneError,
    JobNotFoundError,
    StoreUnavailable,
    SwarmError,
)
from common.fleet import serving
from common.models import (
    JobSpec,
)
from common.schema import AnswerValidator
from common.settings import Settings
from common.store import JobStatus, JobStore
from worker.backend import Backend, backend_for
from worker.drainer import EndpointDrainer
from worker.metrics import NO_METRICS, Metrics
from worker.pumps import Pumps
from worker.reduce import Reducer, StageBusy

if TYPE_CHECKING:
    from aiohttp import web

    from worker.prometheus import PrometheusMetrics

__all__ = ["Engine"]

log = logging.getLogger("swarm.worker")


class Engine:
    """Serves every active job from every configured endpoint until stopped (or idle, in burst)."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        clients: list[Backend] | None = None,
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.store = store
        self.rand = rand
        if clients is None:
            clients = [
                backend_for(e, settings.api_key, timeout_s=settings.request_timeout_s or 600)
                for e in settings.endpoints
            ]
        if not clients:
            raise ConfigError("no endpoints: set SWARM_ENDPOINTS or SWARM_HOSTFILE")
        # Prometheus metrics when SWARM_METRICS_PORT asks for them (served by start_metrics),
        # with each served job's status as last read, for their gauges.
        self._prometheus = self._build_metrics() if settings.metrics_port else None
        self.metrics: Metrics = self._prometheus or NO_METRICS
        self.job_status: dict[str, JobStatus] = {}
        self._metrics_server: web.AppRunner | None = None
        self.drainers = [EndpointDrainer(self, c) for c in clients]
        self.reducer = Reducer(store, clients, settings.reduce_functions)
        self.pumps = Pumps(store, settings)
        self.numpy = has_numpy()
        self.reducer.numpy = self.numpy
        # Called with (job, level) whenever a job's stage ``level`` is seen finished with its
        # reduce not yet advanced; by default advances it here, in the background. The arq
        # worker replaces it with queuing one arq job per (job, level).
        self.on_stage_done: Callable[[str, int], Awaitable[None]] = self.advance_here
        self._advancing: dict[tuple[str, int], asyncio.Task[str]] = {}
        self._reduces_pending = False
        self._validators: dict[str, AnswerValidator] = {}
        self.jobs: dict[str, JobSpec] = {}
        # Per urgent job, the batches one endpoint may start by preemption (see _fair_shares).
        self.shares: dict[str, int] = {}
        self._gone: set[tuple[str, str]] = set()  # (job, generation) found gone, logged once
        self._refreshed_at = -math.inf
        self._refresh_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        # Burst: return once no work these endpoints can do is left (see finish_when_idle).
        self.burst = False
        # Jobs with prompts finished since the last publish of the endpoint figures, and the
        # jobs that publish reported as served.
        self.touched: set[str] = set()
        self._published: set[str] = set()

    @property
    def abilities(self) -> Abilities:
        """What this worker has beyond its endpoints (see common.abilities): the functions its
        settings (and a Python session's own) allow, whether numpy imports."""
        return Abilities(frozenset(self.reducer.allowed | self.pumps.allowed), self.numpy)

    @property
    def redis_up(self) -> bool:
        """Whether Redis answered the worker's last attempt (see :attr:`JobStore.reachable`)."""
        return self.store.reachable

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_stop(self) -> None:
        """Stop taking work; batches in flight still finish and commit."""
        if not self._stopping.is_set():
            log.info("stopping: finishing batches in flight, taking no new work")
        self._stopping.set()
        for d in self.drainers:
            d.lookout.wake()

    async def until_stopping(self) -> None:
        """Return once a stop is requested."""
        await self._stopping.wait()

    async def sleep(self, seconds: float) -> bool:
        """Sleep, but wake early on stop; returns True if stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        return self.stopping

    async def refresh_jobs(self, *, force: bool = False) -> None:
        """Pick up new jobs and drop finished ones, at most every ``jobs_refresh_s``."""
        if not force and time.monotonic() - self._refreshed_at < self.settings.jobs_refresh_s:
            return
        async with self._refresh_lock:
            if not force and time.monotonic() - self._refreshed_at < self.settings.jobs_refresh_s:
                return
            try:
                names = await self.store.list_jobs()
            except BadRecordError as exc:  # the registry itself: keep serving the jobs known
                self.store.warn_once("the job registry", str(exc))
                self._refreshed_at = time.monotonic()
                return
            unfinished = await self.store.unfinished(names)
            for name in unfinished:
                if name not in self.jobs:
                    await self._take_up(name)
            self._drop_over(names, set(unfinished))
            await self._advance_reduces(names)
            self._refreshed_at = time.monotonic()

    async def _take_up(self, name: str) -> None:
        """Start serving the job ``name``, unless it cannot be read yet (the next sweep tries
        again) or at all (said once; never fatal to the other jobs)."""
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
        lacks = [n for n in lacking(needs(spec), self.abilities) if n.kind == NUMPY]
        if lacks:  # its batches are measured here: left to a worker that has what they need
            why = ", ".join(n.describe() for n in lacks)
            self.store.warn_once(f"job {name}", f"left to a worker that has {why}")
            return
        self.jobs[name] = spec
        log.info("serving job %s", name)

    def _drop_over(self, names: list[str], unfinished: set[str]) -> None:
        """Stop serving the jobs finished, cancelled or gone; cut their requests short."""
        for name in list(self.jobs):
            if name in unfinished:
                continue
            spec = self.jobs.pop(name)
            for d in self.drainers:
                d.abandon(name)
            if name in names:
                log.info("job %s finished", name)
            else:
                why = f"job {name!r} is gone: deleted, or lost with a Redis restarted empty"
                self._say_gone(name, spec.generation, why)

    async def _advance_reduces(self, names: list[str]) -> None:
        """Note whether a finished stage waits on its reduce, compute the fair shares, and have
        each finished stage advanced."""
        pending = await self.store.reduces_pending(names)
        self.shares = await self._fair_shares()
        # A stage still running is work of its own stage job; only a finished stage waits on
        # the reduce itself, and only on a worker that can run it.
        self._reduces_pending = False
        for job, level, finished in pending:
            if not finished:
                continue
            try:
                here = await self.reducer.runs_here(job)
                if here is None:
                    continue  # left to a worker that has its function (said once)
                self._reduces_pending = True
                # A reduce a function of this worker runs goes no way through arq's queue,
                # where a worker without the function might take it.
                await (self.advance_here if here else self.on_stage_done)(job, level)
            except SwarmError as exc:
                log.warning("job %s: cannot advance stage %d yet: %s", job, level, exc)

    def job_gone(self, exc: JobGoneError, spec: JobSpec | None = None) -> None:
        """Work of a job was refused: that job is gone (deleted, lost with Redis, or queued
        again under its name). Forget the spec held for it (``spec``'s, if the work came with
        one), so that the next step reads whatever holds the name now; say so once per
        generation."""
        held = self.jobs.get(exc.job)
        if held is not None and (spec is None or held.generation == spec.generation):
            del self.jobs[exc.job]
        self._refreshed_at = -math.inf
        known = spec or held
        self._say_gone(exc.job, known.generation if known else "", str(exc))

    def unreadable(self, exc: BadRecordError) -> None:
        """A key of job ``exc.job`` cannot be used (another tool's value under its name): the
        job is dropped until the next sweep reads it again; said once. The other jobs go on."""
        if exc.job:
            self.jobs.pop(exc.job, None)
            self._refreshed_at = -math.inf
        self.store.warn_once(f"job {exc.job}" if exc.job else str(exc), str(exc))

    def _say_gone(self, job: str, gen: str, why: str) -> None:
        """Log, once per generation of ``job``, that this worker lost it and drops its work."""
        if (job, gen) not in self._gone:
            self._gone.add((job, gen))
            log.warning("%s; this worker drops every batch it held of it", why)

    async def _fair_shares(self) -> dict[str, int]:
        """For each job above the lowest priority served: how many of its batches one endpoint
        may start by preempting lower ones, its fair share over the live endpoints serving its
        model. (Without it, the first worker to see an urgent job would take all of it: each
        preempted slot takes the next urgent batch at once.)"""
        specs = list(self.jobs.values())
        if len({s.priority for s in specs}) < 2:
            return {}
        lowest = min(s.priority for s in specs)
        try:
            fleet = await self.store.read_fleet()
        except BadRecordError as exc:  # shares from this worker's own endpoints, then
            self.store.warn_once("the fleet registry", str(exc))
            fleet = []
        now = await self.store.server_time()
        shares = {}
        for spec in specs:
            if spec.priority == lowest:
                continue
            endpoints = max(
                serving(spec.model, fleet, now), sum(d.serves(spec) for d in self.drainers), 1
            )
            batches = -(-(await self.store.enqueued_count(spec.job)) // self.settings.batch_size)
            shares[spec.job] = max(1, -(-batches // endpoints))
        return shares

    def validator(self, spec: JobSpec) -> AnswerValidator | None:
        """The answer validator of ``spec``'s schema, built once per job (None: no schema)."""
        if spec.schema is None:
            return None
        if spec.job not in self._validators:
            self._validators[spec.job] = AnswerValidator(spec.schema)
        return self._validators[spec.job]

    async def advance_here(self, job: str, level: int) -> None:
        """Advance ``job``'s finished stage ``level`` in this process, in the background."""
        key = (job, level)
        if key in self._advancing and not self._advancing[key].done():
            return
        task = asyncio.create_task(self.reducer.advance(job, level), name=f"advance {job}")
        self._advancing[key] = task

        def done(t: asyncio.Task[str]) -> None:
            self._advancing.pop(key, None)
            exc = None if t.cancelled() else t.exception()
            if exc is not None:  # the next sweep tries again
                log.log(
                    logging.DEBUG if isinstance(exc, StageBusy) else logging.WARNING,
                    "job %s: stage %d not advanced yet: %s",
                    job,
                    level,
                    exc,
                )

        task.add_done_callback(done)

    def takers(self, spec: JobSpec) -> set[str]:
        return {
            d.label
            for d in self.drainers
            if d.broken is None and d.circuit.state != "open" and d.may_serve(spec)
        }

    def reclaim_soon(self, job: str) -> None:
        """Released entries wait: every drainer of this worker looks for them on its next step."""
        for d in self.drainers:
            d.reclaim_soon(job)

    async def any_work(self, may_serve: Callable[[JobSpec], bool] | None = None) -> bool:
        """True while some job (that ``may_serve`` says an endpoint may serve) still has
        entries queued or in flight, is still being fed, or has a finished stage whose reduce
        is to run."""
        await self.refresh_jobs(force=True)
        if self._reduces_pending or await self.pumps.has_work():
            return True
        for job, spec in list(self.jobs.items()):
            if may_serve is not None and not may_serve(spec):
                continue
            if await self.store.job_has_work(job):
                return True
        # A job that finished since the refresh above may have a reduce to run: look again.
        await self.refresh_jobs(force=True)
        return self._reduces_pending

    def unserved(self) -> list[JobSpec]:
        """The jobs no endpoint of this worker serves: left for other workers' endpoints."""
        return [s for s in list(self.jobs.values()) if not any(d.serves(s) for d in self.drainers)]

    def finish_when_idle(self) -> None:
        """Switch to burst mode while running: return once no work these endpoints can do
        is left (what ``arq ... --burst`` asks for, known only when arq's own loop ends)."""
        if not self.burst:
            log.info("burst: finishing the work left, then exiting")
        self.burst = True

    async def run(self, *, burst: bool = False) -> None:
        """Drain until stopped; with ``burst``, return once no job has work left."""
        self.burst = self.burst or burst
        with contextlib.suppress(SwarmError):  # the slots ride out Redis trouble
            await self.refresh_jobs(force=True)
        publisher = asyncio.create_task(self._publish_loop(), name="swarm-stats")
        pump = asyncio.create_task(self._pump_loop(), name="swarm-pump")
        try:
            await asyncio.gather(*(d.run() for d in self.drainers))
            if self.burst and not self.stopping:
                left = [
                    f"{s.job} ({f'model {s.model!r}' if s.model else 'any model'})"
                    for s in self.unserved()
                    if await self.store.job_has_work(s.job)
                ]
                if left:
                    log.info(
                        "burst: no work left that these endpoints serve; waiting for other "
                        "endpoints: %s",
                        ", ".join(left),
                    )
        finally:
            publisher.cancel()
            pump.cancel()
            await asyncio.gather(publisher, pump, return_exceptions=True)
            with contextlib.suppress(SwarmError):  # the last word: this worker has stopped
                await self.publish_stats(stopped=True)

    @property
    def broken(self) -> list[str]:
        """Why each endpoint that can take no work at all (wrong key, not an OpenAI server) is
        unusable: the reason a burst worker exits with a failure."""
        return [d.broken for d in self.drainers if d.broken is not None]

    @property
    def dead(self) -> list[str]:
        """The endpoints a burst worker gave up on, each why (see ``endpoint_dead_s``)."""
        return [d.dead for d in self.drainers if d.dead is not None]

    async def publish_stats(self, *, stopped: bool = False) -> None:
        """Publish every drainer's figures for ``swarm-status``: for the jobs served now, and
        a last word (``finished``, or ``stopped`` when this worker exits) for the jobs left;
        and each endpoint's served models in the fleet registry (taken out on stop). Stamped
        with Redis's clock, as every reader compares them with it."""
        now = await self.store.server_time()
        try:
            if stopped:
                await self.store.publish_fleet([], gone=[d.fleet_field for d in self.drainers])
            else:
                has = self.abilities
                functions = tuple(sorted(has.functions))
                rows = [
                    msgspec.structs.replace(d.info(now), functions=functions, numpy=has.numpy)
                    for d in self.drainers
                ]
                await self.store.publish_fleet(rows)
        except BadRecordError as exc:  # the jobs' figures below still go out
            self.store.warn_once("the fleet registry", str(exc))
        live = set() if stopped else set(self.jobs)
        left = (self._published | self.touched) - live
        self.touched = set()
        self._published = live
        if not (live or left):
            return
        word = "stopped" if stopped else "finished"
        mono = time.monotonic()
        await self.store.publish_endpoints(
            {
                job: {
                    d.consumer: d.stats(job, now, mono, last=None if job in live else word)
                    for d in self.drainers
                }
                for job in live | left
            }
        )

    async def _pump_loop(self) -> None:
        """The workflows' pumps, until the worker stops (see worker/pumps.py)."""
        await self.pumps.run(self.sleep, lambda: self.stopping)

    async def _publish_loop(self) -> None:
        while not await self.sleep(self.settings.stats_period_s):
            try:
                # Also here: while every slot is busy (a stalled endpoint's), none steps, and
                # a job over must still be seen, and its requests in flight cut short.
                await self.refresh_jobs()
                await self.publish_stats()
                if self._prometheus is not None:
                    await self.read_job_status()
            except SwarmError as exc:  # figures only: the work goes on without them
                log.debug("endpoint figures not published: %s", exc)

    async def start_metrics(self) -> None:
        """Serve Prometheus metrics on ``SWARM_METRICS_PORT``, if set (one page for every
        endpoint of this worker)."""
        port, addr = self.settings.metrics_port, self.settings.metrics_addr
        if self._prometheus is None:
            return
        from worker.prometheus import serve_metrics

        try:
            self._metrics_server = await serve_metrics(self._prometheus, addr, port)
        except OSError as exc:  # asyncio's own text repeats the address: the errno's is enough
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConfigError(
                f"SWARM_METRICS_PORT={port}: cannot listen on {addr}:{port} ({why})"
            ) from None
        log.info("Prometheus metrics on http://%s:%d/metrics", addr, port)

    def _build_metrics(self) -> PrometheusMetrics:
        """The worker's Prometheus metrics, reading the drainers (built after) at each scrape."""
        # Imported only when asked for: a worker without metrics starts without them.
        from worker.prometheus import EndpointGauges, PrometheusMetrics

        # While Redis is out of reach, no endpoint takes work ("paused") and no job's figure
        # can be vouched for: none is shown.
        return PrometheusMetrics(
            lambda: [
                EndpointGauges(
                    d.client.label,
                    d.window.size,
                    d.window.in_use,
                    d.circuit.state if self.redis_up else "paused",
                )
                for d in self.drainers
            ],
            lambda: self.job_status if self.redis_up else {},
            lambda: self.redis_up,
            lambda: self.pumps.shown(self.redis_up),
        )

    async def read_job_status(self) -> None:
        """Read the status of every job served now (the metrics' job gauges)."""
        status = {}
        for job in list(self.jobs):
            with contextlib.suppress(JobNotFoundError):
                status[job] = await self.store.status(job)
        self.job_status = status
        await self.pumps.read_gauges()

    async def close(self) -> None:
        await self.pumps.close()
        if self._metrics_server is not None:
            await self._metrics_server.cleanup()
            self._metrics_server = None
        for task in list(self._advancing.values()):
            task.cancel()
        await asyncio.gather(*self._advancing.values(), return_exceptions=True)
        for d in self.drainers:
            await d.client.close()
