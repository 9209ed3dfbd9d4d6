"""A pipeline's output: one line per input index, in input order, with every step's answer as
far as the input went (its chain), and where and why it stopped if it did not reach the end.

An input's answer at step k is found through step k's ``fed`` hash (input index -> its index
there) or, if its answer before was filtered out, in step k's ``dropped`` hash. Lines are
written in input order, as soon as every chain up to them has ended, durably (the same lock,
cursor and resume as any output: :func:`producer.outfile.collect_rows_durably`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from swarm_queue.common.keys import step_name
from swarm_queue.common.models import JobSpec, Result, Usage, result_or_failure
from swarm_queue.common.store import CollectorStore
from swarm_queue.flows.pipeline import link_of
from swarm_queue.producer.flowout import follow_assembled, json_line
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.outfile import collect_rows_durably
from swarm_queue.producer.stream import CollectReport

__all__ = ["ChainLine", "StepAnswer", "chain_line", "collect_chains", "follow_chains", "steps_of"]


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


def chain_line(line: ChainLine) -> bytes:
    """One JSON line, newline included."""
    return json_line(line)


async def steps_of(store: CollectorStore, job: str) -> list[JobSpec]:
    """The specs of pipeline ``job``'s steps, in order (one: a plain job)."""
    specs = [await store.load_spec(job)]
    while (link := link_of(specs[-1])) is not None:
        specs.append(await store.load_spec(link.job))
    return specs


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


def follow_chains(steps: int) -> Callable[..., AsyncIterator[list[ChainLine]]]:
    """The rows of a pipeline of ``steps`` steps, as :func:`producer.stream.follow`'s are a
    job's: every input's chain, in input order, a chunk at a time as they end."""
    return follow_assembled(
        _Chain,
        lambda store, job, chains: _advance(store, job, chains, steps),
        lambda chain: chain.ended(steps),
        lambda chain: chain.line(steps),
    )


async def collect_chains(
    store: CollectorStore,
    job: str,
    path: str,
    *,
    wait: bool,
    progress: bool,
    sink: Callable[[str, list[JobSpec]], Any] | None = None,
    **kw: Any,
) -> CollectReport:
    """Collect pipeline ``job`` into ``path``, one chain per input: JSON Lines, or what
    ``sink(path, its steps' specs)`` writes (see :mod:`producer.chaincols`)."""
    steps = await steps_of(store, job)
    return await collect_rows_durably(
        store,
        job,
        path,
        lambda p, _spec: LineSink(p, chain_line) if sink is None else sink(p, steps),
        rows=follow_chains(len(steps)),
        wait=wait,
        progress=progress,
        **kw,
    )
