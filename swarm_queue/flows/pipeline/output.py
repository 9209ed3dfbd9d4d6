"""A pipeline's output: one line per input index, in input order, with every step's answer as
far as the input went (its chain), and where and why it stopped if it did not reach the end.

An input's answer at step k is found through step k's ``fed`` hash (input index -> its index
there) or, if its answer before was filtered out, in step k's ``dropped`` hash. As columns
(CSV, Parquet): the whole chain's fields (``index``, ``custom_id``, ``text``: the last step's
answer, ``stopped_at``, ``error``), then each step's own, prefixed by its number
(``s0_text``, ``s0_error``..., ``s1_text``...); a step an input did not reach has empty cells,
and a step with a per-prompt measure has its value's fields as typed columns too
(``s1_value.entropy``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from swarm_queue.common.keys import step_name
from swarm_queue.common.models import Result, Usage, result_or_failure
from swarm_queue.common.output import CollectReport, Column, JobOutput, Json
from swarm_queue.common.perprompt import value_fields
from swarm_queue.common.store import CollectorStore

__all__ = ["ChainLine", "PipelineOutput", "StepAnswer"]


class StepAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """One step's outcome for one input: its answer, or why it failed."""

    step: int
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    model: str = ""
    endpoint: str = ""
    usage: Usage | None = None
    cached: bool = False
    samples: list[str] | None = None
    value: dict[str, Any] | None = None

    @classmethod
    def of(cls, step: int, r: Result) -> StepAnswer:
        return cls(
            step,
            r.text,
            r.finish_reason,
            r.error,
            r.error_kind,
            r.model,
            r.endpoint,
            r.usage,
            r.cached,
            r.samples,
            r.value,
        )


class ChainLine(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """One input through a pipeline: ``text`` is its last step's answer when every step
    answered; else ``stopped_at`` is the step it did not pass, ``error`` why (failed there,
    or its answer before was filtered out)."""

    index: int
    custom_id: str | msgspec.UnsetType = msgspec.UNSET
    text: str | None = None
    steps: list[StepAnswer] = msgspec.field(default_factory=list)
    stopped_at: int | msgspec.UnsetType = msgspec.UNSET
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Chain:
    """One input's chain while it is being followed."""

    def __init__(self, first: Result) -> None:
        self.index = first.index
        self.custom_id = first.custom_id
        self.answers = [StepAnswer.of(0, first)]
        self.at: int | None = None  # the index in the step being looked for
        self.error = None if first.ok else f"step 0 failed: {first.error}"
        self.stopped_at: int | None = None if first.ok else 0

    def line(self, steps: int) -> ChainLine:
        last = self.answers[-1]
        done = self.error is None and len(self.answers) == steps
        return ChainLine(
            index=self.index,
            custom_id=self.custom_id if self.custom_id is not None else msgspec.UNSET,
            text=last.text if done else None,
            steps=self.answers,
            stopped_at=self.stopped_at if self.stopped_at is not None else msgspec.UNSET,
            error=self.error,
        )

    def ended(self, steps: int) -> bool:
        return self.error is not None or len(self.answers) == steps


# The chain's own columns, then each step's (their name after ``sK_``).
_CHAIN = (
    Column("index", int),
    Column("custom_id", str),
    Column("text", str),
    Column("stopped_at", int),
    Column("error", str),
)
_STEP = (
    Column("text", str),
    Column("finish_reason", str),
    Column("error", str),
    Column("error_kind", str),
    Column("model", str),
    Column("endpoint", str),
    Column("prompt_tokens", int),
    Column("completion_tokens", int),
    Column("cached", bool),
    Column("samples", list),
    Column("value", Json),
)


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
        answer.value,
    ]


class PipelineOutput(JobOutput[_Chain]):
    """A pipeline's lines: one chain per input, once it has ended (answered by the last step,
    or stopped on the way)."""

    what = "pipeline"

    async def tally(self, store: CollectorStore, report: CollectReport) -> tuple[str, int]:
        """The whole pipeline's figures: an input is through when its last step answered it;
        one that stopped failed at a step (each at most once), or was kept out by a step's
        filter, which is what the filter is for: no failure."""
        statuses = [await store.status(step.job) for step in self.steps]
        through = statuses[-1].done
        stopped = (report.total or 0) - through
        failed = sum(s.failed for s in statuses)
        kept_out = stopped - failed
        said = f"{through} through every step, {stopped} stopped on the way: {failed} failed, "
        return said + f"{kept_out} kept out by a filter", failed

    def start(self, first: Result) -> _Chain:
        return _Chain(first)

    async def advance(self, store: CollectorStore, items: list[_Chain]) -> None:
        await _advance(store, self.steps[0].job, items, len(self.steps))

    def ended(self, row: _Chain) -> bool:
        return row.ended(len(self.steps))

    def line(self, row: _Chain) -> ChainLine:
        return row.line(len(self.steps))

    def columns(self) -> list[Column]:
        return [
            *_CHAIN,
            *(
                Column(f"s{k}_{c.name}", c.type)
                for k, spec in enumerate(self.steps)
                for c in [*_STEP, *(Column(f"value.{n}", t) for n, t in value_fields(spec))]
            ),
        ]

    def cells(self, line: Any) -> list[Any]:
        assert isinstance(line, ChainLine)
        by_step = {a.step: a for a in line.steps}
        cells: list[Any] = [
            line.index,
            line.custom_id if line.custom_id is not msgspec.UNSET else None,
            line.text,
            line.stopped_at if line.stopped_at is not msgspec.UNSET else None,
            line.error,
        ]
        for k, spec in enumerate(self.steps):
            answer = by_step.get(k)
            cells += _step_values(answer)
            value = answer.value if answer is not None and answer.value is not None else {}
            cells += [value.get(name) for name, _ in value_fields(spec)]
        return cells


async def _advance(store: CollectorStore, job: str, chains: list[_Chain], steps: int) -> None:
    """Take every chain as far as the steps' records go now."""
    for k in range(1, steps):
        here = [c for c in chains if not c.ended(steps) and len(c.answers) == k]
        if not here:
            continue
        name = step_name(job, k)
        unplaced = [c for c in here if c.at is None]
        for c, at in zip(
            unplaced, await store.step_indices(name, [c.index for c in unplaced]), strict=True
        ):
            c.at = at
        lost = [c for c in here if c.at is None]
        for c, why in zip(
            lost, await store.drop_reasons(name, [c.index for c in lost]), strict=True
        ):
            if why is not None:
                c.error, c.stopped_at = f"not sent to step {k}: {why}", k
        placed = [c for c in here if c.at is not None]
        raws = await store.results_at(name, [c.at for c in placed if c.at is not None])
        for c, raw in zip(placed, raws, strict=True):
            if raw is None or c.at is None:
                continue
            r = result_or_failure(c.at, raw)
            c.answers.append(StepAnswer.of(k, r))
            c.at = None
            if not r.ok:
                c.error, c.stopped_at = f"step {k} failed: {r.error}", k
