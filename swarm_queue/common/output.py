"""What a job's output is, whatever kind of job it is: one row per input, in input order, each
written as a JSON line or as cells under the kind's columns. A plain job, a pipeline, an agent
job and a best-of job are each a :class:`JobOutput`; every output format (``swarm-collect
--format``: jsonl, csv, parquet, and openai for a plain job) writes any kind through this seam
alone, so a new kind of job is collected in every format without a format naming it.

A kind reads its rows by input index (:meth:`JobOutput.read`: by default the job's results, each
made a row by :meth:`JobOutput.start`), may take each further from what its later steps hold
(:meth:`JobOutput.advance`, until :meth:`JobOutput.ended`), and writes it as its
:meth:`JobOutput.line` (a :class:`msgspec.Struct` with an ``ok`` property) and that line's
:meth:`JobOutput.cells`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import msgspec

from swarm_queue.common.models import JobSpec, Result, Usage, result_or_failure
from swarm_queue.common.store import CollectorStore
from swarm_queue.common.vectors import unpack_vector

__all__ = ["COLUMN_TYPES", "CollectReport", "Column", "JobOutput", "Json", "OutputLine", "Vector"]


class Vector(list[float]):
    """A column type: a list of float32 values (an embedding)."""


class Json:
    """A column type: any JSON value (an object, an agent's output), written as its JSON
    text."""


# What a column may hold (each cell that type or None): ``list`` is a list of strings. CSV
# writes a list, a vector and a JSON value as JSON text; Parquet gives each its own type.
COLUMN_TYPES = (int, float, str, bool, list, Vector, Json)


class Column(NamedTuple):
    """One column of a job's CSV or Parquet output: its name and the type of its cells (one of
    :data:`COLUMN_TYPES`)."""

    name: str
    type: type


class CollectReport(msgspec.Struct, frozen=True):
    """What one run wrote: ``written`` lines from index ``start`` on (``ok``/``failed`` count
    this run's lines only)."""

    job: str
    written: int
    ok: int
    failed: int
    total: int | None
    start: int = 0
    # The output was complete already and left alone: this run wrote nothing.
    untouched: bool = False
    # The models that answered this run's rows, and how many each (where the kind says).
    models: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.total is not None and self.start + self.written >= self.total


class OutputLine(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """One line of ``swarm-collect`` output; ``custom_id`` appears only when the input had one,
    ``cached`` only on an answer from the response cache; ``model``: which model answered."""

    index: int
    custom_id: str | msgspec.UnsetType = msgspec.UNSET
    text: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    endpoint: str = ""
    attempts: int = 0
    error: str | None = None
    # Why a failed prompt failed, as ``swarm-retry --kind`` takes it (only on a failure).
    error_kind: str | msgspec.UnsetType = msgspec.UNSET
    # The model that answered, as its endpoint named it ("" when none did).
    model: str = ""
    cached: bool | msgspec.UnsetType = msgspec.UNSET
    # An embeddings job's vector (float32 values).
    embedding: list[float] | msgspec.UnsetType = msgspec.UNSET
    # A sampled job's samples, and what its per-prompt reduce made of them.
    samples: list[str] | msgspec.UnsetType = msgspec.UNSET
    value: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(cls, r: Result) -> OutputLine:
        return cls(
            index=r.index,
            custom_id=r.custom_id if r.custom_id is not None else msgspec.UNSET,
            text=r.text,
            finish_reason=r.finish_reason,
            usage=r.usage,
            endpoint=r.endpoint,
            attempts=r.attempts,
            error=r.error,
            model=r.model,
            cached=True if r.cached else msgspec.UNSET,
            embedding=unpack_vector(r.embedding) if r.embedding is not None else msgspec.UNSET,
            samples=r.samples if r.samples is not None else msgspec.UNSET,
            value=r.value if r.value is not None else msgspec.UNSET,
            error_kind=r.error_kind if r.error is not None and r.error_kind else msgspec.UNSET,
        )


Row = TypeVar("Row")


class JobOutput(ABC, Generic[Row]):
    """A job's output, for the job (``steps[0]``) and its later steps' specs, as rows of type
    ``Row``: one per input, read in input order, written once it has ended."""

    # Where the job's rows are said (a help text, an error): "job", "pipeline"...
    what: ClassVar[str]
    # The formats it can be written in (a format of lines also goes to stdout).
    formats: ClassVar[tuple[str, ...]] = ("jsonl", "csv", "parquet")
    # What its rows are called where a collection says how many it wrote.
    rows_are: ClassVar[str] = "inputs"
    # Its rows are the job's results as they stand: an output collected whole is brought up to
    # date in place after a swarm-retry.
    refreshable: ClassVar[bool] = False

    def __init__(self, steps: Sequence[JobSpec]) -> None:
        self.steps = list(steps)

    @staticmethod
    def later(spec: JobSpec) -> list[str]:
        """The names of the later steps of ``spec``'s job known from its spec, in order (what
        status, cancel and retry go through along with the job): none by default."""
        return []

    async def read(self, store: CollectorStore, job: str, start: int, count: int) -> list[Row]:
        """Up to ``count`` rows of ``job`` from input ``start`` on, up to the first not there
        yet: by default its results, each begun by :meth:`start`."""
        rows = []
        for i, blob in enumerate(await store.fetch_results(job, start, count, leading=True), start):
            if blob is None:
                break
            rows.append(self.start(result_or_failure(i, blob)))
        return rows

    def start(self, first: Result) -> Row:
        """The row of an input from its result at the job's first step."""
        raise NotImplementedError(f"{type(self).__name__} reads its rows itself")

    async def advance(self, store: CollectorStore, rows: list[Row]) -> None:
        """Take ``rows`` as far as the later steps' records go now (one read per step for all
        of them, not one per row): nothing to do for a job of one step."""

    def ended(self, row: Row) -> bool:
        """Whether nothing more will come for ``row``: its line can be written."""
        return True

    def ok(self, row: Row) -> bool:
        """Whether ``row`` is answered (a collection counts those that are not as failed)."""
        return bool(self.line(row).ok)  # type: ignore[attr-defined]

    def model_of(self, row: Row) -> str:
        """The model that answered ``row``, where one model did ("": none, or several)."""
        return ""

    async def tally(self, store: CollectorStore, report: CollectReport) -> tuple[str, int]:
        """What a collection's closing line says of the rows it wrote (in parentheses), and
        how many failed: by default this run's."""
        return f"{report.ok} answered, {report.failed} failed in this run", report.failed

    def in_finish_order(self, store: CollectorStore) -> AsyncIterator[list[Row]] | None:
        """The rows in the order they end rather than input order, where the kind can follow
        them so (None: it cannot)."""
        return None

    @abstractmethod
    def line(self, row: Row) -> msgspec.Struct:
        """``row``'s line (as JSON Lines encodes it); it has an ``ok`` property."""

    @abstractmethod
    def columns(self) -> list[Column]:
        """The columns of a CSV or Parquet row, in order."""

    @abstractmethod
    def cells(self, line: Any) -> list[Any]:
        """A line's cells, in :meth:`columns`' order (None where it has none)."""
