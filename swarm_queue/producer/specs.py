"""What a Python API call says a job is: the reduce kinds by name (``Concat()``,
``TreeReduce(...)``), a pipeline's :func:`Step`, the prompts as (text, custom_id) pairs, an
output schema, the tools given as functions."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import options_from
from swarm_queue.common.models import ReduceSpec
from swarm_queue.flows.agents.spec import tool_definition
from swarm_queue.flows.pipeline.spec import StepOptions

__all__ = [
    "Concat",
    "JsonMerge",
    "Prompts",
    "Stats",
    "Step",
    "TreeReduce",
    "UserReduce",
    "Vote",
    "pairs",
    "schema_of",
    "tools_of",
]

# Prompts, each a text or a (text, custom_id) pair: a list may mix the two.
Prompts = Iterable[str | tuple[str, str | None]]


# Reduce specs by name, capitalised like the types they stand for: a call reads as a spec.
def Concat(separator: str = "\n") -> ReduceSpec:
    """Join the answers in input order."""
    return ReduceSpec(kind="concat", separator=separator)


def Vote() -> ReduceSpec:
    """Majority vote over normalised answers, with the winning share."""
    return ReduceSpec(kind="vote")


def JsonMerge() -> ReduceSpec:
    """Parse each answer as JSON; merge objects, flatten lists."""
    return ReduceSpec(kind="json")


def Stats() -> ReduceSpec:
    """Mean, std, median, min, max and count of the number in each answer."""
    return ReduceSpec(kind="stats")


def TreeReduce(prompt: str, fanin: int = 10, max_tokens: int = 0) -> ReduceSpec:
    """Summarise hierarchically: ``fanin`` answers per supervisor prompt (a template with
    ``{responses}`` and ``{level}``), level after level, until one answer remains."""
    return ReduceSpec(kind="tree", prompt=prompt, fanin=fanin, max_tokens=max_tokens)


def UserReduce(function: str) -> ReduceSpec:
    """Your own aggregator, ``package.module:function``, called on the workers with the
    successful results in order. The workers must allow it (``SWARM_REDUCE_FUNCTIONS``);
    a Swarm that drains its jobs itself allows those it submits."""
    return ReduceSpec(kind="function", function=function)


def Step(
    template: str,
    *,
    keep_if: str | None = None,
    keep: Callable[[str], object] | str | None = None,
    **settings: Any,
) -> StepOptions:
    """A pipeline step after the first: ``template`` with ``{answer}`` (the answer before)
    and ``{prompt}`` (the input's); ``keep_if`` and ``keep`` are the gate into this step: only
    answers of the step before that ``keep_if`` (a regular expression) matches, and that
    ``keep`` (a module-level function, or ``package.module:function``) is true for, reach
    it; ``settings``: the step's own, as :meth:`Swarm.submit` takes them (``model`` and
    ``priority`` default to the first step's)."""
    fn = keep
    if callable(keep):
        fn = f"{keep.__module__}:{keep.__qualname__}"
        if "." in keep.__qualname__ or keep.__module__ == "__main__":
            raise ConfigError(
                f"keep={keep.__qualname__}: the workers import it by name, so it must be a "
                "module-level function of an importable module (not a lambda or __main__)"
            )
    return StepOptions(
        template=template,
        keep_if=keep_if,
        keep_fn=fn if isinstance(fn, str) else None,
        options=options_from(settings),
    )


def pairs(prompts: Prompts) -> Iterable[tuple[str, str | None]]:
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            yield p, None
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            yield p[0], p[1]
        else:
            raise ConfigError(
                f"prompt {i} is a {type(p).__name__}: give strings, or (prompt, custom_id) pairs"
            )


def schema_of(
    schema: dict[str, Any] | type | None,
) -> tuple[dict[str, Any] | None, Callable[[Any], Any] | None]:
    """An output schema as JSON Schema, and what makes an output an instance of it: a
    Pydantic model class gives both (batch-agent's and Curator's users pass one)."""
    if schema is None or isinstance(schema, dict):
        return schema, None
    to_schema = getattr(schema, "model_json_schema", None)
    validate = getattr(schema, "model_validate", None)
    if isinstance(schema, type) and callable(to_schema) and callable(validate):
        return to_schema(), validate
    raise ConfigError(
        f"output_schema is a JSON Schema (a dict) or a Pydantic model class, not {schema!r}"
    )


def tools_of(tools: Sequence[Callable[..., Any] | str]) -> tuple[list[str], list[dict[str, Any]]]:
    """The tools an agents call names: the functions among them as ``module:function`` (run
    in this process), and every tool's definition as the model is offered it."""
    entries, definitions = [], []
    for t in tools:
        if callable(t):
            if "." in t.__qualname__ or t.__module__ == "__main__":
                raise ConfigError(
                    f"tool {t.__qualname__}: runners import it by name, so it must be a "
                    "module-level function of an importable module"
                )
            entries.append(f"{t.__module__}:{t.__name__}")
            doc = (t.__doc__ or "").strip().splitlines()
            definitions.append(tool_definition(t.__name__, doc[0] if doc else ""))
        else:
            definitions.append(tool_definition(t))
    return entries, definitions
