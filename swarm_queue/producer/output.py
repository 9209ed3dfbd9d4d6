"""A job's output, whatever kind of job it is, in any format: which kind it is
(:func:`output_for`: a workflow's own, or a plain job's), its rows followed in input order as
they end (:func:`follow_output`), and written durably into a path (:func:`collect_output`) or
as lines to a stream (:func:`write_output`). The one path every collector takes
(``swarm-collect``, the Python API, the gateway, the benchmarks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import CollectReport, JobOutput
from swarm_queue.common.store import CollectorStore, JobStatus
from swarm_queue.flows.registry import output_of
from swarm_queue.flows.steps import later_steps
from swarm_queue.producer.formats import format_for
from swarm_queue.producer.outfile import collect_rows_durably
from swarm_queue.producer.plain import PlainOutput
from swarm_queue.producer.stream import (
    JOB_APPEAR_S,
    collect_into,
    follow_rows,
    wait_for_spec,
)

__all__ = ["collect_output", "follow_output", "output_for", "write_output"]


async def output_for(store: CollectorStore, spec: JobSpec) -> JobOutput[Any]:
    """The output of the job of ``spec``: its workflow's kind (with its later steps' specs),
    or a plain job's."""
    kind = output_of(spec)
    if kind is None:
        return PlainOutput([spec])
    return kind([spec, *await later_steps(store, spec)])  # type: ignore[arg-type]


def follow_output(output: JobOutput[Any]) -> Callable[..., AsyncIterator[list[Any]]]:
    """The rows of ``output``'s job as :func:`producer.stream.follow_rows` gives a job's: in
    input order, a chunk at a time as every input up to it has ended (without ``wait``: what
    has ended, the rest on the next run)."""

    async def rows(
        store: CollectorStore,
        job: str,
        *,
        start: int = 0,
        wait: bool = False,
        poll_s: float = 0.2,
        on_status: Callable[[JobStatus, int], None] | None = None,
    ) -> AsyncIterator[list[Any]]:
        chunks = follow_rows(
            store, job, output.read, start=start, wait=wait, poll_s=poll_s, on_status=on_status
        )
        async for chunk in chunks:
            while True:
                await output.advance(store, chunk)
                ready = next((i for i, r in enumerate(chunk) if not output.ended(r)), len(chunk))
                if ready == len(chunk):
                    yield chunk
                    break
                if not wait:
                    if ready:
                        yield chunk[:ready]
                    return
                await asyncio.sleep(poll_s)

    return rows


async def collect_output(
    store: CollectorStore,
    job: str,
    path: str,
    fmt: str = "jsonl",
    *,
    wait: bool,
    progress: bool,
    evict: bool = False,
    appear_s: float = JOB_APPEAR_S,
) -> CollectReport:
    """Collect ``job`` into ``path`` in format ``fmt``, one row per input in input order,
    durably (see :func:`producer.outfile.collect_rows_durably`: the lock, the cursor, resuming,
    ``evict``)."""
    spec = await wait_for_spec(store, job, wait=wait, appear_s=appear_s)
    output = await output_for(store, spec)
    form = format_for(fmt, output)
    return await collect_rows_durably(
        store,
        job,
        path,
        lambda p, _spec: form.sink(p, output),
        rows=follow_output(output),
        ok=output.ok,
        model_of=output.model_of,
        wait=wait,
        progress=progress,
        evict=evict,
        results=output.refreshable,
    )


async def write_output(
    store: CollectorStore,
    job: str,
    out: BinaryIO,
    fmt: str = "jsonl",
    *,
    wait: bool = False,
    poll_s: float = 0.2,
    progress: bool = False,
    appear_s: float = JOB_APPEAR_S,
    on_commit: Callable[[int], Awaitable[None]] | None = None,
) -> CollectReport:
    """Write ``job`` to the stream ``out`` as lines of ``fmt`` (a format of lines), in input
    order, from its first input (nothing durable: a rerun writes it all again).
    ``on_commit(index)`` is called after each chunk is written and flushed, with the number
    of lines now out."""
    spec = await wait_for_spec(store, job, wait=wait, appear_s=appear_s)
    output = await output_for(store, spec)
    form = format_for(fmt, output)
    if form.line is None:
        kind = "directory" if form.what == "DIR" else "file"
        raise ConfigError(f"--format {fmt} writes a {kind}: give --out {form.what}, not -")
    encode = form.line(output)

    async def put(chunk: list[Any], cursor: int) -> None:
        out.write(b"".join(encode(r) for r in chunk))
        out.flush()
        if on_commit is not None:
            await on_commit(cursor)

    return await collect_into(
        store,
        job,
        put,
        rows=follow_output(output),
        ok=output.ok,
        model_of=output.model_of,
        wait=wait,
        poll_s=poll_s,
        progress=progress,
    )
