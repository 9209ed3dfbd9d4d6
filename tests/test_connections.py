"""A worker's connections to Redis are bounded by its endpoints, not by its slots: one for
each endpoint (its blocking read while it has no work) and a few shared, however many
batches are in flight (real worker process, real Redis)."""

from __future__ import annotations

from swarm_queue.common.settings import Settings
from swarm_queue.worker.app import worker_connections
from tests.harness import FleetFactory, sync_client
from tests.helpers import wait_count

# arq's own connections beside the worker's store: its pool and its health check.
ARQ_CONNECTIONS = 3


def _clients(url: str) -> int:
    client = sync_client(url)
    try:
        return int(client.info("clients")["connected_clients"]) - 1  # (this one)
    finally:
        client.close()


def test_a_worker_of_many_endpoints_holds_one_connection_an_endpoint_and_a_few_more(
    fleet_factory: FleetFactory,
) -> None:
    n_endpoints, n = 12, 3000
    fleet = fleet_factory(n_endpoints, "--step-ms", "1")
    before = _clients(fleet.redis_url)
    assert fleet.enqueue("many", n, set()).wait(timeout=120) == 0
    peak = 0

    def done() -> int:
        nonlocal peak
        peak = max(peak, _clients(fleet.redis_url) - before)
        return fleet.done("many")

    fleet.worker(
        "w", list(range(n_endpoints)), burst=False, SWARM_BATCH_SIZE="4", SWARM_INFLIGHT="8"
    )
    wait_count("every prompt answered", done, n)
    peak = max(peak, _clients(fleet.redis_url) - before)  # (a pool keeps what it opened)
    bound = worker_connections(Settings(endpoints=[f"http://e{i}" for i in range(n_endpoints)]))
    assert bound == n_endpoints + 16
    assert peak <= bound + ARQ_CONNECTIONS, f"{peak} connections for {n_endpoints} endpoints"
    assert peak >= n_endpoints // 2  # (what was counted is the worker's)
