"""Small helpers shared by the in-process tests: a job spec and prompts, running an engine to
the end, collecting output lines, a throwaway HTTP server, and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgspec
from aiohttp import web

from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.output import follow_output, output_for, write_output
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine

__all__ = [
    "collect_lines",
    "gen_of",
    "prompts",
    "run_engine",
    "serve",
    "spec",
    "until",
    "wait_count",
    "wait_until",
]


def wait_until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def wait_count(what: str, count: Callable[[], int], at_least: int, stall_s: float = 120.0) -> int:
    """Poll ``count`` until it reaches ``at_least``; fail naming ``what`` only when it has not
    moved for ``stall_s``. A loaded machine is slow, not stuck: progress, not a fixed time
    limit, says whether to go on waiting. Returns the count reached."""
    seen, since = count(), time.monotonic()
    while seen < at_least:
        time.sleep(0.005)
        now = count()
        if now != seen:
            seen, since = now, time.monotonic()
        assert time.monotonic() - since < stall_s, (
            f"{what}: stuck at {seen} of {at_least} for {stall_s:g} s"
        )
    return seen


async def until(what: str, check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """In a test's own event loop: yield to its tasks until ``check`` holds; fail naming
    ``what`` after ``timeout_s``. (Yielding, not sleeping: what is awaited are tasks of this
    loop, so no time is assumed.)"""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():  # noqa: ASYNC110 - observing tasks of this loop
                await asyncio.sleep(0)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """A throwaway server for answers swarm-sim does not give: ``app`` on a free local port;
    yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def spec(job: str = "j", max_tokens: int = 16, model: str | None = None) -> JobSpec:
    """A job's spec with only what the in-process tests vary."""
    return JobSpec(job=job, params=SamplingParams(max_tokens=max_tokens), model=model)


def prompts(n: int, start: int = 0) -> Iterator[tuple[str, str | None]]:
    """Prompts ``start .. n-1`` as enqueue takes them: ``(prompt, custom_id)``."""
    return ((f"question {i}: what is {i} squared?", None) for i in range(start, n))


async def gen_of(store: JobStore, job: str = "j") -> str:
    """The generation of ``job`` as stored: what every write of its work carries."""
    return (await store.load_spec(job)).generation


async def collect_lines(store: JobStore, job: str, fmt: str = "jsonl") -> list[dict[str, Any]]:
    """The job's output lines as ``swarm-collect`` writes them (in format ``fmt``), decoded."""
    buf = io.BytesIO()
    await write_output(store, job, buf, fmt)
    return [msgspec.json.decode(line) for line in buf.getvalue().splitlines()]


async def assert_answered_in_order(
    store: JobStore, job: str, n: int, max_tokens: int, asked: int
) -> None:
    """``job``'s output holds :func:`prompts`' ``n`` answered in order, each as swarm-sim
    answers it in ``max_tokens`` tokens, and its endpoints were ``asked`` each prompt once."""
    lines = await collect_lines(store, job)
    assert [x["index"] for x in lines] == list(range(n))
    for x, (prompt, _) in zip(lines, prompts(n), strict=True):
        assert x["text"] == completion_for(prompt, max_tokens)[0], x["index"]
    assert asked == n  # each prompt sent once


async def output_lines(store: JobStore, job: str) -> list[Any]:
    """The job's lines as its kind makes them (a pipeline's chains...), as far as they are in."""
    output = await output_for(store, await store.load_spec(job))
    return [output.line(r) async for chunk in follow_output(output)(store, job) for r in chunk]


async def run_engine(settings: Settings, store: JobStore, urls: list[str]) -> Engine:
    """A worker engine on ``urls``, in this process, in burst mode: returns once it is done."""
    engine = Engine(settings, store, [EndpointClient(u) for u in urls])
    try:
        await engine.run(burst=True)
    finally:
        await engine.close()
    return engine
