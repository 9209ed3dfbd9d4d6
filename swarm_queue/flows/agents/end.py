"""A cancelled agent job's agents ended wherever they wait: thinking at an endpoint, parked on
a tool, or not begun. ``swarm-cancel`` fails the prompts queued in the job's turns; an agent
waiting for a tool holds no prompt, so its pump ends it here, with every other agent that has
no outcome yet, and the job's collector and status end with them."""

from __future__ import annotations

import msgspec

from swarm_queue.common.models import JobSpec, result_or_failure
from swarm_queue.common.store import FlowStore
from swarm_queue.flows.agents.spec import AgentResult

__all__ = ["CANCELLED", "end_cancelled"]

CANCELLED = "the job was cancelled (swarm-cancel) before this agent finished"
_CHUNK = 1000
_encoder = msgspec.msgpack.Encoder()


async def end_cancelled(store: FlowStore, spec: JobSpec, custom_ids: dict[int, str | None]) -> int:
    """Write an outcome ``cancelled`` for every agent of ``spec``'s job without one
    (``custom_ids``: those of the parked agents; the others' are read from their first turn's
    result). Returns how many were ended now."""
    total = await store.enqueued_count(spec.job)
    ended = 0
    for start in range(0, total, _CHUNK):
        count = min(_CHUNK, total - start)
        have = await store.outcomes(spec.job, start, count)
        open_ = [start + j for j, blob in enumerate(have) if blob is None]
        if not open_:
            continue
        firsts = await store.results_at(spec.job, open_)
        ends = {}
        for i, raw in zip(open_, firsts, strict=True):
            cid = custom_ids.get(i)
            if cid is None and raw is not None:
                cid = result_or_failure(i, raw).custom_id
            ends[i] = _encoder.encode(
                AgentResult(index=i, custom_id=cid, failure="cancelled", error=CANCELLED)
            )
        ended += await store.record_outcomes(spec.job, gen=spec.generation, results=ends)
    return ended
