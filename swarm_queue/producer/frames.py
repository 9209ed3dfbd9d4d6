"""The data people hold, in and out of the Python API: prompts from a list, a pandas
DataFrame, a Hugging Face ``datasets.Dataset`` or a Parquet file (the prompt column named),
and results as a DataFrame with the columns of ``swarm-collect --format parquet`` (an
embedding a list of floats). pandas and pyarrow are imported only when such data is given."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.producer.plain import PlainOutput

__all__ = ["prompts_from", "results_dataset", "results_frame"]


def prompts_from(
    data: Any, *, column: str = "prompt", id_column: str | None = None
) -> Iterable[str | tuple[str, str | None]]:
    """The prompts of ``data``: strings or ``(prompt, custom_id)`` pairs as they are; of a
    DataFrame, a Dataset or a Parquet file (a path), the ``column`` (with ``id_column``'s
    values as custom ids)."""
    if isinstance(data, str | os.PathLike) and str(data).endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(os.fspath(data), columns=_wanted(column, id_column))
        return _pairs_of(table.column(column).to_pylist(), _ids(table, id_column), column)
    if hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
        _has(list(data.columns), column, id_column)
        ids = data[id_column].tolist() if id_column else None
        return _pairs_of(data[column].tolist(), ids, column)
    if hasattr(data, "column_names") and hasattr(data, "select"):  # a datasets.Dataset
        _has(list(data.column_names), column, id_column)
        ids = list(data[id_column]) if id_column else None
        return _pairs_of(list(data[column]), ids, column)
    if isinstance(data, str | bytes):
        raise ConfigError("prompts are a list of strings, not one string")
    return data  # type: ignore[no-any-return]


def _wanted(column: str, id_column: str | None) -> list[str]:
    return [column, id_column] if id_column else [column]


def _has(columns: list[str], column: str, id_column: str | None) -> None:
    for name in _wanted(column, id_column):
        if name not in columns:
            raise ConfigError(
                f"no column {name!r} in the data (it has {', '.join(map(repr, columns))}): "
                "name the prompt column with column=..."
            )


def _ids(table: Any, id_column: str | None) -> list[Any] | None:
    return table.column(id_column).to_pylist() if id_column else None


def _pairs_of(
    prompts: Sequence[Any], ids: Sequence[Any] | None, column: str
) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ConfigError(f"row {i} of column {column!r} is a {type(p).__name__}, not text")
        out.append((p, None if ids is None or ids[i] is None else str(ids[i])))
    return out


def _table(results: Sequence[Result], spec: JobSpec) -> Any:
    """``results`` of the job of ``spec`` as one Arrow table, with the columns of its Parquet
    output (see :class:`producer.plain.PlainOutput`)."""
    from swarm_queue.producer.parquet import output_table

    return output_table(PlainOutput([spec]), results)


def results_frame(results: Sequence[Result], spec: JobSpec) -> Any:
    """``results`` of the job of ``spec`` as a pandas DataFrame, one row per prompt in the
    given order, with the columns of the Parquet output (needs pandas and pyarrow: the
    ``parquet`` extra)."""
    try:
        import pandas  # noqa: F401 - said here, before the table is made
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError(
            "results as a DataFrame need pyarrow and pandas: pip install 'swarm-queue[parquet]' "
            "pandas"
        ) from None
    return _table(results, spec).to_pandas(types_mapper=None)


def results_dataset(results: Sequence[Result], spec: JobSpec) -> Any:
    """``results`` of the job of ``spec`` as a Hugging Face ``datasets.Dataset`` with the
    columns of the Parquet output (needs ``datasets``)."""
    try:
        import datasets
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError(
            "results as a Dataset need pyarrow and datasets: pip install "
            "'swarm-queue[parquet]' datasets"
        ) from None
    return datasets.Dataset(_table(results, spec))
