"""What a job needs of the worker that does its work, beyond an endpoint for its model: a
function that worker imports (a pipeline step's keep function, a reduce function: only where
that worker's own ``SWARM_REDUCE_FUNCTIONS`` allows it) or numpy (the uncertainty measures).

A worker that lacks what a piece of work needs leaves it to one that has it and says so once;
it never records a failure for it. Every worker publishes what it has with its rows of the
fleet registry, so that work no live worker can do waits visibly, naming what is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import msgspec

from swarm_queue.common.fleet import EndpointInfo, usable
from swarm_queue.common.models import JobSpec
from swarm_queue.common.perprompt import PER_PROMPT_KINDS
from swarm_queue.common.reduce import function_allowed
from swarm_queue.common.reducekinds import FUNCTION

__all__ = ["NUMPY", "Abilities", "Need", "has_numpy", "lacking", "needs", "unmet"]

NUMPY = "numpy"


def has_numpy() -> bool:
    """Whether numpy is installed here (the uncertainty measures need it): found, not
    imported, which would cost every worker's start a third of a second of CPU (py-spy)."""
    try:
        return importlib.util.find_spec(NUMPY) is not None
    except (ImportError, ValueError):
        return False


class Need(msgspec.Struct, frozen=True):
    """One thing a job's work needs of its worker: ``kind`` (``keep``: the keep function of
    the step after it; ``reduce``: its reduce function; ``numpy``) and ``what`` (the
    function's ``package.module:function``, or ``numpy``)."""

    kind: str
    what: str

    def describe(self) -> str:
        if self.kind == NUMPY:
            return "numpy (pip install 'swarm-queue[uq]')"
        return f"{self.kind} function {self.what} (SWARM_REDUCE_FUNCTIONS)"


class Abilities(msgspec.Struct, frozen=True):
    """What one worker has: the functions its settings allow (entries as in
    ``SWARM_REDUCE_FUNCTIONS``), and whether numpy imports."""

    functions: frozenset[str] = frozenset()
    numpy: bool = False

    def has(self, need: Need) -> bool:
        if need.kind == NUMPY:
            return self.numpy
        return function_allowed(need.what, self.functions)


def needs(spec: JobSpec) -> list[Need]:
    """What the work of ``spec``'s job on the fleet needs of a worker: its reduce function,
    numpy for a measure. (A flow's own needs are the flow's to say: a pipeline step's keep
    function, see flows/pipeline/spec.py.)"""
    out = []
    if spec.reduce is not None and spec.reduce.kind == FUNCTION and spec.reduce.function:
        out.append(Need("reduce", spec.reduce.function))
    per = spec.per_prompt
    if spec.embed and per is not None and PER_PROMPT_KINDS[per.kind].embeddings:
        out.append(Need(NUMPY, NUMPY))
    return out


def lacking(needs_: Iterable[Need], abilities: Abilities) -> list[Need]:
    """Those of ``needs_`` that ``abilities`` do not meet."""
    return [n for n in needs_ if not abilities.has(n)]


def unmet(needs_: Iterable[Need], fleet: Iterable[EndpointInfo], now: float) -> str | None:
    """Why no live worker of ``fleet`` can do work with ``needs_`` (None: one can each)."""
    rows = [e for e in fleet if usable(e, now)]
    missing = [
        n
        for n in needs_
        if not any(Abilities(frozenset(e.functions), e.numpy).has(n) for e in rows)
    ]
    if not missing:
        return None
    return "no live worker has " + ", ".join(n.describe() for n in missing)
