"""Operator commands: ``swarm-retry`` (queue failed prompts again) and ``swarm-cancel``.

Both are safe to run twice: a second retry finds nothing left to retry, a second cancel finds
nothing left to cancel.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence

from common.cli import add_redis_arg, open_job_store, run
from common.errors import JobConflictError
from common.keys import stage_name
from common.models import ReduceOutput
from common.store import JobStore
from common.vocab import RETRYABLE_KINDS

__all__ = ["cancel_job", "cancel_main", "retry_main"]


async def _retry(args: argparse.Namespace) -> int:
    async with open_job_store(args, patient=False) as (job, store):
        gen = (await store.load_spec(job)).generation
        status = await store.status(job)
        if status.total is None and not status.cancelled:
            raise JobConflictError(
                f"job {job!r} is still being enqueued; retry once swarm-enqueue has finished"
            )
        if status.reduce is not None and (status.reduced or status.stage > 0):
            raise JobConflictError(
                f"job {job!r}: its {status.reduce} reduce has already used these results, so "
                "retried answers would not reach it. Collect the failed prompts and submit "
                "them as a new job."
            )
        failed = await store.failed_indices(job, set(args.kind) if args.kind else None)
        n = await store.requeue(job, failed, gen=gen)
    if n == 0:
        which = f" of kind {', '.join(args.kind)}" if args.kind else ""
        print(f"job {job}: no failed prompts{which} to retry")
    else:
        kinds = Counter(kind for _, kind in failed)
        detail = ", ".join(f"{k} {c}" for k, c in sorted(kinds.items()))
        print(f"job {job}: {n} failed prompts queued again ({detail})")
    return 0


async def cancel_job(store: JobStore, job: str) -> tuple[bool, int]:
    """Stop ``job``, the tree level of its reduce running now included, and end a reduce still
    to come with an error output. Returns (newly cancelled, prompts cancelled now)."""
    gen = (await store.load_spec(job)).generation
    newly, count = await store.cancel(job)
    status = await store.status(job)
    if status.stage > 0:  # the tree level running now stops too
        count += (await store.cancel(stage_name(job, status.stage)))[1]
    if status.reduce is not None and not status.reduced:
        error = "cancelled by operator (swarm-cancel)"
        await store.write_final(job, ReduceOutput.failure(job, status.reduce, error), gen=gen)
    return newly, count


async def _cancel(args: argparse.Namespace) -> int:
    async with open_job_store(args, patient=False) as (job, store):
        newly, count = await cancel_job(store, job)
    state = "cancelled" if newly else "already cancelled"
    print(
        f"job {job}: {state}; {count} unanswered prompts recorded as failed (kind 'cancelled'); "
        f"'swarm-retry {job} --kind cancelled' resumes them"
    )
    return 0


def retry_main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="swarm-retry", description="Queue a job's failed prompts again."
    )
    p.add_argument("job")
    p.add_argument(
        "--kind",
        action="append",
        choices=[str(k) for k in RETRYABLE_KINDS],
        help="only failures of this kind (repeatable; default: every kind)",
    )
    add_redis_arg(p)
    raise SystemExit(run("swarm-retry", _retry(p.parse_args(argv))))


def cancel_main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="swarm-cancel",
        description="Stop a job: unanswered prompts are recorded as failed (kind 'cancelled').",
    )
    p.add_argument("job")
    add_redis_arg(p)
    raise SystemExit(run("swarm-cancel", _cancel(p.parse_args(argv))))
