"""An agent job's output: one line per agent, in input order, as each agent (and every one
before it) has finished: its output as data, or its failure and why, with the turns, tool
calls and tokens it used. Written durably like any output (the lock, the cursor, resuming:
:func:`producer.outfile.collect_rows_durably`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from swarm_queue.common.errors import JobGoneError
from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import CollectorStore, JobStatus
from swarm_queue.flows.agents import AgentResult, agent_of
from swarm_queue.producer.flowout import json_line
from swarm_queue.producer.lines import LineSink
from swarm_queue.producer.outfile import collect_rows_durably
from swarm_queue.producer.stream import CollectReport, follow_rows, wait_for_job

__all__ = ["agent_line", "agents_as_finished", "collect_agents", "follow_agents"]

CHUNK = 1000

_decoder = msgspec.msgpack.Decoder(AgentResult)


def agent_line(line: AgentResult) -> bytes:
    """One JSON line, newline included."""
    return json_line(line)


async def _agents(store: CollectorStore, job: str, start: int, count: int) -> list[AgentResult]:
    """The agents of ``job`` from ``start`` on, up to the first not finished yet."""
    chunk = []
    for raw in await store.outcomes(job, start, count):
        if raw is None:
            break
        chunk.append(_decoder.decode(raw))
    return chunk


def follow_agents(
    store: CollectorStore,
    job: str,
    *,
    start: int = 0,
    wait: bool = False,
    poll_s: float = 0.2,
    on_status: Callable[[JobStatus, int], None] | None = None,
) -> AsyncIterator[list[AgentResult]]:
    """The agents of ``job`` from ``start`` on, in input order, a chunk at a time as they
    finish (:func:`producer.stream.follow_rows`: an agent job's row source)."""
    return follow_rows(
        store, job, _agents, start=start, wait=wait, poll_s=poll_s, on_status=on_status
    )


async def agents_as_finished(
    store: CollectorStore, job: str, *, poll_s: float = 0.1
) -> AsyncIterator[list[AgentResult]]:
    """The agents of ``job`` in the order they finish, a chunk at a time, until every one
    has (what a user who acts on each result at once wants, rather than input order)."""
    generation = await wait_for_job(store, job, True, poll_s)
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


async def collect_agents(
    store: CollectorStore,
    job: str,
    path: str,
    *,
    wait: bool,
    progress: bool,
    sink: Callable[[str, dict[str, Any] | None], Any] | None = None,
    **kw: Any,
) -> CollectReport:
    """Collect agent job ``job`` into ``path``, one agent a row: JSON Lines, or what
    ``sink(path, output_schema)`` writes (see :mod:`producer.agentcols`)."""

    def make(p: str, spec: JobSpec) -> Any:
        if sink is None:
            return LineSink(p, agent_line)
        agent = agent_of(spec)
        return sink(p, agent.output_schema if agent is not None else None)

    return await collect_rows_durably(
        store,
        job,
        path,
        make,
        rows=follow_agents,
        wait=wait,
        progress=progress,
        **kw,
    )
