"""What a batch is as a swarm-queue job: the spec it is queued as, and its request counts,
usage and pace read from its job's status (the driver writes them at its end; the API shows
them live)."""

from __future__ import annotations

from swarm_queue.common.batchapi import (
    BatchError,
    BatchErrors,
    BatchObject,
    BatchUsage,
    InputTokensDetails,
    OutputTokensDetails,
    RequestCounts,
)
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import JobStatus

__all__ = ["LATE", "batch_spec", "counts_of", "late", "usage_of"]

# The code of a running batch's note that it will not finish in its window at its pace.
LATE = "deadline_at_risk"
# Answers seen before its pace is taken to say anything.
PACE_AFTER = 20


def batch_spec(batch: BatchObject) -> JobSpec:
    """The job a batch is queued as (its model comes from its lines): each output line with
    its request's usage, as OpenAI writes them (``line_usage``)."""
    options = JobOptions(
        chat=batch.endpoint == "/v1/chat/completions",
        responses=batch.endpoint == "/v1/responses",
        embed=batch.endpoint == "/v1/embeddings",
        line_usage=True,
    )
    spec, _ = build_spec(batch.id, options, source="swarm-gateway")
    return spec


def counts_of(done: int, failed: int, total: int) -> RequestCounts:
    return RequestCounts(total=total, completed=done, failed=failed)


def usage_of(status: JobStatus) -> BatchUsage:
    """The batch's usage: its job's tokens, every request's as its engine counted them."""
    tokens = status.prompt_tokens, status.completion_tokens
    return BatchUsage(
        input_tokens=tokens[0],
        input_tokens_details=InputTokensDetails(status.cached_tokens),
        output_tokens=tokens[1],
        output_tokens_details=OutputTokensDetails(status.reasoning_tokens),
        total_tokens=sum(tokens),
    )


def late(batch: BatchObject, status: JobStatus, now: float) -> BatchErrors | None:
    """A running batch's note (code :data:`LATE`) when, at the pace its job has had so far,
    its requests left would end past its window: said as soon as that pace means anything,
    not at the window's end. None while it keeps to its window (or too early to tell)."""
    seen = status.done + status.failed
    total = status.total if status.total is not None else status.enqueued
    if seen < PACE_AFTER or status.rate_per_s <= 0 or seen >= total:
        return None
    need_s, left_s = (total - seen) / status.rate_per_s, batch.expires_at - now
    if need_s <= left_s:
        return None
    message = (
        f"at its pace so far ({status.rate_per_s:.1f} requests/s) its {total - seen} requests "
        f"left need about {need_s:.0f} s, and its completion window ends in "
        f"{max(0.0, left_s):.0f} s: what is not answered by then ends batch_expired"
    )
    return BatchErrors(data=[BatchError(code=LATE, message=message)])
