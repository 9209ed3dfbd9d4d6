"""An agent job's results as columns, for ``swarm-collect --format csv|parquet``: one row per
agent, in input order, with the fields of its JSON line (its ``output`` as JSON text), and,
when the job has an output schema, each of the schema's top-level properties as a column of
its own (``output.title``, ``output.year``...), typed as the schema says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from swarm_queue.flows.agents import AgentResult
from swarm_queue.producer.flowout import csv_cells
from swarm_queue.producer.lines import LineSink

__all__ = ["agent_columns", "agent_csv_sink", "agent_parquet_sink", "agent_row"]

_FIELDS = (
    "index", "custom_id", "output", "text", "failure", "error", "turns", "tool_calls",
    "prompt_tokens", "completion_tokens", "tool_runs", "tools_cut",
)  # fmt: skip
_INTS = {"index", "turns", "tool_calls", "prompt_tokens", "completion_tokens", "tool_runs",
         "tools_cut"}  # fmt: skip


def _properties(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The output schema's top-level properties (none without an object schema)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}
    return dict(schema["properties"])


def agent_columns(schema: dict[str, Any] | None) -> list[str]:
    """The column names of an agent job whose output schema is ``schema``."""
    return [*_FIELDS, *(f"output.{name}" for name in _properties(schema))]


def agent_row(r: AgentResult, schema: dict[str, Any] | None) -> list[Any]:
    """``r``'s cells, in :func:`agent_columns` order (a property the output lacks: empty)."""
    cells: list[Any] = []
    for name in _FIELDS:
        value = getattr(r, name)
        if name == "output":
            value = None if value is None else msgspec.json.encode(value).decode()
        cells.append(value)
    output = r.output if isinstance(r.output, dict) else {}
    for name, prop in _properties(schema).items():
        value = output.get(name)
        if value is not None and _arrow_kind(prop) == "json":
            value = msgspec.json.encode(value).decode()
        cells.append(value)
    return cells


def _arrow_kind(prop: Any) -> str:
    """How a property's values are stored: by its schema type, else as JSON text."""
    kind = prop.get("type") if isinstance(prop, dict) else None
    if isinstance(kind, list):  # ["integer", "null"]: the one that is not null
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if kind in ("string", "integer", "number", "boolean") else "json"


def agent_csv_sink(path: str, schema: dict[str, Any] | None) -> LineSink[AgentResult]:
    """A CSV file of an agent job's results, under a header row of :func:`agent_columns`."""
    return LineSink(
        path,
        lambda r: csv_cells(agent_row(r, schema)),
        header=csv_cells(agent_columns(schema)),
        quoted_newlines=True,
    )


def agent_parquet_sink(path: str, schema: dict[str, Any] | None) -> Any:
    """A Parquet directory of an agent job's results (needs pyarrow), typed columns."""
    import pyarrow as pa

    from swarm_queue.producer.parquet import ParquetSink

    by_kind = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(),
               "boolean": pa.bool_(), "json": pa.string()}  # fmt: skip
    types = [pa.int64() if f in _INTS else pa.string() for f in _FIELDS]
    types += [by_kind[_arrow_kind(p)] for p in _properties(schema).values()]
    arrow = pa.schema(list(zip(agent_columns(schema), types, strict=True)))

    def table(results: Sequence[AgentResult]) -> pa.Table:
        rows = [agent_row(r, schema) for r in results]
        return pa.table(
            {name: [row[i] for row in rows] for i, name in enumerate(arrow.names)}, schema=arrow
        )

    return ParquetSink[AgentResult](path, table, arrow)
