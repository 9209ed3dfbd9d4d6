"""A pipeline's chains as columns, for ``swarm-collect --format csv|parquet``: one row per
input, in input order; the whole chain's fields (``index``, ``custom_id``, ``text``: the last
step's answer, ``stopped_at``, ``error``), then each step's own, prefixed by its number
(``s0_text``, ``s0_error``..., ``s1_text``...). A step an input did not reach has empty cells.
Samples are a list of strings, a per-prompt value its JSON (a cell of JSON text in CSV)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from swarm_queue.common.models import JobSpec
from swarm_queue.producer.chains import ChainLine, StepAnswer
from swarm_queue.producer.flowout import csv_cells
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.valuecols import value_columns, value_fields

__all__ = ["chain_columns", "chain_csv_sink", "chain_parquet_sink", "chain_row"]

# The chain's own columns, then each step's (their name after ``sK_``).
_CHAIN = ("index", "custom_id", "text", "stopped_at", "error")
_STEP = (
    "text",
    "finish_reason",
    "error",
    "error_kind",
    "model",
    "endpoint",
    "prompt_tokens",
    "completion_tokens",
    "cached",
    "samples",
    "value",
)


def chain_columns(steps: Sequence[JobSpec]) -> list[str]:
    """The column names of a pipeline of ``steps``: a step with a per-prompt measure has its
    value's fields as typed columns too (``s1_value.entropy``: see producer/valuecols.py)."""
    return [
        *_CHAIN,
        *(
            f"s{k}_{name}"
            for k, spec in enumerate(steps)
            for name in [*_STEP, *value_columns(value_fields(spec))]
        ),
    ]


def _step_values(answer: StepAnswer | None) -> list[Any]:
    if answer is None:
        return [None] * len(_STEP)
    usage = answer.usage
    return [
        answer.text,
        answer.finish_reason,
        answer.error,
        answer.error_kind,
        answer.model or None,
        answer.endpoint or None,
        usage.prompt_tokens if usage is not None else None,
        usage.completion_tokens if usage is not None else None,
        answer.cached,
        answer.samples,
        msgspec.json.encode(answer.value).decode() if answer.value is not None else None,
    ]


def chain_row(line: ChainLine, steps: Sequence[JobSpec]) -> list[Any]:
    """``line``'s cells, in :func:`chain_columns` order."""
    by_step = {a.step: a for a in line.steps}
    cells: list[Any] = [
        line.index,
        line.custom_id if line.custom_id is not msgspec.UNSET else None,
        line.text,
        line.stopped_at if line.stopped_at is not msgspec.UNSET else None,
        line.error,
    ]
    for k, spec in enumerate(steps):
        answer = by_step.get(k)
        cells += _step_values(answer)
        value = answer.value if answer is not None and answer.value is not None else {}
        cells += [value.get(name) for name, _ in value_fields(spec)]
    return cells


def chain_csv_sink(path: str, steps: Sequence[JobSpec]) -> LineSink[ChainLine]:
    """A CSV file of a pipeline's chains, under a header row of :func:`chain_columns`."""
    return LineSink(
        path,
        lambda line: csv_cells(chain_row(line, steps)),
        header=csv_cells(chain_columns(steps)),
        quoted_newlines=True,
    )


def chain_parquet_sink(path: str, steps: Sequence[JobSpec]) -> Any:
    """A Parquet directory of a pipeline's chains (needs pyarrow), typed columns."""
    import pyarrow as pa

    from swarm_queue.producer.parquet import ARROW_OF as arrow
    from swarm_queue.producer.parquet import ParquetSink

    step_types = [
        pa.string(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.int64(),
        pa.int64(),
        pa.bool_(),
        pa.list_(pa.string()),
        pa.string(),
    ]
    chain_types = [pa.int64(), pa.string(), pa.string(), pa.int64(), pa.string()]
    types = chain_types + [
        t for spec in steps for t in [*step_types, *(arrow[kind] for _, kind in value_fields(spec))]
    ]
    schema = pa.schema(list(zip(chain_columns(steps), types, strict=True)))

    def table(lines: Sequence[ChainLine]) -> pa.Table:
        rows = [chain_row(line, steps) for line in lines]
        columns = {name: [r[i] for r in rows] for i, name in enumerate(schema.names)}
        return pa.table(columns, schema=schema)

    return ParquetSink[ChainLine](path, table, schema)
