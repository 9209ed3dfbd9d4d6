"""``swarm-collect --format parquet``: a job's output as a Parquet dataset, in input order.

A Parquet file is only readable once its footer is written, so the output is a directory of
parts, ``part-00000.parquet``, ``part-00001.parquet``... in input order, one row per input with
its kind's columns (see :mod:`common.output`), typed. A part is written under a hidden name
and renamed once closed and fsynced, then the durable cursor beside the directory
(``DIR.cursor``) counts it: readers (pandas, pyarrow, Hugging Face ``datasets``) only ever see
whole parts, a crashed run resumes after the last counted part, and ``--evict`` removes
results from Redis only once a closed part holds them. A part closes at ``PART_ROWS`` rows,
when it has been open ``PART_S`` seconds (so a long job's results show up as it runs), and at
the end of a run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import Result
from swarm_queue.common.output import Column, JobOutput, Json, Vector
from swarm_queue.producer.outfile import Mark

__all__ = [
    "ARROW",
    "PART_ROWS",
    "PART_S",
    "ParquetSink",
    "output_table",
    "parquet_sink",
    "part_name",
]

R = TypeVar("R")

# The Arrow type of each column type (see common/output.py): a JSON value is its JSON text.
ARROW: dict[type, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
    list: pa.list_(pa.string()),
    Vector: pa.list_(pa.float32()),  # an embedding: float32, as the server computed it
    Json: pa.string(),
}

PART_ROWS = 100_000
PART_S = 60.0
# Rows buffered before a row group is written: larger groups read faster, and 20,000 results
# of a few KB each stay well within a collector's memory.
ROW_GROUP_ROWS = 20_000

_encoder = msgspec.json.Encoder()


def _schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([(c.name, ARROW[c.type]) for c in columns])


def _table(output: JobOutput[Any], schema: pa.Schema) -> Callable[[Sequence[Any]], pa.Table]:
    """What makes a table of ``schema`` of ``output``'s rows: each row's cells, a JSON value
    as its text."""
    as_json = [c.type is Json for c in output.columns()]
    line, cells = output.line, output.cells

    def table(rows: Sequence[Any]) -> pa.Table:
        by_row = [cells(line(r)) for r in rows]
        columns = {}
        for i, name in enumerate(schema.names):
            column = [c[i] for c in by_row]
            if as_json[i]:
                column = [None if v is None else _encoder.encode(v).decode() for v in column]
            columns[name] = column
        return pa.table(columns, schema=schema)

    return table


def output_table(output: JobOutput[Any], rows: Sequence[Any]) -> pa.Table:
    """``rows`` of ``output``'s job as one table, with the columns of its Parquet output."""
    schema = _schema(output.columns())
    return _table(output, schema)(rows)


def parquet_sink(path: str, output: JobOutput[Any]) -> ParquetSink[Any]:
    """The Parquet directory ``path`` of ``output``'s job: its kind's columns, typed."""
    schema = _schema(output.columns())
    return ParquetSink(path, _table(output, schema), schema)


_PART = re.compile(r"^\.?part-(\d{5,})\.parquet(\.inprogress)?$")


def part_name(n: int) -> str:
    """The file name of part ``n``: zero-padded, so that name order is input order."""
    return f"part-{n:05d}.parquet"


class ParquetSink(Generic[R]):
    """A :class:`~producer.outfile.RowSink` writing the directory ``path`` of parts: its
    durable mark counts the closed parts and the rows they hold, which ``table`` makes a
    table of ``schema`` from."""

    def __init__(
        self, path: str, table: Callable[[Sequence[R]], pa.Table], schema: pa.Schema
    ) -> None:
        self.path = path
        self.table, self.schema = table, schema
        self.closed = 0  # closed parts
        self.index = 0  # results they hold
        self.rows: list[R] = []  # buffered, not yet in a row group
        self.written = 0  # rows in the open part's row groups
        self.writer: pq.ParquetWriter | None = None
        self.opened_at = 0.0

    def present(self) -> bool:
        return _has_parts(self.path)

    def open(self, mark: Mark | None) -> Mark:
        _prepare(self.path, mark)
        mark = mark or Mark(0)
        self.closed, self.index = mark.parts, mark.index
        return mark

    def put(self, rows: list[R], index: int) -> Mark | None:
        mark = None
        while rows:  # split at part boundaries: every part but the last of a run is full
            now, rows = rows[: self._room()], rows[self._room() :]
            if self._buffer(now):
                mark = self.close()
        return mark

    @property
    def _open_path(self) -> str:
        return os.path.join(self.path, "." + part_name(self.closed) + ".inprogress")

    def _room(self) -> int:
        """How many more rows the open part takes before it is full."""
        return PART_ROWS - self.written - len(self.rows)

    def _buffer(self, rows: list[R]) -> bool:
        """Buffer ``rows`` (at most ``_room()``); True when the open part is due to close."""
        if self.writer is None:
            self.writer = pq.ParquetWriter(self._open_path, self.schema, compression="zstd")
            self.opened_at = time.monotonic()
        self.rows.extend(rows)
        if len(self.rows) >= ROW_GROUP_ROWS:
            self._flush()
        return self._room() <= 0 or time.monotonic() - self.opened_at >= PART_S

    def _flush(self) -> None:
        assert self.writer is not None
        if self.rows:
            self.writer.write_table(self.table(self.rows), row_group_size=ROW_GROUP_ROWS)
            self.written += len(self.rows)
            self.rows = []

    def close(self) -> Mark:
        """Close the open part, if any, and make it visible and durable."""
        if self.writer is not None:
            self._flush()
            self.writer.close()
            self.writer = None
            _fsync(self._open_path)
            os.replace(self._open_path, os.path.join(self.path, part_name(self.closed)))
            _fsync(self.path)
            self.closed += 1
            self.index += self.written
            self.written = 0
        return Mark(self.index, parts=self.closed)

    async def refresh(
        self, rows: int, fetch: Callable[[int, int], Awaitable[list[Result | None]]]
    ) -> tuple[Mark, int]:
        """Bring the complete directory of ``rows`` rows up to date: in each part, the rows
        ``fetch(start, count)`` has a result for now (a prompt swarm-retry answered again;
        without --evict, every one) are written anew, the others kept; a part that changes is
        written beside itself and renamed over itself, whole. Returns the mark and how many
        rows changed."""
        changed, start, n = 0, 0, 0
        while start < rows:
            path = os.path.join(self.path, part_name(n))
            old = pq.read_table(path, schema=self.schema)
            fresh = await fetch(start, old.num_rows)
            redo = [i for i, r in enumerate(fresh) if r is not None]
            if redo:
                new = self.table([r for r in fresh if r is not None])  # type: ignore[misc]
                before = old.take(redo).to_pylist()
                changed += sum(a != b for a, b in zip(before, new.to_pylist(), strict=True))
                keep = pa.array([r is None for r in fresh])
                table = pa.concat_tables([old.filter(keep), new]).sort_by("index")
                tmp = os.path.join(self.path, f".{part_name(n)}.refresh")
                pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_ROWS)
                _fsync(tmp)
                os.replace(tmp, path)
            start += old.num_rows
            n += 1
        _fsync(self.path)
        return Mark(rows, parts=n), changed

    def abandon(self) -> None:
        """Drop the open part (its rows stay in Redis and are written again by the next run)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            os.remove(self._open_path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _has_parts(path: str) -> bool:
    """Whether the directory ``path`` holds Parquet parts (closed or open) of a collection."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{path} exists and is not a directory; --format parquet writes one")
    return os.path.isdir(path) and any(_PART.match(name) for name in os.listdir(path))


def _prepare(path: str, mark: Mark | None) -> None:
    """Make ``path`` a directory holding the parts ``mark`` counts only: a part after those,
    or a part left open, is from this collection's run that stopped before its cursor counted
    it (a new collection starts with none: see :func:`~producer.outfile.claim_output`)."""
    if mark is not None and not os.path.isdir(path):
        raise ConfigError(
            f"{path}.cursor exists but {path} does not; delete the cursor file to start over"
        )
    os.makedirs(path, exist_ok=True)
    keep = 0 if mark is None else mark.parts
    for name in os.listdir(path):
        m = _PART.match(name)
        if m and (m.group(2) or int(m.group(1)) >= keep):
            os.remove(os.path.join(path, name))
