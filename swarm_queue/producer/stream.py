"""A job's results in input order as they arrive, and its reduce output: what swarm-collect,
the Python API and the benchmarks read.

Results land in Redis in whatever order the endpoints finish; the longest contiguous prefix of
finished indices is handed on, so output starts long before the job ends.
"""

from __future__ import annotations

import asyncio
import difflib
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from swarm_queue.common.backoff import backoff_s
from swarm_queue.common.errors import (
    ConfigError,
    JobGoneError,
    JobNotFoundError,
    ResultsEvictedError,
    StoreUnavailable,
    SwarmError,
)
from swarm_queue.common.final import ReduceOutput
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import CollectReport
from swarm_queue.common.progress import Progress
from swarm_queue.common.store import CollectorStore, JobStatus
from swarm_queue.flows.pipeline.spec import link_of

__all__ = [
    "check_kept",
    "collect_into",
    "follow_rows",
    "wait_final",
    "wait_for_job",
    "wait_for_spec",
]

CHUNK = 2000
MIN_ASK = 256


R = TypeVar("R")


# How long a collector following a job (--wait) waits for a job that is not queued yet (it
# may start before its producer) before it takes the name for a mistake.
JOB_APPEAR_S = 300.0


async def _unknown(store: CollectorStore, job: str, error: JobNotFoundError) -> str:
    """``error`` with the names of this Redis's jobs most like ``job``: a misspelt name."""
    try:
        names = await store.list_jobs()
    except SwarmError:
        return str(error)
    close = difflib.get_close_matches(job, names, n=3)
    if close:
        return f"{error} (did you mean {' or '.join(map(repr, close))}?)"
    return f"{error} (its jobs: {', '.join(names[:10]) or 'none'})"


async def wait_for_spec(
    store: CollectorStore,
    job: str,
    *,
    wait: bool,
    poll_s: float = 0.5,
    appear_s: float = JOB_APPEAR_S,
) -> JobSpec:
    """The job's spec; raise JobNotFoundError for an unknown job, unless following it
    (``--wait``): then the collector may start before the producer, says what it waits for,
    and waits up to ``appear_s`` for the job to be queued."""
    told = False
    deadline = time.monotonic() + appear_s
    while True:
        try:
            return await store.load_spec(job)
        except JobNotFoundError as exc:
            if not wait:
                raise JobNotFoundError(await _unknown(store, job, exc)) from None
            if time.monotonic() >= deadline:
                why = await _unknown(store, job, exc)
                raise JobNotFoundError(f"{why}: none was queued in {appear_s:g} s") from None
            if not told:
                print(
                    f"swarm-collect: waiting for job {job!r} to be enqueued (up to "
                    f"{appear_s:g} s): {await _unknown(store, job, exc)}",
                    file=sys.stderr,
                )
                told = True
        except StoreUnavailable as exc:
            if not wait:
                raise
            print(f"swarm-collect: {exc}; retrying", file=sys.stderr)
        await asyncio.sleep(max(poll_s, 0.5))


async def wait_for_job(store: CollectorStore, job: str, wait: bool, poll_s: float) -> str:
    """The job's generation (see :func:`wait_for_spec`)."""
    return (await wait_for_spec(store, job, wait=wait, poll_s=poll_s)).generation


def check_kept(status: JobStatus, start: int) -> None:
    """Raise :class:`ResultsEvictedError` if results from ``start`` on have left Redis with
    another collector's ``--evict``."""
    if start < status.evicted:
        raise ResultsEvictedError(
            f"job {status.job!r}: results {start} to {status.evicted - 1} were collected with "
            "--evict into another output and are no longer in Redis: that output holds them"
        )


# Reads the rows of a job from an index on, up to a count, stopping before the first not in yet.
Fetch = Callable[[CollectorStore, str, int, int], Awaitable[list[R]]]


async def follow_rows(
    store: CollectorStore,
    job: str,
    fetch: Fetch[R],
    *,
    start: int = 0,
    wait: bool = False,
    poll_s: float = 0.2,
    on_status: Callable[[JobStatus, int], None] | None = None,
) -> AsyncIterator[list[R]]:
    """The rows of ``job`` (read by ``fetch``) from index ``start`` on, in order, a chunk at
    a time as they arrive. Ends when every input has its row or, without ``wait``, when the
    next one is not in yet. With ``wait``, a Redis outage is waited out. ``on_status(status,
    next_index)`` sees the job's status between chunks. Results that left Redis with another
    collector's ``--evict`` raise :class:`ResultsEvictedError`, and a job deleted and queued
    again under its name meanwhile :class:`JobGoneError`: one output never mixes two jobs."""
    generation = await wait_for_job(store, job, wait, poll_s)
    cursor = start
    failures = 0
    ask = CHUNK
    while True:
        try:
            chunk = await fetch(store, job, cursor, ask)
            if chunk:
                cursor += len(chunk)
                yield chunk
            if len(chunk) == ask:
                ask = CHUNK
                continue
            status = await store.status(job, rate=False)
            if status.generation != generation:
                raise JobGoneError(job)
            check_kept(status, cursor)
            # Ask only for as many rows as there can be past the cursor (a row needs its
            # input's result, and every one before the cursor is in): polling a job's head
            # would otherwise read CHUNK empty fields each time. At least MIN_ASK, so that a
            # count thrown off (a retry behind the cursor) cannot stall it.
            ask = min(CHUNK, max(MIN_ASK, status.done + status.failed - cursor))
            failures = 0
        except StoreUnavailable as exc:
            if not wait:
                raise
            failures += 1  # Redis restarting: keep following the job, slower
            print(f"swarm-collect: {exc}; retrying", file=sys.stderr)
            await asyncio.sleep(backoff_s(failures, base_s=0.5, cap_s=10.0))
            continue
        if on_status is not None:
            on_status(status, cursor)
        if (status.total is not None and cursor >= status.total) or not wait:
            return
        await asyncio.sleep(poll_s)


async def collect_into(
    store: CollectorStore,
    job: str,
    put: Callable[[list[R], int], Awaitable[None]],
    *,
    rows: Callable[..., AsyncIterator[list[R]]],
    ok: Callable[[R], bool] | None = None,
    model_of: Callable[[R], str] | None = None,
    wait: bool = False,
    poll_s: float = 0.2,
    progress: bool = False,
    start: int = 0,
) -> CollectReport:
    """Hand the ``rows`` of ``job`` (see :func:`producer.output.follow_output`) from ``start`` on to
    ``put(chunk, cursor)``, in order, ``cursor`` being the index after the chunk; with
    ``progress``, a bar on stderr. Every output format (JSON Lines, Parquet) is a ``put``.
    ``ok(row)``: whether a row counts as answered (default: its ``ok``); ``model_of(row)``: the
    model that answered it, counted in the report ("": none)."""
    is_ok: Callable[[Any], bool] = ok or (lambda r: r.ok)
    models: Counter[str] = Counter()
    cursor = start
    answered = failed = 0
    total: int | None = None
    bar = Progress("swarm-collect", f"job {job}", "answered", enabled=progress)

    def show(status: JobStatus, written: int) -> None:
        nonlocal total
        total = status.total
        bar.update(
            status.done + status.failed,
            total if total is not None else status.enqueued,
            failed=status.failed,
            written=written,
        )

    try:
        async for chunk in rows(store, job, start=start, wait=wait, poll_s=poll_s, on_status=show):
            n_ok = sum(1 for r in chunk if is_ok(r))
            if model_of is not None:
                models.update(m for r in chunk if (m := model_of(r)))
            answered += n_ok
            failed += len(chunk) - n_ok
            cursor += len(chunk)
            await put(chunk, cursor)
    finally:
        bar.close()
    return CollectReport(job, cursor - start, answered, failed, total, start, models=dict(models))


async def wait_final(
    store: CollectorStore, job: str, *, wait: bool, poll_s: float = 0.5
) -> ReduceOutput | None:
    """The job's reduce output; with ``wait``, waits for it. ConfigError if it has no reduce."""
    await wait_for_job(store, job, wait, poll_s)
    spec = await store.load_spec(job)
    while (link := link_of(spec)) is not None:  # a pipeline's reduce runs over its last step
        job = link.job
        spec = await store.load_spec(job)
    if spec.reduce is None:
        raise ConfigError(
            f"job {job!r} has no reduce stage (swarm-enqueue --reduce); collect its results "
            "without --final"
        )
    while True:
        final = await store.read_final(job)
        if final is not None or not wait:
            return final
        await asyncio.sleep(poll_s)
