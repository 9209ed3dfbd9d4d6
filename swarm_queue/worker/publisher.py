"""What a worker shows of itself: every endpoint's figures per job for ``swarm-status`` and
its row in the fleet registry (what it serves, the functions it has), published every
``stats_period_s`` with a last word when it stops; and its Prometheus page
(``SWARM_METRICS_PORT``), whose gauges read the drain loops, the jobs' status as last read
and what the flows show."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from swarm_queue.common.abilities import Abilities
from swarm_queue.common.errors import BadRecordError, ConfigError, JobNotFoundError
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.shards import job_of
from swarm_queue.common.store import JobStatus, WorkerStore
from swarm_queue.worker.drainer import EndpointDrainer
from swarm_queue.worker.pumps import Pumps

if TYPE_CHECKING:
    from aiohttp import web

    from swarm_queue.worker.prometheus import PrometheusMetrics

__all__ = ["Publisher"]

log = logging.getLogger("swarm.worker")


class Publisher:
    """One worker's figures and metrics page."""

    def __init__(
        self,
        store: WorkerStore,
        settings: Settings,
        drainers: list[EndpointDrainer],
        pumps: Pumps,
        *,
        jobs: Callable[[], dict[str, JobSpec]],
        abilities: Callable[[], Abilities],
    ) -> None:
        self.store, self.settings = store, settings
        self.drainers, self.pumps = drainers, pumps
        self._jobs, self._abilities = jobs, abilities
        # Jobs with prompts finished since the last publish of the endpoint figures, and the
        # jobs that publish reported as served.
        self.touched: set[str] = set()
        self._published: set[str] = set()
        # Each served job's status as last read, for the Prometheus gauges.
        self.job_status: dict[str, JobStatus] = {}
        self.prometheus = self._build_metrics() if settings.metrics_port else None
        self._server: web.AppRunner | None = None

    async def publish(self, *, stopped: bool = False) -> None:
        """Publish every drainer's figures for ``swarm-status``: for the jobs served now, and
        a last word (``finished``, or ``stopped`` when this worker exits) for the jobs left;
        and each endpoint's served models in the fleet registry (taken out on stop). Stamped
        with Redis's clock, as every reader compares them with it."""
        now = await self.store.server_time()
        try:
            if stopped:
                await self.store.publish_fleet([], gone=[d.fleet_field for d in self.drainers])
            else:
                has = self._abilities()
                functions = tuple(sorted(has.functions))
                rows = [
                    msgspec.structs.replace(d.info(now), functions=functions, numpy=has.numpy)
                    for d in self.drainers
                ]
                await self.store.publish_fleet(rows)
        except BadRecordError as exc:  # the jobs' figures below still go out
            self.store.warn_once("the fleet registry", str(exc))
        live = set() if stopped else set(self._jobs())
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

    async def read_status(self) -> None:
        """Read what the metrics' gauges show: every served job's status, the flows'."""
        if self.prometheus is None:
            return
        status = {}
        # (a shard's figures are its job's: one gauge for the job, its shards' summed)
        for job in sorted({job_of(name) for name in self._jobs()}):
            try:
                status[job] = await self.store.status(job)
            except JobNotFoundError:
                continue
        self.job_status = status
        await self.pumps.read_gauges()

    async def serve_metrics(self) -> None:
        """Serve Prometheus metrics on ``SWARM_METRICS_PORT``, if set (one page for every
        endpoint of this worker)."""
        port, addr = self.settings.metrics_port, self.settings.metrics_addr
        if self.prometheus is None:
            return
        from swarm_queue.worker.prometheus import serve_metrics

        try:
            self._server = await serve_metrics(self.prometheus, addr, port)
        except OSError as exc:  # asyncio's own text repeats the address: the errno's is enough
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConfigError(
                f"SWARM_METRICS_PORT={port}: cannot listen on {addr}:{port} ({why})"
            ) from None
        log.info("Prometheus metrics on http://%s:%d/metrics", addr, port)

    def _build_metrics(self) -> PrometheusMetrics:
        """The worker's Prometheus metrics, reading the drainers at each scrape."""
        # Imported only when asked for: a worker without metrics starts without them.
        from swarm_queue.worker.prometheus import EndpointGauges, PrometheusMetrics

        def up() -> bool:  # read at each scrape
            return self.store.reachable

        # While Redis is out of reach, no endpoint takes work ("paused") and no job's figure
        # can be vouched for: none is shown.
        return PrometheusMetrics(
            lambda: [
                EndpointGauges(
                    d.client.label,
                    d.window.size,
                    d.window.in_use,
                    d.circuit.state if up() else "paused",
                )
                for d in self.drainers
            ],
            lambda: self.job_status if up() else {},
            up,
            lambda: self.pumps.shown(up()),
        )

    async def close(self) -> None:
        if self._server is not None:
            await self._server.cleanup()
            self._server = None
