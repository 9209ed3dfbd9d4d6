"""The output formats of ``swarm-collect --format NAME``, by name: each makes the
:class:`~producer.outfile.Sink` of an output path for a job, and says whether it can also
write to stdout (a line format) and what the path is (a file or a directory). A new format is
a module of its own with its sink, and one line here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.request import Route, route_of
from swarm_queue.producer.csvout import csv_sink
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.openai_batch import openai_line
from swarm_queue.producer.outfile import Sink
from swarm_queue.producer.stream import own_line

__all__ = ["FORMATS", "Format", "format_named"]


@dataclass(frozen=True)
class Format:
    """One output format: ``sink(path, spec)`` makes its sink; ``line(spec)``, for a format
    of lines, the line of one result (what stdout gets); ``what`` names its output in help."""

    help: str
    sink: Callable[[str, JobSpec], Sink]
    line: Callable[[JobSpec], Callable[[Result], bytes]] | None = None
    what: str = "FILE"


def _lines(line: Callable[[JobSpec], Callable[[Result], bytes]]) -> Callable[[str, JobSpec], Sink]:
    def make(path: str, spec: JobSpec) -> Sink:
        return LineSink(path, line(spec))

    return make


def _own(spec: JobSpec) -> Callable[[Result], bytes]:
    return own_line


def _openai(spec: JobSpec) -> Callable[[Result], bytes]:
    route = route_of(spec)
    return partial(openai_line, spec.job, chat=route == Route.CHAT, embed=route == Route.EMBEDDINGS)


def _parquet(path: str, spec: JobSpec) -> Sink:
    try:
        from swarm_queue.producer.parquet import valued_sink
    except ImportError:
        raise ConfigError(
            "--format parquet needs pyarrow: pip install 'swarm-queue[parquet]'"
        ) from None
    return valued_sink(path, spec)


def _csv(path: str, spec: JobSpec) -> Sink:
    return csv_sink(path, spec)


FORMATS: dict[str, Format] = {
    "jsonl": Format("one swarm-queue JSON line per prompt (default)", _lines(_own), _own),
    "openai": Format("OpenAI Batch API output lines", _lines(_openai), _openai),
    "csv": Format("a CSV file with a header row, one row per prompt", _csv),
    "parquet": Format(
        "a directory of Parquet files, one row per prompt (needs pyarrow: pip install "
        "'swarm-queue[parquet]')",
        _parquet,
        what="DIR",
    ),
}


def format_named(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"no output format {name!r}: one of {', '.join(FORMATS)}") from None
