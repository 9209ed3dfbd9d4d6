"""``swarm-collect --format csv``: one row per prompt in input order, under a header row of
the JSON Lines output's fields (the token counts as two columns), for spreadsheets and tools
that read CSV. A file of lines like JSON Lines, resumed and evicted the same way."""

from __future__ import annotations

import csv
import io

import msgspec

from swarm_queue.common.models import JobSpec, OutputLine, Result
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.valuecols import value_cells, value_columns, value_fields

__all__ = ["COLUMNS", "csv_row", "csv_sink"]

_FIELDS = [f.name for f in msgspec.structs.fields(OutputLine)]
_USAGE = ("prompt_tokens", "completion_tokens")
COLUMNS = [*(name for name in _FIELDS if name != "usage"), *_USAGE]


def _encode(values: list[object]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue().encode()


def _cells(r: Result) -> list[object]:
    """``r``'s cells in :data:`COLUMNS` order (an empty one for what it lacks)."""
    line = OutputLine.of(r)
    cells: list[object] = []
    for name in COLUMNS:
        if name in _USAGE:
            value = getattr(line.usage, name) if line.usage is not None else None
        elif name == "cached":
            value = r.cached
        else:
            value = getattr(line, name)
        if isinstance(value, list | dict):  # an embedding, samples, a value: one cell of JSON
            value = msgspec.json.encode(value).decode()
        cells.append("" if value is None or value is msgspec.UNSET else value)
    return cells


def csv_row(r: Result) -> bytes:
    """``r`` as one CSV row of :data:`COLUMNS`."""
    return _encode(_cells(r))


def csv_sink(path: str, spec: JobSpec | None = None) -> LineSink[Result]:
    """A CSV file of a job's results; with a per-prompt measure, its value's fields as
    columns of their own after :data:`COLUMNS` (see :mod:`producer.valuecols`)."""
    fields = value_fields(spec)
    if not fields:
        return LineSink(path, csv_row, header=_encode(list(COLUMNS)), quoted_newlines=True)

    def row(r: Result) -> bytes:
        extra = ["" if v is None else v for v in value_cells(r, fields)]
        return _encode([*_cells(r), *extra])

    return LineSink(
        path, row, header=_encode([*COLUMNS, *value_columns(fields)]), quoted_newlines=True
    )
