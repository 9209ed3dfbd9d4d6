"""An output file that survives a crash: lines fsynced before a durable cursor moves, one
collector per file, and (with ``--evict``) results leaving Redis only once the file holds them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from typing import BinaryIO

import msgspec

from common.errors import ConfigError
from common.models import Result
from common.store import JobStore
from producer.stream import CollectReport, collect

__all__ = ["Cursor", "CursorFile", "collect_to_file", "output_lock"]


class Cursor(msgspec.Struct, frozen=True):
    """How far an output is known to be complete: ``index`` results, ``offset`` bytes of a
    JSON Lines file, ``parts`` closed files of a Parquet directory."""

    job: str
    index: int
    offset: int = 0
    parts: int = 0


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
    cursors = CursorFile(path)
    cursor = cursors.load(job)
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
        cursors.save(Cursor(job, index, fh.tell()))
        if evict:  # only lines already durable in the file leave Redis
            await store.evict_results(job, evicted, index)
            evicted = index

    with fh:
        if cursor is None:
            cursors.save(Cursor(job, 0, 0))
        elif evict:
            await store.evict_results(job, 0, start)  # a crash may have come between the two
            evicted = start
        report = await collect(
            store, job, fh, wait=wait, progress=progress, start=start, on_commit=commit, line=line
        )
    if report.complete:
        cursors.remove()
    return report
