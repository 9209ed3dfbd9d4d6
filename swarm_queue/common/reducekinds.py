"""The kinds of reduce a job may ask for, by name: what each checks of its spec, whether its
work goes through the fleet (prompts queued as stages of the job) or is a function of the
results, and the line that describes it. Every other room asks this table; nothing else
dispatches on a reduce's name. A new reduce is an entry here, and its aggregator in
:mod:`common.reduce` (or its stages in :mod:`flows.reduce`, for one that needs the fleet).

It imports nothing of the models it checks (they import it to validate themselves).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FUNCTION", "REDUCE_KINDS", "TREE", "ReduceKind", "reduce_problem"]

TREE = "tree"
FUNCTION = "function"

_FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class ReduceKind:
    """One kind of reduce. ``check(spec)``: why a spec of this kind is invalid (None: it is
    not); ``fleet``: its work is prompts for the endpoints, as stages of the job, rather than
    a function of the results run by a worker; ``prompt``: it takes a prompt template."""

    help: str
    check: Callable[[Any], str | None] = lambda spec: None
    fleet: bool = False
    prompt: bool = False


def _tree(spec: Any) -> str | None:
    if not spec.prompt or "{responses}" not in spec.prompt:
        return "a tree reduce needs a prompt template containing {responses}"
    if spec.fanin < 2:
        return f"fanin must be >= 2, got {spec.fanin}"
    return None


def _function(spec: Any) -> str | None:
    if not spec.function or not _FUNCTION_RE.fullmatch(spec.function):
        return f"reduce function {spec.function!r} must be given as package.module:function"
    return None


REDUCE_KINDS: dict[str, ReduceKind] = {
    "concat": ReduceKind("the answers joined in input order"),
    "vote": ReduceKind("a majority vote over the normalised answers, with its share"),
    "json": ReduceKind("each answer parsed as JSON; objects merged, lists flattened"),
    "stats": ReduceKind("numbers parsed from the answers: count, mean, median, spread"),
    TREE: ReduceKind(
        "a tree of supervisor prompts over the answers, fanin at a time, to one answer",
        _tree,
        fleet=True,
        prompt=True,
    ),
    FUNCTION: ReduceKind("the user's package.module:function over the results", _function),
}


def reduce_problem(spec: Any) -> str | None:
    """Why the reduce ``spec`` (a :class:`common.models.ReduceSpec`) is invalid, or None."""
    kind = REDUCE_KINDS.get(spec.kind)
    if kind is None:
        names = ", ".join(n for n in REDUCE_KINDS if n != FUNCTION)
        return f"unknown reduce {spec.kind!r}: use one of {names} or package.module:function"
    return kind.check(spec)
