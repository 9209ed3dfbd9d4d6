"""A workflow job's lines as its flow assembles them (:mod:`flows.output`), followed in input
order and written durably like any output (the lock, the cursor, resuming:
:func:`producer.outfile.collect_rows_durably`): JSON Lines, or the flow's columns as CSV or
Parquet. The commands know no workflow here: the job's flow says what a line is."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.store import CollectorStore, JobStatus
from swarm_queue.flows.output import FlowOutput
from swarm_queue.flows.steps import later_steps
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.outfile import collect_rows_durably
from swarm_queue.producer.stream import CollectReport, follow

__all__ = [
    "FORMATS",
    "collect_lines",
    "csv_cells",
    "follow_assembled",
    "follow_lines",
    "json_line",
    "output_for",
]

# The formats a flow's lines are written in.
FORMATS = ("jsonl", "csv", "parquet")

Item = TypeVar("Item")
Line = TypeVar("Line")

_encoder = msgspec.json.Encoder()


def json_line(line: Any) -> bytes:
    """One JSON line, newline included."""
    return _encoder.encode(line) + b"\n"


def csv_cells(cells: Sequence[Any]) -> bytes:
    """One CSV row of ``cells``: None empty, a list as JSON text."""
    buf = io.StringIO()
    out = [
        "" if v is None else msgspec.json.encode(v).decode() if isinstance(v, list) else v
        for v in cells
    ]
    csv.writer(buf, lineterminator="\n").writerow(out)
    return buf.getvalue().encode()


def follow_assembled(
    begin: Callable[[Result], Item],
    advance: Callable[[CollectorStore, str, list[Item]], Awaitable[None]],
    ended: Callable[[Item], bool],
    line: Callable[[Item], Line],
) -> Callable[..., AsyncIterator[list[Line]]]:
    """The rows of a job whose line for an input is assembled from its first step's result
    (``begin``) and what later steps hold (``advance``, until ``ended``), as
    :func:`producer.stream.follow`'s are a job's results: in input order, a chunk at a time as
    every input up to it has ended (without ``wait``: what has ended, the rest on the next
    run)."""

    async def rows(
        store: CollectorStore,
        job: str,
        *,
        start: int = 0,
        wait: bool = False,
        poll_s: float = 0.2,
        on_status: Callable[[JobStatus, int], None] | None = None,
    ) -> AsyncIterator[list[Line]]:
        async for chunk in follow(
            store, job, start=start, wait=wait, poll_s=poll_s, on_status=on_status
        ):
            items = [begin(r) for r in chunk]
            while True:
                await advance(store, job, items)
                ready = next((i for i, it in enumerate(items) if not ended(it)), len(items))
                if ready == len(items):
                    yield [line(it) for it in items]
                    break
                if not wait:
                    if ready:
                        yield [line(it) for it in items[:ready]]
                    return
                await asyncio.sleep(poll_s)

    return rows


def follow_lines(output: FlowOutput[Any]) -> Callable[..., AsyncIterator[list[Any]]]:
    """The lines of ``output``'s job, as :func:`follow_assembled` gives them."""
    return follow_assembled(
        output.start, lambda store, _job, items: output.advance(store, items), output.ended,
        output.line,
    )  # fmt: skip


async def output_for(store: CollectorStore, spec: JobSpec, kind: type[FlowOutput[Any]]) -> Any:
    """The output of kind ``kind`` of the job of ``spec``, with its later steps' specs."""
    return kind([spec, *await later_steps(store, spec)])  # type: ignore[arg-type]


def _sink(path: str, fmt: str, output: FlowOutput[Any]) -> Any:
    columns = output.columns()
    if fmt == "jsonl":
        return LineSink(path, json_line)
    if fmt == "csv":
        return LineSink(
            path,
            lambda line: csv_cells(output.cells(line)),
            header=csv_cells([c.name for c in columns]),
            quoted_newlines=True,
        )
    try:
        import pyarrow as pa

        from swarm_queue.producer.parquet import ParquetSink
    except ImportError:
        raise ConfigError(
            "--format parquet needs pyarrow: pip install 'swarm-queue[parquet]'"
        ) from None
    arrow = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}
    schema = pa.schema([(c.name, arrow.get(c.type, pa.list_(pa.string()))) for c in columns])

    def table(lines: Sequence[Any]) -> pa.Table:
        rows = [output.cells(line) for line in lines]
        return pa.table(
            {n: [r[i] for r in rows] for i, n in enumerate(schema.names)}, schema=schema
        )

    return ParquetSink[Any](path, table, schema)


async def collect_lines(
    store: CollectorStore,
    job: str,
    path: str,
    output: FlowOutput[Any],
    *,
    fmt: str = "jsonl",
    wait: bool,
    progress: bool,
    **kw: Any,
) -> CollectReport:
    """Collect workflow job ``job`` into ``path``, one line per input, in ``fmt`` (one of
    :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ConfigError(f"{output.what} is collected as {', '.join(FORMATS)}")
    return await collect_rows_durably(
        store,
        job,
        path,
        lambda p, _spec: _sink(p, fmt, output),
        rows=follow_lines(output),
        wait=wait,
        progress=progress,
        **kw,
    )
