"""The worker's Prometheus metrics (``SWARM_METRICS_PORT``), with ``prometheus_client``.

Counters and histograms move as the drain loops work (the hooks of :class:`worker.metrics.
Metrics`); the gauges (each endpoint's window and circuit, each job's queue, what the flows
show) are read when Prometheus scrapes. One page serves every endpoint of the worker, from the
worker's own event loop (aiohttp, no thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swarm_queue.common.shards import job_of
from swarm_queue.common.store import Commit, JobStatus
from swarm_queue.flows.flow import Gauge
from swarm_queue.worker.metrics import Metrics, RequestOutcome

__all__ = [
    "CIRCUIT_STATES",
    "EndpointGauges",
    "PrometheusMetrics",
    "serve_metrics",
]

# "paused": the endpoint is fine but takes no work, its worker cannot reach Redis.
CIRCUIT_STATES = ("closed", "open", "waiting", "broken", "paused")
# Seconds: from a batch of an instant engine to a long-output batch of a busy one.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class EndpointGauges(NamedTuple):
    """One endpoint's state at a scrape."""

    endpoint: str
    window: int  # batches it may have in flight
    in_flight: int  # batches it has in flight
    circuit: str  # one of CIRCUIT_STATES


class _Gauges(Collector):
    """The gauges, read from the worker at each scrape."""

    def __init__(
        self,
        endpoints: Callable[[], Iterable[EndpointGauges]],
        jobs: Callable[[], Mapping[str, JobStatus]],
        redis_up: Callable[[], bool],
        flows: Callable[[], Iterable[Gauge]] = list,
    ) -> None:
        self._endpoints, self._jobs, self._redis_up = endpoints, jobs, redis_up
        self._flows = flows

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "swarm_redis_up", "1 while the worker reaches Redis, 0 while it cannot (no work)"
        )
        up.add_metric([], 1.0 if self._redis_up() else 0.0)
        yield up
        window = GaugeMetricFamily(
            "swarm_window_batches", "Batches the endpoint may have in flight", labels=["endpoint"]
        )
        in_flight = GaugeMetricFamily(
            "swarm_in_flight_batches", "Batches in flight at the endpoint", labels=["endpoint"]
        )
        circuit = GaugeMetricFamily(
            "swarm_circuit_state",
            "The endpoint's circuit breaker: 1 for its state, 0 for the others",
            labels=["endpoint", "state"],
        )
        for e in self._endpoints():
            window.add_metric([e.endpoint], e.window)
            in_flight.add_metric([e.endpoint], e.in_flight)
            for state in CIRCUIT_STATES:
                circuit.add_metric([e.endpoint, state], 1.0 if e.circuit == state else 0.0)
        pending = GaugeMetricFamily(
            "swarm_job_pending_prompts",
            "Prompts of the job queued and not yet in a worker's hands (as last read)",
            labels=["job"],
        )
        job_in_flight = GaugeMetricFamily(
            "swarm_job_in_flight_prompts",
            "Prompts of the job in workers' hands, not yet answered (as last read)",
            labels=["job"],
        )
        for job, status in sorted(self._jobs().items()):
            pending.add_metric([job], status.pending)
            job_in_flight.add_metric([job], status.in_flight)
        yield from (window, in_flight, circuit, pending, job_in_flight)
        for gauge in self._flows():  # what the workflows show (see flows.flow.Gauge)
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=list(gauge.labels))
            for labels, value in gauge.samples:
                family.add_metric(list(labels), value)
            yield family


class PrometheusMetrics(Metrics):
    """The worker's metrics in their own registry (not the process-wide default one)."""

    def __init__(
        self,
        endpoints: Callable[[], Iterable[EndpointGauges]],
        jobs: Callable[[], Mapping[str, JobStatus]],
        redis_up: Callable[[], bool] = lambda: True,
        flows: Callable[[], Iterable[Gauge]] = list,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._done = Counter(
            "swarm_prompts_done", "Prompts answered", ["job", "endpoint"], registry=r
        )
        self._failed = Counter(
            "swarm_prompts_failed",
            "Prompts failed, by kind of failure",
            ["job", "endpoint", "kind"],
            registry=r,
        )
        self._cache_hits = Counter(
            "swarm_cache_hits",
            "Prompts answered from the response cache, without a request (counted in done)",
            ["job", "endpoint"],
            registry=r,
        )
        self._requests = Counter(
            "swarm_requests",
            "Generation requests sent, by how they ended",
            ["job", "endpoint", "outcome"],
            registry=r,
        )
        self._retries = Counter(
            "swarm_request_retries", "Requests sent again after a failure", ["job", "endpoint"],
            registry=r,
        )  # fmt: skip
        self._latency = Histogram(
            "swarm_request_duration_seconds",
            "Seconds from sending a generation request to its answer or failure",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._batch = Histogram(
            "swarm_batch_size_prompts",
            "Prompts per batch taken",
            ["endpoint"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        r.register(_Gauges(endpoints, jobs, redis_up, flows))

    def committed(self, job: str, endpoint: str, commit: Commit) -> None:
        job = job_of(job)
        if commit.done:
            self._done.labels(job, endpoint).inc(commit.done)
        if commit.cache_hits:
            self._cache_hits.labels(job, endpoint).inc(commit.cache_hits)
        for kind, n in commit.failed_by_kind.items():
            self._failed.labels(job, endpoint, kind).inc(n)

    def batch(self, job: str, endpoint: str, prompts: int) -> None:
        self._batch.labels(endpoint).observe(prompts)

    def request(self, job: str, endpoint: str, seconds: float, outcome: RequestOutcome) -> None:
        self._requests.labels(job_of(job), endpoint, outcome).inc()
        self._latency.labels(endpoint).observe(seconds)

    def retry(self, job: str, endpoint: str) -> None:
        self._retries.labels(job_of(job), endpoint).inc()

    def page(self) -> bytes:
        """The metrics in Prometheus's text format."""
        return generate_latest(self.registry)


async def serve_metrics(metrics: PrometheusMetrics, addr: str, port: int) -> web.AppRunner:
    """Serve ``/metrics`` on ``addr:port`` until the returned runner is cleaned up."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(body=metrics.page(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, addr, port).start()
    return runner
