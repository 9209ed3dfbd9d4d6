"""Operator commands: ``swarm-retry`` (queue failed prompts again) and ``swarm-cancel``.

Both are safe to run twice: a second retry finds nothing left to retry, a second cancel finds
nothing left to cancel.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence

from swarm_queue.common.cli import Parser, add_redis_arg, open_job_store, run
from swarm_queue.common.errors import JobConflictError
from swarm_queue.common.final import ReduceOutput
from swarm_queue.common.keys import stage_name
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import RETRYABLE_KINDS
from swarm_queue.flows.agents.spec import agent_of
from swarm_queue.flows.steps import later_steps

__all__ = ["cancel_job", "cancel_main", "retry_main"]

# The kind swarm-retry gives an answer from the response cache (see lua/retry.lua).
CACHED = "+"


async def _retry(args: argparse.Namespace) -> int:
    async with open_job_store(args, patient=False) as (job, store):
        spec = await store.load_spec(job)
        # A workflow's later steps too (not an agent's turns: its agents go on by tool calls):
        # a prompt failed at step k is asked again at step k, from the entry that step kept,
        # and its answer goes on as any other.
        steps = [spec, *(await later_steps(store, spec) if agent_of(spec) is None else [])]
        for k, step in enumerate(steps):
            n, chosen = await _retry_one(store, step.job, step.generation, args, first=k == 0)
            _say_retried(step.job, n, chosen, args, quiet=k > 0)
    return 0


async def _retry_one(
    store: JobStore, job: str, gen: str, args: argparse.Namespace, *, first: bool
) -> tuple[int, list[tuple[int, str]]]:
    """Queue ``job``'s chosen prompts again; ``(how many, the chosen)``."""
    status = await store.status(job)
    if status.total is None and not status.cancelled:
        if not first:
            return 0, []  # a later step still being fed: nothing of it failed for good yet
        raise JobConflictError(
            f"job {job!r} is still being enqueued; retry once swarm-enqueue has finished"
        )
    if status.reduce is not None and (status.reduced or status.stage > 0):
        raise JobConflictError(
            f"job {job!r}: its {status.reduce} reduce has already used these results, so "
            "retried answers would not reach it. Collect the failed prompts and submit "
            "them as a new job."
        )
    chosen: list[tuple[int, str]] = []
    if args.kind or not args.uncached:
        chosen += await store.failed_indices(job, set(args.kind) if args.kind else None)
    if first and (args.uncached or args.indexes is not None):
        chosen += [(i, CACHED) for i in await store.cached_indices(job)]
    if first and args.indexes is not None:
        chosen = [(i, kind) for i, kind in chosen if i in args.indexes]
    elif args.indexes is not None:
        return 0, []  # indexes name the first step's prompts
    return await store.requeue(job, sorted(chosen), gen=gen), chosen


def _say_retried(
    job: str, n: int, chosen: list[tuple[int, str]], args: argparse.Namespace, *, quiet: bool
) -> None:
    """What a retry of ``job`` did (``quiet``: a later step, said only if it did something)."""
    if args.indexes is not None and not quiet and (kept := len(args.indexes) - len(chosen)):
        print(
            f"job {job}: {kept} of the given indexes kept no entry to queue again (answered "
            "by an endpoint, or not in the job): only failed prompts and answers from the "
            "response cache can be asked again",
            file=sys.stderr,
        )
    what = "prompts" if args.uncached or args.indexes is not None else "failed prompts"
    if n == 0:
        if not quiet:
            which = f" of kind {', '.join(args.kind)}" if args.kind else ""
            print(f"job {job}: no {what}{which} to retry")
        return
    kinds = Counter("from the cache" if kind == CACHED else kind for _, kind in chosen)
    detail = ", ".join(f"{k} {c}" for k, c in sorted(kinds.items()))
    print(f"job {job}: {n} {what} queued again ({detail})")


def _indexes(text: str) -> frozenset[int]:
    """``3,7,10-20`` as a set of prompt indexes (argparse's type for --indexes)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not an index or a range like 10-20"
            ) from None
        if first < 0 or last < first or last - first >= 10_000_000:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a range of indexes")
        out.update(range(first, last + 1))
    return frozenset(out)


async def cancel_job(store: JobStore, job: str) -> tuple[bool, int]:
    """Stop ``job`` whole: its later steps (a pipeline's, an agent job's turns) and the tree
    level of a reduce running now included, and end a reduce still to come with an error
    output. Returns (newly cancelled, prompts cancelled now)."""
    spec = await store.load_spec(job)
    newly, count = await _cancel_one(store, spec.job, spec.generation)
    for step in await later_steps(store, spec):  # after the first: no new answer moves on
        count += (await _cancel_one(store, step.job, step.generation))[1]
    return newly, count


async def _cancel_one(store: JobStore, job: str, gen: str) -> tuple[bool, int]:
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
    p = Parser(
        prog="swarm-retry",
        description="Queue a job's failed prompts again, or the ones answered from the "
        "response cache (asked of an endpoint, their new answers replacing the cache's).",
    )
    p.add_argument("job")
    p.add_argument(
        "--kind",
        action="append",
        choices=[str(k) for k in RETRYABLE_KINDS],
        help="only failures of this kind (repeatable; default: every kind)",
    )
    p.add_argument(
        "--uncached",
        action="store_true",
        help="the prompts answered from the response cache (with --kind: those failures too)",
    )
    p.add_argument(
        "--indexes",
        type=_indexes,
        metavar="LIST",
        help="only these prompts (e.g. 3,7,10-20), failed or answered from the cache",
    )
    add_redis_arg(p)
    raise SystemExit(run("swarm-retry", _retry(p.parse_args(argv))))


def cancel_main(argv: Sequence[str] | None = None) -> None:
    p = Parser(
        prog="swarm-cancel",
        description="Stop a job: unanswered prompts are recorded as failed (kind 'cancelled').",
    )
    p.add_argument("job")
    add_redis_arg(p)
    raise SystemExit(run("swarm-cancel", _cancel(p.parse_args(argv))))
