"""A plain job's output: one line per prompt, its result as ``swarm-collect`` writes it (see
:class:`~common.models.OutputLine`). As columns (CSV, Parquet): the JSON line's fields, its
usage as two columns, and, for a job with a per-prompt measure, each scalar field of its value
as a typed column of its own (``value.answer``, ``value.share``...), so a frame filters and
sorts on them without parsing JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.output import CollectReport, Column, JobOutput, Json, OutputLine, Vector
from swarm_queue.common.perprompt import value_fields
from swarm_queue.common.store import CollectorStore

__all__ = ["COLUMNS", "PlainOutput"]

COLUMNS = [
    Column("index", int),
    Column("custom_id", str),
    Column("text", str),
    Column("finish_reason", str),
    Column("endpoint", str),
    Column("attempts", int),
    Column("error", str),
    Column("error_kind", str),
    Column("model", str),
    Column("cached", bool),
    Column("embedding", Vector),
    Column("samples", list),
    Column("value", Json),
    Column("prompt_tokens", int),
    Column("completion_tokens", int),
]


def _unset(v: Any) -> Any:
    return None if v is msgspec.UNSET else v


class PlainOutput(JobOutput[Result]):
    """A plain job's lines: its results as they stand."""

    what = "job"
    rows_are = "results"
    formats = ("jsonl", "openai", "csv", "parquet")
    refreshable = True

    def __init__(self, steps: Sequence[JobSpec]) -> None:
        super().__init__(steps)
        self.fields = value_fields(self.steps[0])

    def start(self, first: Result) -> Result:
        return first

    def ok(self, row: Result) -> bool:
        return row.ok

    def model_of(self, row: Result) -> str:
        return row.model if row.ok else ""

    async def tally(self, store: CollectorStore, report: CollectReport) -> tuple[str, int]:
        """The whole job's answered and failed (not this run's alone)."""
        status = await store.status(self.steps[0].job)
        resumed = f", resumed at {report.start}" if report.start else ""
        return f"{status.done} ok, {status.failed} failed{resumed}", status.failed

    def line(self, row: Result) -> OutputLine:
        return OutputLine.of(row)

    def columns(self) -> list[Column]:
        typed = [Column(f"value.{name}", t) for name, t in self.fields]
        return [*COLUMNS, *typed]

    def cells(self, line: Any) -> list[Any]:
        assert isinstance(line, OutputLine)
        usage = line.usage
        value = line.value if isinstance(line.value, dict) else {}
        return [
            line.index,
            _unset(line.custom_id),
            line.text,
            line.finish_reason,
            line.endpoint,
            line.attempts,
            line.error,
            _unset(line.error_kind),
            line.model,
            line.cached is True,
            _unset(line.embedding),
            _unset(line.samples),
            _unset(line.value),
            usage.prompt_tokens if usage is not None else None,
            usage.completion_tokens if usage is not None else None,
            *(value.get(name) for name, _ in self.fields),
        ]
