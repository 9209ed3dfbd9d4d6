"""How a workflow's job is written out: one line per input, in input order, assembled from its
first step's result and what its later steps hold. The collector (``swarm-collect``,
``Swarm.lines``) follows the first step's results and asks the job's flow for the rest, so a
new workflow writes its own lines without the commands naming it.

A flow whose jobs are written this way names its :class:`FlowOutput` (``Flow.output``); a
line is a :class:`msgspec.Struct` with an ``ok`` property (JSON Lines as it encodes), and its
:meth:`FlowOutput.columns` and :meth:`FlowOutput.cells` are its CSV and Parquet rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import msgspec

from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.store import CollectorStore

__all__ = ["COLUMN_TYPES", "Column", "FlowOutput"]

# What a column may hold (each cell that type or None): CSV writes a list as JSON text,
# Parquet gives each its own type.
COLUMN_TYPES = (int, float, str, bool, list)


class Column(NamedTuple):
    """One column of a workflow's CSV or Parquet output: its name and the type of its cells
    (one of :data:`COLUMN_TYPES`; a ``list`` is a list of strings)."""

    name: str
    type: type


Item = TypeVar("Item")


class FlowOutput(ABC, Generic[Item]):
    """A workflow job's lines, for the job (``steps[0]``) and its later steps' specs: each
    input starts as an ``Item`` from its first step's result, is advanced by what the later
    steps hold, and is written as a line once it has ended."""

    # Where the job's lines are said (a help text, an error).
    what: ClassVar[str]

    def __init__(self, steps: Sequence[JobSpec]) -> None:
        self.steps = list(steps)

    @staticmethod
    @abstractmethod
    def later(spec: JobSpec) -> list[str]:
        """The names of the later steps of ``spec``'s job, in order, known from its spec
        (what status, cancel and retry go through along with the job)."""

    @abstractmethod
    def start(self, first: Result) -> Item:
        """The input of ``first`` (its result at the first step), not advanced yet."""

    @abstractmethod
    async def advance(self, store: CollectorStore, items: list[Item]) -> None:
        """Take ``items`` as far as the later steps' records go now (one read per step for
        all of them, not one per item)."""

    @abstractmethod
    def ended(self, item: Item) -> bool:
        """Whether nothing more will come for ``item``: its line can be written."""

    @abstractmethod
    def line(self, item: Item) -> msgspec.Struct:
        """``item``'s line (as JSON Lines encodes it); it has an ``ok`` property."""

    @abstractmethod
    def columns(self) -> list[Column]:
        """The columns of a CSV or Parquet row, in order."""

    @abstractmethod
    def cells(self, line: Any) -> list[Any]:
        """A line's cells, in :meth:`columns`' order."""
