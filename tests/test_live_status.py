"""Live per-endpoint figures: what each worker publishes for swarm-status while it runs, its last
word when it stops, and how the status view reads them (circuit states, silent workers)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from swarm_queue.common.fleet import EndpointStats
from swarm_queue.common.models import PromptItem
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.status import _job_status
from swarm_queue.common.vocab import FAILED_KIND_PREFIX, Meta
from swarm_queue.producer.status import format_endpoints, format_status
from swarm_queue.sim.server import SimFleet
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from tests.helpers import gen_of, prompts, serve, spec


@pytest.fixture
async def failing_later() -> AsyncIterator[str]:
    """An endpoint that is ready at first, then fails every request and its /health: its
    circuit opens and stays open."""
    broken = False

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if broken else 200)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]}, status=503 if broken else 200)

    async def completions(request: web.Request) -> web.Response:
        nonlocal broken
        broken = True
        return web.json_response({"error": {"message": "engine died"}}, status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    async with serve(app) as url:
        yield url


def _nothing_listening() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def _wait_for(
    store: JobStore, job: str, ready: Callable[[dict[str, EndpointStats]], bool]
) -> dict[str, EndpointStats]:
    """The job's published figures by endpoint, once ``ready`` holds of them (20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        figures = {st.endpoint: st for st in await store.read_endpoints(job)}
        if ready(figures):
            return figures
        assert time.monotonic() < deadline, f"figures never got there: {figures}"
        await asyncio.sleep(0.02)


async def test_workers_publish_each_endpoints_figures_and_a_last_word_when_done(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    failing_later: str,
) -> None:
    # Not sealed yet: the job stays live, whatever the figures, until the test seals it.
    await store.create_job(spec("live", max_tokens=8))
    await store.add_items(
        "live",
        [PromptItem(i, p) for i, (p, _) in enumerate(prompts(600))],
        gen=await gen_of(store, "live"),
    )
    await store.create_job(spec("idle"))  # served, never fed: still live when the worker stops
    dead = _nothing_listening()
    settings = make_settings(stats_period_s=0.05, batch_size=16, circuit_failures=2)
    async with sim_fleet(2) as fleet:
        urls = [*fleet.urls, failing_later, dead]
        engine = Engine(settings, store, [EndpointClient(u) for u in urls])
        task = asyncio.create_task(engine.run())
        try:
            live = await _wait_for(
                store,
                "live",
                lambda f: (
                    sum(st.done for st in f.values()) == 600
                    and failing_later in f
                    and f[failing_later].circuit == "open"
                ),
            )
            await store.seal(
                "live", 600, gen=await gen_of(store, "live")
            )  # now the job is over: each worker says so, once
            over = await _wait_for(
                store, "live", lambda f: {st.circuit for st in f.values()} == {"finished"}
            )
        finally:
            engine.request_stop()
            await task
            await engine.close()
    assert set(live) == set(urls)
    for url in fleet.urls:  # both simulated endpoints shared the work
        assert (live[url].circuit, live[url].failed, live[url].errors) == ("closed", 0, 0)
        assert live[url].done > 0 and live[url].rate_per_s > 0
        assert live[url].worker == "test" and live[url].window >= 1
    flaky = live[failing_later]
    assert flaky.done == 0 and flaky.errors >= 2
    assert flaky.last_error.startswith(f"{failing_later}: ")  # its batches went elsewhere
    assert (live[dead].circuit, live[dead].done) == ("waiting", 0)  # never answered /health
    assert live[dead].last_error.startswith(f"{dead}: ")

    assert {u: st.done for u, st in over.items()} == {u: st.done for u, st in live.items()}
    assert all(st.rate_per_s == 0 and st.in_flight == 0 for st in over.values())
    # The worker's exit changed nothing of a job it had left; the job it still served got
    # a "stopped" from every endpoint.
    assert {st.endpoint: st.circuit for st in await store.read_endpoints("live")} == {
        u: "finished" for u in urls
    }
    assert {st.circuit for st in await store.read_endpoints("idle")} == {"stopped"}

    text = format_status(await store.status("live"), None, list(over.values()), now=time.time())
    assert "  endpoints  4 finished" in text
    assert text.count(" finished ") == 4


async def test_figures_of_a_deleted_job_are_not_written_back(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    await store.create_job(spec("gone"))
    await store.delete_job("gone")
    row = EndpointStats(endpoint="http://n:1", worker="w", circuit="stopped")
    await store.publish_endpoints({"gone": {"w|http://n:1": row}})
    assert await store.redis.exists(store.keys.endpoints("gone")) == 0


def test_the_endpoint_table_names_states_flags_silent_workers_and_shows_errors() -> None:
    now = 1_000_000.0

    def row(node: int, circuit: str, age_s: float, **figures: Any) -> EndpointStats:
        return EndpointStats(
            endpoint=f"http://node{node}:8000",
            worker=f"node{node}",
            circuit=circuit,
            updated_s=now - age_s,
            period_s=2.0,
            **figures,
        )

    error = "http://node2:8000: HTTP 404: model 'x' not found"
    rows = [
        row(1, "closed", 1, done=1200, rate_per_s=95.25, window=12, in_flight=7),
        row(2, "broken", 2, errors=1, last_error=error),
        row(3, "closed", 30, done=80),  # no word for 15 periods: its worker is gone
        row(4, "finished", 3600, done=5),  # a last word is never silent, however old
    ]
    lines = format_endpoints(rows, now)
    assert lines[0] == "  endpoints  1 broken, 1 closed, 1 finished, 1 silent"
    assert lines[1].split() == [
        "endpoint",
        "worker",
        "circuit",
        "done",
        "failed",
        "errors",
        "rate/s",
        "in",
        "flight",
        "seen",
    ]
    assert lines[2].split() == [
        "http://node1:8000",
        "node1",
        "closed",
        "1200",
        "0",
        "0",
        "95.2",
        "7/12",
        "1",
        "s",
        "ago",
    ]
    assert lines[3].split()[:3] == ["http://node2:8000", "node2", "broken"]
    assert lines[4] == "      last error: http://node2:8000: HTTP 404: model 'x' not found"
    assert lines[5].split()[:4] == ["http://node3:8000", "node3", "silent", "80"]
    assert lines[5].split()[-4:] == ["-", "30", "s", "ago"]
    assert lines[6].split()[:4] == ["http://node4:8000", "node4", "finished", "5"]
    assert len(lines) == 7
    assert format_endpoints([], now) == ["  endpoints  none reporting yet"]


def test_status_figures_say_no_eta_without_a_worker_and_leave_cancellations_out_of_the_rate() -> (
    None
):
    """Seen: a rate and an ETA with no worker alive, cancellations counted in the rate, and
    dead workers flagged silent on a finished job."""
    now = 1_000_000.0
    meta = {
        Meta.DONE: "100",
        Meta.FAILED: "900",
        FAILED_KIND_PREFIX + "cancelled": "880",
        FAILED_KIND_PREFIX + "rejected": "20",
        Meta.ENQUEUED: "2000",
        Meta.TOTAL: "2000",
        Meta.FIRST_RESULT_S: str(now - 10),
    }
    running = _job_status("j", meta, 0, now)
    assert running.rate_per_s == 12.0  # 100 done + 20 rejected in 10 s: not the 880 cancelled

    def row(circuit: str, age_s: float) -> EndpointStats:
        return EndpointStats(endpoint="http://n:1", worker="w", circuit=circuit,
                             updated_s=now - age_s, period_s=2.0, done=100)  # fmt: skip

    alive = format_status(running, None, [row("closed", 1)], now=now)
    assert "  rate       12.0 prompts/s   eta 83 s" in alive
    dead = format_status(running, None, [row("closed", 600)], now=now)
    assert "  rate       12.0 prompts/s (while it was served: no worker serves it now)" in dead
    assert "eta" not in dead and " silent " in dead
    finished = _job_status("j", {**meta, Meta.FINISHED_S: str(now - 5)}, 0, now)
    over = format_status(finished, None, [row("closed", 600)], now=now)
    assert " silent " not in over and "  endpoints  1 gone" in over
