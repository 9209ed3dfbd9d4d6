"""``swarm-collect --format parquet``: a job's results as a Parquet dataset, in input order.

A Parquet file is only readable once its footer is written, so the output is a directory of
parts, ``part-00000.parquet``, ``part-00001.parquet``... in input order, one row per prompt with
the fields of the JSON Lines output. A part is written under a hidden name and renamed once
closed and fsynced, then the durable cursor beside the directory (``DIR.cursor``) counts it:
readers (pandas, pyarrow, Hugging Face ``datasets``) only ever see whole parts, a crashed run
resumes after the last counted part, and ``--evict`` removes results from Redis only once a
closed part holds them. A part closes at ``PART_ROWS`` rows, when it has been open
``PART_S`` seconds (so a long job's results show up as it runs), and at the end of a run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import ConfigError
from common.models import Result
from common.store import JobStore
from producer.outfile import Cursor, CursorFile, already_complete, claim_output, output_lock
from producer.stream import CollectReport, check_kept, collect_into, wait_for_job

__all__ = ["PART_ROWS", "PART_S", "SCHEMA", "collect_to_parquet", "part_name", "results_table"]

PART_ROWS = 100_000
PART_S = 60.0
# Rows buffered before a row group is written: larger groups read faster, and 20,000 results
# of a few KB each stay well within a collector's memory.
ROW_GROUP_ROWS = 20_000

SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("custom_id", pa.string()),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        (
            "usage",
            pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())]),
        ),
        ("endpoint", pa.string()),
        ("attempts", pa.int64()),
        ("error", pa.string()),
        ("model", pa.string()),
        ("cached", pa.bool_()),
    ]
)

_PART = re.compile(r"^\.?part-(\d{5,})\.parquet(\.inprogress)?$")


def part_name(n: int) -> str:
    """The file name of part ``n``: zero-padded, so that name order is input order."""
    return f"part-{n:05d}.parquet"


def results_table(results: Sequence[Result]) -> pa.Table:
    """The rows of ``results``, one per prompt, with the fields of the JSON Lines output."""
    return pa.table(
        {
            "index": [r.index for r in results],
            "custom_id": [r.custom_id for r in results],
            "text": [r.text for r in results],
            "finish_reason": [r.finish_reason for r in results],
            "usage": [
                None
                if r.usage is None
                else {
                    "prompt_tokens": r.usage.prompt_tokens,
                    "completion_tokens": r.usage.completion_tokens,
                }
                for r in results
            ],
            "endpoint": [r.endpoint for r in results],
            "attempts": [r.attempts for r in results],
            "error": [r.error for r in results],
            "model": [r.model for r in results],
            "cached": [r.cached for r in results],
        },
        schema=SCHEMA,
    )


class _Parts:
    """The part being written and the ones closed before it, in directory ``path``."""

    def __init__(self, path: str, job: str, cursor: Cursor, cursors: CursorFile) -> None:
        self.path = path
        self.job = job
        self.generation = cursor.generation
        self.cursors = cursors
        self.closed = cursor.parts  # parts counted by the cursor
        self.index = cursor.index  # results they hold
        self.rows: list[Result] = []  # buffered, not yet in a row group
        self.written = 0  # rows in the open part's row groups
        self.writer: pq.ParquetWriter | None = None
        self.opened_at = 0.0

    @property
    def _open_path(self) -> str:
        return os.path.join(self.path, "." + part_name(self.closed) + ".inprogress")

    def room(self) -> int:
        """How many more rows the open part takes before it is full."""
        return PART_ROWS - self.written - len(self.rows)

    def put(self, rows: list[Result]) -> bool:
        """Buffer ``rows`` (at most ``room()``); True when the open part is due to close."""
        if self.writer is None:
            self.writer = pq.ParquetWriter(self._open_path, SCHEMA, compression="zstd")
            self.opened_at = time.monotonic()
        self.rows.extend(rows)
        if len(self.rows) >= ROW_GROUP_ROWS:
            self._flush()
        return self.room() <= 0 or time.monotonic() - self.opened_at >= PART_S

    def _flush(self) -> None:
        assert self.writer is not None
        if self.rows:
            self.writer.write_table(results_table(self.rows), row_group_size=ROW_GROUP_ROWS)
            self.written += len(self.rows)
            self.rows = []

    def close_part(self) -> int:
        """Close the open part, make it visible and durable, and count it in the cursor; the
        index of results now in closed parts."""
        if self.writer is None:
            return self.index
        self._flush()
        self.writer.close()
        self.writer = None
        _fsync(self._open_path)
        os.replace(self._open_path, os.path.join(self.path, part_name(self.closed)))
        _fsync(self.path)
        self.closed += 1
        self.index += self.written
        self.written = 0
        self.cursors.save(
            Cursor(self.job, self.index, parts=self.closed, generation=self.generation)
        )
        return self.index

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


def _prepare(path: str, cursor: Cursor | None, cursor_path: str) -> None:
    """Make ``path`` a directory holding the parts ``cursor`` counts only: a part after those,
    or a part left open, is from this collection's run that stopped before its cursor counted
    it (a new collection starts with none: see :func:`claim_output`)."""
    if cursor is not None and not os.path.isdir(path):
        raise ConfigError(
            f"{cursor_path} exists but {path} does not; delete the cursor file to start over"
        )
    os.makedirs(path, exist_ok=True)
    keep = 0 if cursor is None else cursor.parts
    for name in os.listdir(path):
        m = _PART.match(name)
        if m and (m.group(2) or int(m.group(1)) >= keep):
            os.remove(os.path.join(path, name))


async def collect_to_parquet(
    store: JobStore,
    job: str,
    path: str,
    *,
    wait: bool,
    progress: bool,
    evict: bool = False,
) -> CollectReport:
    """Collect ``job`` into the Parquet directory ``path``, resuming after the parts its
    cursor counts; ``evict`` deletes results from Redis once a closed part holds them."""
    with output_lock(path):
        gen = await wait_for_job(store, job, wait, poll_s=0.5)
        cursors, cursor = claim_output(path, job, gen, present=_has_parts(path))
        if cursor is not None and cursor.complete:
            return already_complete(job, path, cursor)
        check_kept(await store.status(job), 0 if cursor is None else cursor.index)
        _prepare(path, cursor, cursors.path)
        cursor = cursor or Cursor(job, 0, generation=gen)
        cursors.save(cursor)
        parts = _Parts(path, job, cursor, cursors)
        evicted = cursor.index
        if evict:  # a crash may have come between a cursor's save and its eviction
            await store.evict_results(job, 0, evicted, gen=gen)

        async def put(chunk: list[Result], _cursor: int) -> None:
            nonlocal evicted
            while chunk:  # split at part boundaries: every part but the last of a run is full
                rows, chunk = chunk[: parts.room()], chunk[parts.room() :]
                if parts.put(rows):
                    index = parts.close_part()
                    if evict:
                        await store.evict_results(job, evicted, index, gen=gen)
                        evicted = index

        try:
            report = await collect_into(
                store, job, put, wait=wait, progress=progress, start=cursor.index
            )
        except BaseException:
            parts.abandon()
            raise
        index = parts.close_part()
        if evict:
            await store.evict_results(job, evicted, index, gen=gen)
        if report.complete:  # the cursor now says the directory holds the whole job
            cursors.save(Cursor(job, index, parts=parts.closed, generation=gen, complete=True))
    return report
