"""The reduce stage's aggregators: pure functions from a job's ordered results to one output.

Every aggregator gets every result, failures included, and lists each failure by index in its
output: a reduce never drops a prompt silently. ``tree`` is not here: its supervisor prompts go
through the queue as stages of the job (see :mod:`flows.reduce`); :func:`render` builds them.
"""

from __future__ import annotations

import importlib
import math
import re
import statistics
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.final import FailedPrompt, ReduceOutput
from swarm_queue.common.models import ReduceSpec, Result, timestamp_s
from swarm_queue.common.reducekinds import FUNCTION

__all__ = [
    "AGGREGATORS",
    "aggregate",
    "failures",
    "function_allowed",
    "load_function",
    "merge_json",
    "normalise",
    "parse_number",
    "render",
]

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_json = msgspec.json.Decoder()


def failures(results: Sequence[Result], level: int = 0) -> list[FailedPrompt]:
    """Every failed result, by index, with its reason."""
    return [FailedPrompt(r.index, r.error or "", r.error_kind, level) for r in results if not r.ok]


def normalise(text: str) -> str:
    """The form answers are compared in for a vote: Unicode-normalised, case-folded, inner
    whitespace collapsed, surrounding whitespace, quotes and punctuation removed ("Yes." and
    " yes" are the same vote)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    return text.strip(" \"'`.,;:!?()[]{}*")


def _vote(ok: Sequence[Result]) -> dict[str, Any]:
    counts = Counter(normalise(r.text or "") for r in ok)
    # Ties go to the answer seen first, in index order: deterministic, and stated.
    first_seen = {a: i for i, a in reversed(list(enumerate(normalise(r.text or "") for r in ok)))}
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], first_seen[kv[0]]))
    winner, votes = ranked[0] if ranked else (None, 0)
    return {
        "winner": winner,
        "votes": votes,
        "share": votes / len(ok) if ok else 0.0,
        "counts": dict(ranked),
    }


def _strip_fence(text: str) -> str:
    m = _FENCE.match(text)
    return m.group(1) if m else text.strip()


def merge_json(values: Sequence[Any]) -> Any:
    """Objects merge key by key (recursively; lists under one key are concatenated, other
    values: the later index wins); anything else is flattened into one list (a list's items,
    or the value itself)."""
    if values and all(isinstance(v, dict) for v in values):
        merged: dict[str, Any] = {}
        for v in values:
            _merge_into(merged, v)
        return merged
    out: list[Any] = []
    for v in values:
        if isinstance(v, list):
            out.extend(v)
        else:
            out.append(v)
    return out


def _merge_into(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            _merge_into(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            old.extend(value)
        else:
            into[key] = value


def _json_merge(ok: Sequence[Result], failed: list[FailedPrompt]) -> Any:
    values = []
    for r in ok:
        try:
            values.append(_json.decode(_strip_fence(r.text or "")))
        except msgspec.DecodeError as exc:
            failed.append(FailedPrompt(r.index, f"not JSON: {exc}", "unparsable"))
    return merge_json(values)


def parse_number(text: str) -> float:
    """The one number in ``text`` ("42", " 3.5e2", "The answer is -7."); ValueError if it
    holds none, or more than one (which of them would be a guess)."""
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        found = _NUMBER.findall(stripped)
        if len(found) != 1:
            raise ValueError(f"expected one number, found {len(found)}") from None
        value = float(found[0])
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {stripped[:40]!r}")
    return value


def _stats(ok: Sequence[Result], failed: list[FailedPrompt]) -> dict[str, Any]:
    xs = []
    for r in ok:
        try:
            xs.append(parse_number(r.text or ""))
        except ValueError as exc:
            failed.append(FailedPrompt(r.index, str(exc), "unparsable"))
    if not xs:
        return {"count": 0, "mean": None, "std": None, "median": None, "min": None, "max": None}
    return {
        "count": len(xs),
        "mean": statistics.fmean(xs),
        # Population standard deviation (numpy's default, ddof=0).
        "std": statistics.pstdev(xs),
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
    }


def function_allowed(path: str, allowed: Iterable[str]) -> bool:
    """True when ``path`` (``package.module:function``) is in ``allowed``, itself or as
    ``package.module:*``: workers import only what their own settings name."""
    module, _, _ = path.partition(":")
    return any(a == path or a == f"{module}:*" for a in allowed)


def load_function(path: str) -> Callable[[list[Result]], Any]:
    """The user's aggregator ``package.module:function``, imported; ConfigError if absent."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reduce function {path}: cannot import {module_name}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reduce function {path}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def aggregate(
    job: str, spec: ReduceSpec, results: Sequence[Result], allowed: Iterable[str] = ()
) -> ReduceOutput:
    """Apply ``spec`` (any kind but ``tree``) to ``results``, in index order.

    A user function gets the successful results (a list of :class:`Result`, in index order)
    and returns anything JSON can hold; if it raises, the output carries the error. It is
    imported only if ``allowed`` names it (see :func:`function_allowed`): a job's spec comes
    from Redis, and whoever can write there must not choose what code the workers run.
    """
    ok = [r for r in results if r.ok]
    failed = failures(results)
    value: Any = None
    error: str | None = None
    if spec.kind == FUNCTION:
        value, error = _user_function(spec, ok, allowed)
    elif spec.kind in AGGREGATORS:
        value = AGGREGATORS[spec.kind](spec, ok, failed)
    else:
        raise ConfigError(f"aggregate() does not run {spec.kind!r} reduces")
    failed.sort(key=lambda f: f.index)
    used = len(ok) - sum(1 for f in failed if f.kind == "unparsable")
    return ReduceOutput(
        job=job,
        kind=spec.kind,
        value=value,
        used=used,
        failed=failed,
        error=error,
        finished_s=timestamp_s(),
    )


def _user_function(
    spec: ReduceSpec, ok: list[Result], allowed: Iterable[str]
) -> tuple[Any, str | None]:
    """The user's aggregator over ``ok``: its value, or None and why."""
    if not function_allowed(spec.function or "", allowed):
        names = ", ".join(sorted(allowed)) or "none"
        return None, (
            f"reduce function {spec.function} is not allowed on this worker: list it in the "
            f"workers' SWARM_REDUCE_FUNCTIONS (allowed now: {names})"
        )
    try:
        value = load_function(spec.function or "")(ok)
    except Exception as exc:  # the user's code: any failure becomes the output's error
        return None, f"{spec.function} failed: {type(exc).__name__}: {exc}"
    try:
        msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        return None, f"{spec.function} returned what JSON cannot hold: {exc}"
    return value, None


# The aggregator of each kind of reduce that is a function of the results (see
# common.reducekinds): its value from the spec, the successful results and the failures (to
# which it adds the answers it could not use).
AGGREGATORS: dict[str, Callable[[ReduceSpec, list[Result], list[FailedPrompt]], Any]] = {
    "concat": lambda spec, ok, failed: spec.separator.join(r.text or "" for r in ok),
    "vote": lambda spec, ok, failed: _vote(ok),
    "json": lambda spec, ok, failed: _json_merge(ok, failed),
    "stats": lambda spec, ok, failed: _stats(ok, failed),
}


def render(template: str, responses: Sequence[str], level: int) -> str:
    """A supervisor prompt: ``{responses}`` becomes the numbered responses, ``{level}`` the
    tree level. Only those two are replaced, so other braces in a template (a JSON example)
    stay as written."""
    block = "\n\n".join(f"Response {i}:\n{text.strip()}" for i, text in enumerate(responses, 1))
    return template.replace("{level}", str(level)).replace("{responses}", block)
