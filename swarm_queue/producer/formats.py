"""The output formats of ``swarm-collect --format NAME``, by name. Each writes any kind of job
(:class:`~common.output.JobOutput`: a plain job, a pipeline, an agent job, a best-of job) as the
:class:`~producer.outfile.RowSink` of an output path, and says whether it can also write to
stdout (a format of lines) and what its path is (a file or a directory). A new format is a sink
and one line here; a new kind of job is written in every format a kind lists without one."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.output import Column, JobOutput, Json, Vector
from swarm_queue.common.request import route_of
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.openai_batch import openai_line
from swarm_queue.producer.outfile import RowSink

__all__ = ["FORMATS", "Format", "csv_cells", "format_for"]

_encoder = msgspec.json.Encoder()

# A line of a job's rows, and what makes one for a job's output.
Line = Callable[[Any], bytes]


@dataclass(frozen=True)
class Format:
    """One output format: ``sink(path, output)`` makes its sink; ``line(output)``, for a
    format of lines, the line of one row (what stdout gets); ``what`` names its output."""

    help: str
    sink: Callable[[str, JobOutput[Any]], RowSink[Any]]
    line: Callable[[JobOutput[Any]], Line] | None = None
    what: str = "FILE"


def _json(output: JobOutput[Any]) -> Line:
    """swarm-queue's JSON line of a row: its kind's line."""
    line, encode = output.line, _encoder.encode
    return lambda row: encode(line(row)) + b"\n"


def _openai(output: JobOutput[Any]) -> Line:
    """OpenAI's batch output line of a plain job's result."""
    spec = output.steps[0]
    return partial(openai_line, spec.job, route=route_of(spec))


def _lines(line: Callable[[JobOutput[Any]], Line]) -> Callable[[str, JobOutput[Any]], RowSink[Any]]:
    def make(path: str, output: JobOutput[Any]) -> RowSink[Any]:
        return LineSink(path, line(output))

    return make


def _as_json(columns: Sequence[Column]) -> list[bool]:
    """Which of ``columns`` a text format writes as JSON text."""
    return [c.type in (list, Vector, Json) for c in columns]


def csv_cells(cells: Sequence[Any], as_json: Sequence[bool] | None = None) -> bytes:
    """One CSV row of ``cells``: None empty, a list (or any cell ``as_json`` marks) as JSON."""
    buf = io.StringIO()
    out = [
        ""
        if v is None
        else _encoder.encode(v).decode()
        if isinstance(v, list) or (as_json is not None and as_json[i])
        else v
        for i, v in enumerate(cells)
    ]
    csv.writer(buf, lineterminator="\n").writerow(out)
    return buf.getvalue().encode()


def _csv(path: str, output: JobOutput[Any]) -> RowSink[Any]:
    """A CSV file, a header row of the kind's columns, then one row per input."""
    columns = output.columns()
    as_json = _as_json(columns)
    line, cells = output.line, output.cells
    return LineSink(
        path,
        lambda row: csv_cells(cells(line(row)), as_json),
        header=csv_cells([c.name for c in columns]),
        quoted_newlines=True,
    )


def _parquet(path: str, output: JobOutput[Any]) -> RowSink[Any]:
    try:
        from swarm_queue.producer.parquet import parquet_sink
    except ImportError:
        raise ConfigError(
            "--format parquet needs pyarrow: pip install 'swarm-queue[parquet]'"
        ) from None
    return parquet_sink(path, output)


FORMATS: dict[str, Format] = {
    "jsonl": Format("one swarm-queue JSON line per input (default)", _lines(_json), _json),
    "openai": Format("OpenAI Batch API output lines (a plain job)", _lines(_openai), _openai),
    "csv": Format("a CSV file with a header row, one row per input", _csv),
    "parquet": Format(
        "a directory of Parquet files, one row per input (needs pyarrow: pip install "
        "'swarm-queue[parquet]')",
        _parquet,
        what="DIR",
    ),
}


def format_for(name: str, output: JobOutput[Any]) -> Format:
    """The format ``name``, if ``output``'s kind of job is written in it."""
    if name not in FORMATS:
        raise ConfigError(f"no output format {name!r}: one of {', '.join(FORMATS)}")
    if name not in output.formats:
        raise ConfigError(f"a {output.what} is collected as {', '.join(output.formats)}")
    return FORMATS[name]
