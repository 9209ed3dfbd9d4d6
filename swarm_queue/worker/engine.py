"""The drain engine: every active job served from every configured endpoint until stopped
(or, in burst mode, until nothing it can do is left).

The engine runs one :class:`~worker.drainer.EndpointDrainer` per endpoint over the jobs it
serves (:mod:`worker.jobtable`), has each urgent job's fair share of preemptions computed
(:mod:`worker.shares`), runs the flows (:mod:`worker.pumps`: whatever the registry lists,
the reduce among them), and has its figures and metrics published (:mod:`worker.publisher`);
it decides when a burst worker is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable

from swarm_queue.common.abilities import NUMPY, Abilities, has_numpy, lacking, needs
from swarm_queue.common.errors import BadRecordError, ConfigError, JobGoneError, SwarmError
from swarm_queue.common.fleet import EndpointInfo, takers
from swarm_queue.common.keys import lane_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.backend import Backend, backend_for
from swarm_queue.worker.caps import ProjectCaps
from swarm_queue.worker.drainer import EndpointDrainer
from swarm_queue.worker.jobtable import JobTable, Registry
from swarm_queue.worker.metrics import NO_METRICS, Metrics
from swarm_queue.worker.publisher import Publisher
from swarm_queue.worker.pumps import Pumps
from swarm_queue.worker.shares import fair_shares
from swarm_queue.worker.sources import Looks

__all__ = ["Engine"]

log = logging.getLogger("swarm.worker")

# How often a worker reads the fleet again for the lanes affinity keys may be given to: the
# fleet changes slowly, and an entry sent to a lane whose endpoint is gone is taken after the
# wait; every second while it knows of no endpoint but its own (the others still starting).
FLEET_REFRESH_S = 10.0
FLEET_ALONE_S = 1.0
# How often a starting worker looks whether its endpoints have said what they serve.
PROBED_EVERY_S = 0.05


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
        # The job registry as last read: one read serves the job table and every flow.
        self.registry = Registry(store)
        self.pumps = Pumps(store, settings, clients, self.registry.names)
        self.drainers: list[EndpointDrainer] = []  # filled below, once the metrics are made
        # Its figures and, when SWARM_METRICS_PORT asks for them, its Prometheus metrics.
        self.publisher = Publisher(
            store,
            settings,
            self.drainers,
            self.pumps,
            jobs=lambda: self.jobs,
            abilities=lambda: self.abilities,
        )
        self.metrics: Metrics = self.publisher.prometheus or NO_METRICS
        # Projects' caps on their lines in flight, read with the job registry.
        self.caps = ProjectCaps(store, lambda: self.jobs)
        # The looks one endpoint makes for all: the blocking read of new entries, the claims
        # of orphaned ones, the copies (see worker/sources.py).
        self.looks = Looks()
        self.drainers += [EndpointDrainer(self, c) for c in clients]
        self.numpy = has_numpy()
        self.table = JobTable(
            store, settings, lacks=self._lacks, on_over=self._over, registry=self.registry
        )
        self._refresh_lock = asyncio.Lock()
        # Per urgent job, the batches one endpoint may start by preemption (see worker/shares.py).
        self.shares: dict[str, int] = {}
        # Per model, the live lanes its jobs' affinity keys may be given to, from the fleet
        # as read at most every FLEET_REFRESH_S, and only once a job's prompts carry keys.
        self._lanes: dict[str | None, list[str]] = {}
        self._fleet: tuple[list[EndpointInfo], float] = ([], 0.0)
        self._fleet_at = -math.inf
        self._fleet_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        # Burst: return once no work these endpoints can do is left (see finish_when_idle).
        self.burst = False

    @property
    def abilities(self) -> Abilities:
        """What this worker has beyond its endpoints (see common.abilities): the functions its
        settings (and a Python session's own) allow, whether numpy imports."""
        return Abilities(frozenset(self.pumps.allowed), self.numpy)

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

    @property
    def jobs(self) -> dict[str, JobSpec]:
        """The jobs served now, by name, with the spec each was taken up with."""
        return self.table.jobs

    async def refresh_jobs(self, *, force: bool = False) -> None:
        """Pick up new jobs and drop finished ones, at most every ``jobs_refresh_s``, and
        have the fair shares computed again."""
        if not (force or self.table.due()):
            return
        async with self._refresh_lock:  # one sweep at a time
            if not (force or self.table.due()):
                return
            if await self.table.sweep() is not None:
                try:
                    await self.caps.read()
                except BadRecordError as exc:  # the caps' hash: keep the caps known
                    self.store.warn_once("the projects' caps", str(exc))
                self.shares = await fair_shares(
                    self.store, list(self.jobs.values()), self.drainers, self.settings.batch_size
                )

    def _lacks(self, spec: JobSpec) -> str | None:
        """What this worker lacks to serve ``spec``'s batches (measured here: numpy)."""
        lacks = [n for n in lacking(needs(spec), self.abilities) if n.kind == NUMPY]
        return ", ".join(n.describe() for n in lacks) if lacks else None

    def _over(self, job: str) -> None:
        for d in self.drainers:
            d.abandon(job)

    def job_gone(self, exc: JobGoneError, spec: JobSpec | None = None) -> None:
        """Work of a job was refused: the job is gone; forget it (see :meth:`JobTable.gone`)."""
        self.table.gone(exc, spec)

    def unreadable(self, exc: BadRecordError) -> None:
        """A key of a job cannot be used: skip the job until the next sweep."""
        self.table.unreadable(exc)

    async def lanes(self, spec: JobSpec) -> list[str]:
        """The lanes ``spec``'s affinity keys may be given to (see ``route.lua``): of the
        live endpoints that serve its model, as the fleet registry showed them at most
        :data:`FLEET_REFRESH_S` ago, and of this worker's own."""
        if self._fleet_stale():
            async with self._fleet_lock:
                if self._fleet_stale():
                    try:
                        self._fleet = (
                            await self.store.read_fleet(),
                            await self.store.server_time(),
                        )
                    except BadRecordError as exc:  # this worker's own endpoints, then
                        self.store.warn_once("the fleet registry", str(exc))
                        self._fleet = ([], 0.0)
                    self._fleet_at = time.monotonic()
                    self._lanes.clear()
        if spec.model not in self._lanes:
            fleet, now = self._fleet
            live = takers(spec.model, fleet, now) | self.takers(spec)
            self._lanes[spec.model] = sorted(lane_name(e) for e in live)
        return self._lanes[spec.model]

    def _fleet_stale(self) -> bool:
        others = {e.endpoint for e in self._fleet[0]} - {d.label for d in self.drainers}
        every = FLEET_REFRESH_S if others else FLEET_ALONE_S
        return time.monotonic() - self._fleet_at >= every

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
        entries queued or in flight, is still being fed, or a flow has work (a reduce's step
        among them)."""
        # Twice: a flow may queue a job (a tree's next level, a pipeline's step) between this
        # sweep's read of the jobs and its own look (that job then looks neither the flow's
        # work nor served; seen in CI under load: a burst ended with a tree's last stage
        # queued). The second sweep takes such a job up.
        for _ in range(2):
            await self.refresh_jobs(force=True)
            if await self.pumps.has_work():
                return True
            for job, spec in list(self.jobs.items()):
                if may_serve is not None and not may_serve(spec):
                    continue
                if await self.store.job_has_work(job):
                    return True
        return False

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

    @property
    def touched(self) -> set[str]:
        """Jobs with prompts finished since the figures were last published."""
        return self.publisher.touched

    async def publish_stats(self, *, stopped: bool = False) -> None:
        """Publish this worker's figures (see :meth:`Publisher.publish`)."""
        await self.publisher.publish(stopped=stopped)

    async def _pump_loop(self) -> None:
        """The workflows' pumps, until the worker stops (see worker/pumps.py)."""
        await self.pumps.run(self.sleep, lambda: self.stopping)

    async def _publish_loop(self) -> None:
        # First as soon as every endpoint has said what it serves (within a period), then
        # every period: the other workers give affinity keys to this worker's endpoints from
        # the start.
        first = time.monotonic() + self.settings.stats_period_s
        while time.monotonic() < first and any(
            d.models is None and d.broken is None for d in self.drainers
        ):
            if await self.sleep(PROBED_EVERY_S):
                return
        while True:
            try:
                # Also here: while every slot is busy (a stalled endpoint's), none steps, and
                # a job over must still be seen, and its requests in flight cut short.
                await self.refresh_jobs()
                await self.publish_stats()
                await self.publisher.read_status()
            except SwarmError as exc:  # figures only: the work goes on without them
                log.debug("endpoint figures not published: %s", exc)
            if await self.sleep(self.settings.stats_period_s):
                return

    async def start_metrics(self) -> None:
        """Serve Prometheus metrics on ``SWARM_METRICS_PORT``, if set."""
        await self.publisher.serve_metrics()

    async def close(self) -> None:
        await self.pumps.close()
        await self.publisher.close()
        for d in self.drainers:
            await d.client.close()
