"""A per-prompt measure's value as typed columns, for ``swarm-collect --format csv|parquet``:
beside the ``value`` column (its JSON), each scalar field the job's measure writes gets a
column of its own, ``value.answer``, ``value.share``, ``value.entropy``..., typed as the
measure computes it, so a frame filters and sorts on them without parsing JSON."""

from __future__ import annotations

from typing import Any

from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.perprompt import KERNEL_ENTROPY, SEMANTIC_ENTROPY, VOTE

__all__ = ["VALUE_FIELDS", "value_cells", "value_columns", "value_fields"]

# The scalar fields each measure's value has (common/perprompt.py), and their types.
VALUE_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {
    VOTE: (("answer", str), ("votes", int), ("share", float), ("distinct", int)),
    SEMANTIC_ENTROPY: (("answer", str), ("entropy", float), ("share", float)),
    KERNEL_ENTROPY: (("answer", str), ("entropy", float)),
}


def value_fields(spec: JobSpec | None) -> tuple[tuple[str, type], ...]:
    """The typed value fields of ``spec``'s per-prompt measure (none without one)."""
    if spec is None or spec.per_prompt is None:
        return ()
    return VALUE_FIELDS.get(spec.per_prompt.kind, ())


def value_columns(fields: tuple[tuple[str, type], ...]) -> list[str]:
    return [f"value.{name}" for name, _ in fields]


def value_cells(r: Result, fields: tuple[tuple[str, type], ...]) -> list[Any]:
    """``r``'s value fields, in order (None where it has none: a failure)."""
    value = r.value if isinstance(r.value, dict) else {}
    return [value.get(name) for name, _ in fields]
