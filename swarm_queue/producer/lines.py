"""Output as a file of lines, one per input in input order: swarm-queue's JSON lines, OpenAI
batch output lines, or CSV rows under a header. Its durable mark is a byte offset: a rerun cuts
the file back to it and continues, byte for byte as an uninterrupted run would have written."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from typing import BinaryIO, Generic, TypeVar

from swarm_queue.common.errors import ConfigError
from swarm_queue.producer.outfile import Mark

__all__ = ["LineSink", "fsync_dir"]


R = TypeVar("R")


class LineSink(Generic[R]):
    """A :class:`~producer.outfile.RowSink` writing each row as one line (``line``: how, a
    format's: see :mod:`producer.formats`), after a ``header`` line if it has one."""

    def __init__(
        self,
        path: str,
        line: Callable[[R], bytes],
        header: bytes = b"",
        *,
        quoted_newlines: bool = False,
    ) -> None:
        self.path = path
        self.line = line
        self.header = header
        # CSV: a field may hold a newline inside quotes, so a row may span lines.
        self.quoted_newlines = quoted_newlines
        self._fh: BinaryIO | None = None
        self._index = 0

    def present(self) -> bool:
        try:
            return os.path.getsize(self.path) > 0
        except FileNotFoundError:
            return False

    def open(self, mark: Mark | None) -> Mark:
        if mark is None:
            self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by close() or abandon()
            self._fh.write(self.header)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            return Mark(0, self._fh.tell())
        try:
            fh = open(self.path, "r+b")  # noqa: SIM115 - closed by close() or abandon()
        except FileNotFoundError:
            raise ConfigError(
                f"{self.path}.cursor exists but {self.path} does not; delete the cursor file "
                "to start over"
            ) from None
        fh.seek(0, os.SEEK_END)
        if fh.tell() < mark.offset:
            fh.close()
            raise ConfigError(
                f"{self.path} is shorter than its cursor says; delete {self.path}.cursor to "
                "start over"
            )
        fh.truncate(mark.offset)  # drop lines written after the last committed cursor
        fh.seek(mark.offset)
        self._fh, self._index = fh, mark.index
        return mark

    def put(self, rows: list[R], index: int) -> Mark:
        assert self._fh is not None
        self._fh.write(b"".join(self.line(r) for r in rows))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._index = index
        return Mark(index, self._fh.tell())

    def close(self) -> Mark:
        assert self._fh is not None
        with self._fh:
            return Mark(self._index, self._fh.tell())

    def abandon(self) -> None:
        if self._fh is not None:
            self._fh.close()

    async def refresh(
        self,
        rows: int,
        fetch: Callable[[int, int], Awaitable[list[R | None]]],
    ) -> tuple[Mark, int]:
        """Bring a complete file of ``rows`` rows up to date: each row for which ``fetch(start,
        count)`` has one now (a prompt swarm-retry answered again; without --evict, every one)
        is written anew, the others kept byte for byte. Written beside it and renamed over it,
        so a crash leaves the old file or the new one, whole. Returns the new file's mark and
        how many rows changed."""
        tmp = f"{self.path}.refresh"
        changed = 0
        with open(self.path, "rb") as old, open(tmp, "wb") as new:  # noqa: ASYNC230 - the collector's own file
            if old.read(len(self.header)) != self.header:
                raise ConfigError(f"{self.path} does not start as swarm-collect wrote it")
            new.write(self.header)
            records = self._records(old)
            for start in range(0, rows, _REFRESH_CHUNK):
                fresh = await fetch(start, min(_REFRESH_CHUNK, rows - start))
                for row in fresh:
                    kept = next(records, None)
                    if kept is None:
                        raise ConfigError(f"{self.path} holds fewer rows than its cursor says")
                    line = kept if row is None else self.line(row)
                    changed += line != kept
                    new.write(line)
            new.flush()
            os.fsync(new.fileno())
            size = new.tell()
        os.replace(tmp, self.path)
        fsync_dir(self.path)
        return Mark(rows, size), changed

    def _records(self, fh: BinaryIO) -> Iterator[bytes]:
        """The file's rows after its header, each with its newline."""
        pending = b""
        for line in fh:
            pending += line
            # A CSV row is whole once its quotes balance (a quote inside is doubled).
            if self.quoted_newlines and pending.count(b'"') % 2:
                continue
            yield pending
            pending = b""
        if pending:
            yield pending


# Rows fetched from Redis at a time while a file is brought up to date.
_REFRESH_CHUNK = 2000


def fsync_dir(path: str) -> None:
    """Make a rename in ``path``'s directory durable."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
