"""A benchmark's figures: one row per system run, grouped in scenarios."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Row", "Scenario"]


@dataclass
class Row:
    system: str
    wall_s: float
    answered: int
    prompts: int
    ideal_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.answered / self.wall_s if self.wall_s else 0.0

    @property
    def capacity_fraction(self) -> float | None:
        return self.ideal_s / self.wall_s if self.ideal_s else None


@dataclass
class Scenario:
    name: str
    title: str
    note: str
    rows: list[Row] = field(default_factory=list)
    series: list[tuple[float, list[float], list[float], int]] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # Per system: (seconds, sequences waiting summed over the endpoints) / (seconds, bytes)
    waiting: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    memory: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
