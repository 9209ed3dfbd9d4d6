"""A worker's connections to Redis are bounded by its endpoints, not by its slots: one for
every two endpoints and a few more, however many batches are in flight; its idle endpoints
share one blocking read of a job (real worker process, real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.keys import Keys
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.app import worker_connections
from tests.harness import MAX_TOKENS, FleetFactory, fleet_prompt, sync_client
from tests.helpers import wait_count, wait_until

# arq's own connections beside the worker's store: its pool and its health check.
ARQ_CONNECTIONS = 3


def _clients(url: str) -> int:
    client = sync_client(url)
    try:
        return int(client.info("clients")["connected_clients"]) - 1  # (this one)
    finally:
        client.close()


def test_a_worker_of_many_endpoints_holds_one_connection_for_two_endpoints_and_a_few_more(
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
    assert bound == n_endpoints // 2 + 16
    assert peak <= bound + ARQ_CONNECTIONS, f"{peak} connections for {n_endpoints} endpoints"
    assert peak >= n_endpoints // 2  # (what was counted is the worker's)


def test_idle_endpoints_of_a_worker_share_one_blocking_read_of_the_job_they_wait_for(
    fleet_factory: FleetFactory,
) -> None:
    """Twelve endpoints waiting for a job's prompts (created, none queued yet): one of them
    blocks on the job's stream, the others wait for what it finds, and read only if it
    found some. Before, each endpoint's slots blocked on it, each read holding a connection
    of its own for its whole wait (24 blocked at once); then each endpoint still looked
    after every empty wait. The prompts, once they come, are answered as ever."""
    n_endpoints, n = 12, 200
    fleet = fleet_factory(n_endpoints, "--step-ms", "1")
    settings = Settings(redis_url=fleet.redis_url, prefix=fleet.prefix)
    spec = JobSpec(job="later", params=SamplingParams(max_tokens=MAX_TOKENS))
    asyncio.run(_with_store(settings, lambda store: store.create_job(spec)))
    fleet.worker("w", list(range(n_endpoints)), burst=False)
    client = sync_client(fleet.redis_url)
    try:
        wait_until(
            "every endpoint published",
            lambda: client.hlen(Keys(fleet.prefix).fleet) == n_endpoints,
        )
        # Its blocking reads, at their most over a second in which each endpoint looks for
        # the job's entries many times (a poll is 50 ms here); and its reads of the stream
        # in that second (a script's counted too).
        client.config_resetstat()
        blocked = 0
        for _ in range(20):
            blocked = max(blocked, int(client.info("clients")["blocked_clients"]))
            time.sleep(0.05)
        stats = client.info("commandstats")
        reads = int(stats.get("cmdstat_xreadgroup", {}).get("calls", 0))
    finally:
        client.close()
    prompts = [(fleet_prompt(i, set()), None) for i in range(n)]
    asyncio.run(_with_store(settings, lambda store: enqueue_prompts(store, spec, prompts)))
    wait_count("every prompt answered", lambda: fleet.done("later"), n)
    assert blocked == 1, f"{blocked} blocking reads for {n_endpoints} idle endpoints"
    # About one read a poll between them (20 polls in that second), not one or two an
    # endpoint each poll: before, each endpoint looked once after every empty blocking read
    # and once more on its next step (about 500 reads in that second).
    assert 10 <= reads <= 60, f"{reads} reads in a second by {n_endpoints} idle endpoints"


async def _with_store(settings: Settings, do: Callable[[JobStore], Awaitable[object]]) -> None:
    store = JobStore.from_settings(settings)
    try:
        await do(store)
    finally:
        await store.close()
