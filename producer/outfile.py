"""An output file that survives a crash: lines fsynced before a durable cursor moves, one
collector per file, and (with ``--evict``) results leaving Redis only once the file holds them.

A collector never truncates or deletes output it did not write: it resumes only a file whose
cursor says an unfinished run of the same job (same generation) wrote it; a complete output
(its cursor says so) is left alone, and any other existing output is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO

import msgspec

from common.errors import ConfigError
from common.models import Result
from common.store import JobStore
from producer.stream import CollectReport, check_kept, collect, wait_for_job

__all__ = [
    "Cursor",
    "CursorFile",
    "already_complete",
    "claim_output",
    "collect_to_file",
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


def _holds_bytes(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:
        return False


def already_complete(job: str, path: str, cursor: Cursor) -> CollectReport:
    """The report of a run that found ``path`` complete and left it alone."""
    print(
        f"swarm-collect: {path} already holds all {cursor.index} results of job {job}; left alone",
        file=sys.stderr,
    )
    return CollectReport(job, 0, 0, 0, cursor.index, cursor.index, untouched=True)


async def collect_to_file(
    store: JobStore,
    job: str,
    path: str,
    *,
    wait: bool,
    progress: bool,
    evict: bool = False,
    line: Callable[[Result], bytes] | None = None,
) -> CollectReport:
    """Collect into ``path``, resuming from its durable cursor after an interrupted run.

    ``evict`` deletes each result from Redis once its line is fsynced in ``path``: the file
    becomes the only copy, and Redis memory stays bounded on a huge job.
    """
    with output_lock(path):
        return await _collect_locked(store, job, path, wait, progress, evict, line)


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


async def _collect_locked(
    store: JobStore,
    job: str,
    path: str,
    wait: bool,
    progress: bool,
    evict: bool,
    line: Callable[[Result], bytes] | None,
) -> CollectReport:
    gen = await wait_for_job(store, job, wait, poll_s=0.5)
    cursors, cursor = claim_output(path, job, gen, present=_holds_bytes(path))
    if cursor is not None and cursor.complete:
        return already_complete(job, path, cursor)
    check_kept(await store.status(job), 0 if cursor is None else cursor.index)
    fh: BinaryIO
    if cursor is None:
        fh = open(path, "wb")  # noqa: SIM115, ASYNC230 - closed below; a CLI, nothing else runs
        start, offset = 0, 0
    else:
        try:
            fh = open(path, "r+b")  # noqa: SIM115, ASYNC230 - closed below
        except FileNotFoundError:
            raise ConfigError(
                f"{cursors.path} exists but {path} does not; delete the cursor file to start over"
            ) from None
        fh.seek(0, os.SEEK_END)
        if fh.tell() < cursor.offset:
            fh.close()
            raise ConfigError(
                f"{path} is shorter than its cursor says; delete {cursors.path} to start over"
            )
        start, offset = cursor.index, cursor.offset
        fh.truncate(offset)  # drop lines written after the last committed cursor
        fh.seek(offset)

    evicted = 0

    async def commit(index: int) -> None:
        nonlocal evicted
        os.fsync(fh.fileno())
        cursors.save(Cursor(job, index, fh.tell(), generation=gen))
        if evict:  # only lines already durable in the file leave Redis
            await store.evict_results(job, evicted, index, gen=gen)
            evicted = index

    with fh:
        if cursor is None:
            cursors.save(Cursor(job, 0, 0, generation=gen))
        elif evict:
            # A crash may have come between the two.
            await store.evict_results(job, 0, start, gen=gen)
            evicted = start
        report = await collect(
            store, job, fh, wait=wait, progress=progress, start=start, on_commit=commit, line=line
        )
        if report.complete:  # the cursor now says the file holds the whole job
            cursors.save(Cursor(job, report.total or 0, fh.tell(), generation=gen, complete=True))
    return report
