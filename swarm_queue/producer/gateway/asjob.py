"""What a batch is as a swarm-queue job: the spec it is queued as, and its request counts and
usage read from its job's status (the driver writes them at its end; the API shows them live)."""

from __future__ import annotations

from swarm_queue.common.batchapi import BatchObject, BatchUsage, RequestCounts
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import JobStatus

__all__ = ["batch_spec", "counts_of", "usage_of"]


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
    return BatchUsage(input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=sum(tokens))
