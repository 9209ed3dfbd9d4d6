"""Each urgent job's fair share of preemptions: how many of its batches one endpoint may start
by preempting lower ones. Without it, the first worker to see an urgent job would take all of
it: each preempted slot takes the next urgent batch at once."""

from __future__ import annotations

from collections.abc import Sequence

from swarm_queue.common.errors import BadRecordError
from swarm_queue.common.fleet import serving
from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import WorkerStore
from swarm_queue.worker.drainer import EndpointDrainer

__all__ = ["fair_shares"]


async def fair_shares(
    store: WorkerStore, specs: Sequence[JobSpec], drainers: Sequence[EndpointDrainer], batch: int
) -> dict[str, int]:
    """For each of ``specs`` above the lowest priority: its batches (of ``batch`` prompts)
    over the live endpoints serving its model, at least this worker's own ``drainers`` that
    serve it."""
    if len({s.priority for s in specs}) < 2:
        return {}
    lowest = min(s.priority for s in specs)
    try:
        fleet = await store.read_fleet()
    except BadRecordError as exc:  # shares from this worker's own endpoints, then
        store.warn_once("the fleet registry", str(exc))
        fleet = []
    now = await store.server_time()
    shares = {}
    for spec in specs:
        if spec.priority == lowest:
            continue
        endpoints = max(serving(spec.model, fleet, now), sum(d.serves(spec) for d in drainers), 1)
        batches = -(-(await store.enqueued_count(spec.job)) // batch)
        shares[spec.job] = max(1, -(-batches // endpoints))
    return shares
