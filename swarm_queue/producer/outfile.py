"""Output that survives a crash, whatever its format: one collector per output (a lock), a
durable cursor moved only once what it counts is durable, and (with ``--evict``) results
leaving Redis only once the output holds them. :func:`collect_rows_durably` owns all of that;
a format is a :class:`RowSink` (a file of lines in :mod:`producer.lines`: JSON Lines, OpenAI
batch lines, CSV; a Parquet directory in :mod:`producer.parquet`), chosen by name in
:mod:`producer.formats`.

A collector never truncates or deletes output it did not write: it resumes only output whose
cursor says an unfinished run of the same job (same generation) wrote it; a complete output
(its cursor says so) is left alone, and any other existing output is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import msgspec

from swarm_queue.common.errors import ConfigError, ResultsEvictedError
from swarm_queue.common.models import JobSpec, Result, result_or_failure
from swarm_queue.common.output import CollectReport
from swarm_queue.common.store import CollectorStore, JobStatus
from swarm_queue.producer.stream import (
    check_kept,
    collect_into,
    wait_for_spec,
)

__all__ = [
    "Cursor",
    "CursorFile",
    "Mark",
    "RowSink",
    "already_complete",
    "bring_up_to_date",
    "claim_output",
    "collect_rows_durably",
    "output_lock",
]


class Cursor(msgspec.Struct, frozen=True):
    """How far an output is known to be complete: ``index`` results, ``offset`` bytes of a
    JSON Lines file, ``parts`` closed files of a Parquet directory; of which generation of the
    job (see ``JobSpec.generation``), and whether the output holds the whole job."""

    job: str
    index: int
    offset: int = 0
    parts: int = 0
    generation: str = ""
    complete: bool = False
    # The job's revision (swarm-retry rounds) the output holds the answers of.
    revision: int = 0
    # Whether this output was collected with --evict: then it is the only copy of what left
    # Redis, and the one that can be brought up to date after a retry.
    evicts: bool = False

    @classmethod
    def at(cls, job: str, mark: Mark, **state: Any) -> Cursor:
        """The cursor of ``job``'s output durable up to ``mark``; ``state``: the rest."""
        return cls(job, mark.index, mark.offset, mark.parts, **state)


_cursor_decoder = msgspec.json.Decoder(Cursor)


class CursorFile:
    """The durable cursor of an output file, kept beside it as ``FILE.cursor``.

    It is replaced atomically after the lines it counts are fsynced, so after a crash at any
    point the output can be cut back to the last committed line and continued: a rerun writes
    a file byte-identical to an uninterrupted run.
    """

    def __init__(self, out_path: str) -> None:
        self.path = out_path + ".cursor"

    def load(self, job: str) -> Cursor | None:
        try:
            with open(self.path, "rb") as fh:
                cursor = _cursor_decoder.decode(fh.read())
        except FileNotFoundError:
            return None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{self.path} is corrupt ({exc}); delete it to start over") from None
        if cursor.job != job:
            raise ConfigError(
                f"{self.path} belongs to job {cursor.job!r}, not {job!r}; "
                "choose another --out or delete the cursor file"
            )
        return cursor

    def save(self, cursor: Cursor) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(msgspec.json.encode(cursor))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def claim_output(
    path: str, job: str, generation: str, *, present: bool
) -> tuple[CursorFile, Cursor | None]:
    """What this run may do with the output ``path`` of ``job`` (``present``: it exists and
    holds something): resume after the cursor returned, start anew (None), or, when the cursor
    says the output is complete, nothing (the cursor, ``complete``). Output some other run or
    tool wrote is refused, never truncated."""
    cursors = CursorFile(path)
    cursor = cursors.load(job)
    if cursor is not None and cursor.generation not in ("", generation):
        raise ConfigError(
            f"{path} was collected from an earlier job named {job!r} (deleted since, or lost "
            "with Redis); it is left alone: choose another --out"
        )
    if cursor is not None and cursor.complete:
        if present:
            return cursors, cursor
        cursors.remove()  # the complete output was removed: collect it again
        cursor = None
    if cursor is None and present:
        raise ConfigError(
            f"{path} exists and no unfinished swarm-collect of job {job!r} wrote it; it is "
            "left alone (swarm-collect never overwrites output it did not write): choose "
            "another --out, or remove it to collect again"
        )
    return cursors, cursor


def _refreshable(sink: object) -> Refreshable | None:
    """``sink`` if its format can bring a complete output up to date (see LineSink.refresh)."""
    return sink if callable(getattr(sink, "refresh", None)) else None  # type: ignore[return-value]


class Refreshable(Protocol):
    """A sink whose complete output can be brought up to date in place."""

    async def refresh(
        self, rows: int, fetch: Callable[[int, int], Awaitable[list[Result | None]]]
    ) -> tuple[Mark, int]: ...


async def _wait_finished(store: CollectorStore, job: str, *, wait: bool) -> JobStatus:
    """The job's status once every prompt has its result (at once without ``wait``)."""
    while True:
        status = await store.status(job, rate=False)
        if status.finished or not wait:
            return status
        await asyncio.sleep(REFRESH_POLL_S)


REFRESH_POLL_S = 0.5


async def bring_up_to_date(
    store: CollectorStore,
    job: str,
    path: str,
    sink: object,
    cursors: CursorFile,
    cursor: Cursor,
    *,
    wait: bool,
    evict: bool,
) -> CollectReport:
    """A complete output of ``job`` collected before a swarm-retry: once the retried prompts
    are answered, every row Redis holds a result for is written anew (the rest kept), the
    cursor records the revision, and with ``evict`` the new answers leave Redis."""
    status = await _wait_finished(store, job, wait=wait)
    if status.evicted and not cursor.evicts:
        raise ResultsEvictedError(
            f"job {job!r} was retried since {path} was collected, and results up to "
            f"{status.evicted - 1} were collected with --evict into another output since: that "
            "output is brought up to date (collect it again), this one cannot be"
        )
    if not status.finished:
        print(
            f"swarm-collect: job {job} was retried since {path} was collected, and its retried "
            "prompts are not all answered yet",
            file=sys.stderr,
        )
        return CollectReport(job, 0, 0, 0, status.total, untouched=True)
    refreshable = _refreshable(sink)
    if refreshable is None:
        raise ConfigError(
            f"job {job} was retried since {path} was collected, and this output cannot be "
            "brought up to date in place: collect it again into another --out (the answers "
            "of every retried prompt are in Redis)"
        )
    changed: set[int] = set()
    failed = 0

    async def fetch(start: int, count: int) -> list[Result | None]:
        nonlocal failed
        blobs = await store.fetch_results(job, start, count)
        rows = [None if b is None else result_or_failure(i, b) for i, b in enumerate(blobs, start)]
        for r in rows:
            if r is not None:
                changed.add(r.index)
                failed += not r.ok
        return rows

    mark, replaced = await refreshable.refresh(cursor.index, fetch)
    cursors.save(
        Cursor.at(
            job,
            mark,
            generation=cursor.generation,
            complete=True,
            revision=status.revision,
            evicts=cursor.evicts or evict,
        )
    )
    if evict and changed:
        await store.evict_results(job, min(changed), max(changed) + 1, gen=cursor.generation)
    print(
        f"swarm-collect: job {job} was retried since {path} was collected: brought it up to "
        f"date ({replaced} rows changed)",
        file=sys.stderr,
    )
    return CollectReport(job, cursor.index, cursor.index - failed, failed, status.total)


def already_complete(job: str, path: str, cursor: Cursor) -> CollectReport:
    """The report of a run that found ``path`` complete and left it alone."""
    print(
        f"swarm-collect: {path} already holds all {cursor.index} results of job {job}; left alone",
        file=sys.stderr,
    )
    return CollectReport(job, 0, 0, 0, cursor.index, cursor.index, untouched=True)


@contextlib.contextmanager
def output_lock(path: str) -> Iterator[None]:
    """Hold ``FILE.lock`` while writing ``FILE`` (or directory): a second collector on the
    same output is refused, naming the first, instead of the two overwriting each other's
    lines."""
    lock_path = path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{path} is being written by another swarm-collect ({holder}); wait for it to "
                "finish, or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode(), 0)
        yield
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
    finally:
        os.close(fd)


class Mark(msgspec.Struct, frozen=True):
    """How far a sink's output is durable: ``index`` results, ``offset`` bytes of a file,
    ``parts`` closed files of a directory (what its :class:`Cursor` records)."""

    index: int
    offset: int = 0
    parts: int = 0


R = TypeVar("R")


class RowSink(Protocol[R]):
    """One output format, written durably by :func:`collect_rows_durably`: it says whether its
    output holds anything, prepares it to start anew or to resume after a mark (cutting back
    what was written after it), takes rows (a job's results, a pipeline's chains) in order and
    says how far they are durable."""

    def present(self) -> bool:
        """Whether the output exists and holds something (a new collection refuses it)."""
        ...

    def open(self, mark: Mark | None) -> Mark:
        """Start anew (``mark`` None) or resume after ``mark``; the mark it starts at."""
        ...

    def put(self, rows: list[R], index: int) -> Mark | None:
        """Take ``rows`` (up to input index ``index``); the new durable mark, if it moved."""
        ...

    def close(self) -> Mark:
        """Make everything taken durable and close; the final mark."""
        ...

    def abandon(self) -> None:
        """Stop after a failure: close without making the unmarked rest durable."""
        ...


async def collect_rows_durably(
    store: CollectorStore,
    job: str,
    path: str,
    make_sink: Callable[[str, JobSpec], RowSink[R]],
    *,
    rows: Callable[..., AsyncIterator[list[R]]],
    ok: Callable[[R], bool] | None = None,
    model_of: Callable[[R], str] | None = None,
    wait: bool,
    progress: bool,
    evict: bool = False,
    results: bool = False,
) -> CollectReport:
    """Collect the rows of ``job`` (one per input index, in order, as ``rows`` yields them:
    :func:`producer.stream.follow`'s signature; ``ok``, ``model_of``: see
    :func:`producer.stream.collect_into`) into the
    output at ``path`` that ``make_sink(path, spec)`` writes, resuming from its durable cursor
    after an interrupted run. ``evict`` deletes results from Redis once the output holds them
    durably: the output becomes the only copy, and Redis memory stays bounded on a huge job.
    ``results``: the rows are the job's results, so a complete output can be brought up to
    date after a swarm-retry."""
    with output_lock(path):
        spec = await wait_for_spec(store, job, wait=wait)
        gen, sink = spec.generation, make_sink(path, spec)
        cursors, cursor = claim_output(path, job, gen, present=sink.present())
        status = await store.status(job)
        if cursor is not None and cursor.complete:
            if status.revision > cursor.revision:  # swarm-retry ran since
                return await bring_up_to_date(
                    store, job, path, sink if results else None, cursors, cursor, wait=wait,
                    evict=evict,
                )  # fmt: skip
            return already_complete(job, path, cursor)
        check_kept(status, 0 if cursor is None else cursor.index)
        # The revision this run's output holds the answers of (a retry during the run is
        # caught by the next one, which brings the file up to date).
        revision = status.revision
        start = sink.open(
            None if cursor is None else Mark(cursor.index, cursor.offset, cursor.parts)
        )
        evicted = 0

        async def durable(mark: Mark, *, complete: bool = False) -> None:
            nonlocal evicted
            cursors.save(
                Cursor.at(
                    job,
                    mark,
                    generation=gen,
                    complete=complete,
                    revision=revision,
                    evicts=evict or (cursor is not None and cursor.evicts),
                )
            )
            if evict and mark.index > evicted:  # only what the output holds leaves Redis
                await store.evict_results(job, evicted, mark.index, gen=gen)
                evicted = mark.index

        # (Saved at once, and evicted up to: a crash may have come between the two.)
        await durable(start)

        async def put(chunk: list[R], index: int) -> None:
            mark = sink.put(chunk, index)
            if mark is not None:
                await durable(mark)

        try:
            report = await collect_into(
                store,
                job,
                put,
                rows=rows,
                ok=ok,
                model_of=model_of,
                wait=wait,
                progress=progress,
                start=start.index,
            )
        except BaseException:
            sink.abandon()
            raise
        # The cursor now says whether the output holds the whole job.
        await durable(sink.close(), complete=report.complete)
    return report
