"""An agent job's output: one line per agent, in input order, as each agent (and every one
before it) has finished: its output as data, or its failure and why, with the turns, tool
calls and tokens it used. As columns (CSV, Parquet): the fields of its JSON line (its
``output`` as JSON text), and, when the job has an output schema, each of the schema's
top-level properties as a column of its own (``output.title``, ``output.year``...), typed as
the schema says. Its lines can also be followed in the order the agents finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from swarm_queue.common.errors import JobGoneError
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import Column, JobOutput, Json
from swarm_queue.common.store import CollectorStore
from swarm_queue.flows.agents.spec import AgentResult, agent_of

__all__ = ["AgentOutput"]

_decoder = msgspec.msgpack.Decoder(AgentResult)

_FIELDS = (
    Column("index", int),
    Column("custom_id", str),
    Column("output", Json),
    Column("text", str),
    Column("failure", str),
    Column("error", str),
    Column("turns", int),
    Column("tool_calls", int),
    Column("prompt_tokens", int),
    Column("completion_tokens", int),
    Column("tool_runs", int),
    Column("tools_cut", int),
)
# A property's column type, by its schema type (any other: its JSON text).
_OF_SCHEMA: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _properties(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The output schema's top-level properties (none without an object schema)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}
    return dict(schema["properties"])


def _column_type(prop: Any) -> type:
    """How a property's values are stored: by its schema type, else as JSON text."""
    kind = prop.get("type") if isinstance(prop, dict) else None
    if isinstance(kind, list):  # ["integer", "null"]: the one that is not null
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return _OF_SCHEMA.get(kind, Json) if isinstance(kind, str) else Json


class AgentOutput(JobOutput[AgentResult]):
    """An agent job's lines: each agent's outcome, as its flow recorded it when it ended."""

    what = "agents"

    def __init__(self, steps: list[JobSpec]) -> None:
        super().__init__(steps)
        agent = agent_of(self.steps[0])
        self.schema = _properties(agent.output_schema if agent is not None else None)

    @staticmethod
    def later(spec: JobSpec) -> list[str]:
        agent = agent_of(spec)
        turns = agent.max_turns if agent is not None else 1
        return [step_name(spec.job, k) for k in range(1, turns)]

    async def read(
        self, store: CollectorStore, job: str, start: int, count: int
    ) -> list[AgentResult]:
        rows = []
        for raw in await store.outcomes(job, start, count):
            if raw is None:
                break
            rows.append(_decoder.decode(raw))
        return rows

    def line(self, row: AgentResult) -> AgentResult:
        return row

    def columns(self) -> list[Column]:
        props = [Column(f"output.{n}", _column_type(p)) for n, p in self.schema.items()]
        return [*_FIELDS, *props]

    def cells(self, line: Any) -> list[Any]:
        assert isinstance(line, AgentResult)
        cells: list[Any] = [getattr(line, c.name) for c in _FIELDS]
        output = line.output if isinstance(line.output, dict) else {}
        return cells + [output.get(name) for name in self.schema]

    async def in_finish_order(
        self, store: CollectorStore, *, poll_s: float = 0.1
    ) -> AsyncIterator[list[AgentResult]]:
        """The agents in the order they finish, a chunk at a time, until every one has (what
        a user who acts on each result at once wants, rather than input order)."""
        job, generation = self.steps[0].job, self.steps[0].generation
        after, seen = b"0", 0
        while True:
            agents, after = await store.finished_since(job, after)
            if agents:
                raws = await store.outcomes_of(job, agents)
                yield [_decoder.decode(r) for r in raws if r is not None]
                seen += len(agents)
            status = await store.status(job, rate=False)
            if status.generation != generation:
                raise JobGoneError(job)
            if status.total is not None and seen >= status.total:
                return
            if not agents:
                await asyncio.sleep(poll_s)
