"""``swarm-status --serve``: the board read from a real Redis, its throughput history, the
server's guard, and the page itself in a real headless Chromium during a job."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from swarm_queue.common.embedded import free_port
from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.fleet import EndpointInfo, EndpointStats
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.models import PromptItem, Result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents.spec import AgentSpec, agent_prompts, build_agents, enqueue_agents
from swarm_queue.producer.dashboard import Dashboard
from swarm_queue.producer.overview import (
    AgentCounts,
    EndpointRow,
    History,
    JobRow,
    Overview,
    read_overview,
)
from tests.browser import CHROMIUM, Browser
from tests.harness import (
    AGENT_TASK,
    BIN,
    TOOL_PARSER_ARGS,
    FleetFactory,
    command,
    tool_runner,
    wrong_key_endpoint,
)
from tests.helpers import gen_of, prompts, spec
from tests.servers import redis_server


def _board(t: float, jobs: dict[str, int], rates: dict[str, float]) -> Overview:
    return Overview(
        generated_s=t,
        redis="redis://x",
        prefix="p",
        jobs=[JobRow(job=j, state="running", total=1000, done=n) for j, n in jobs.items()],
        endpoints=[
            EndpointRow(endpoint=e, worker="w", circuit="closed", rate_per_s=r)
            for e, r in rates.items()
        ],
    )


def test_history_gives_a_recent_rate_an_eta_and_each_endpoints_chart() -> None:
    h = History(keep_s=100.0, points=3)
    h.add(_board(0.0, {"a": 0}, {"e1": 1.0}))
    h.add(_board(10.0, {"a": 100}, {"e1": 5.0}))
    board = h.add(_board(20.0, {"a": 300}, {"e1": 10.0, "e2": 4.0}))
    job = board.jobs[0]
    assert job.recent_rate_per_s == pytest.approx(15.0)  # 300 in the last 20 s
    assert job.eta_s == pytest.approx(700 / 15.0)
    assert board.times == [20.0, 10.0, 0.0]
    assert board.endpoints[0].throughput == [1.0, 5.0, 10.0]
    assert board.endpoints[1].throughput == [0.0, 0.0, 4.0]  # new: nothing before
    # swarm-retry took the count back: the rate is 0, never negative, and no ETA is made up.
    back = History()
    back.add(_board(0.0, {"a": 500}, {}))
    retried = back.add(_board(10.0, {"a": 200}, {})).jobs[0]
    assert (retried.recent_rate_per_s, retried.eta_s) == (0.0, None)
    # Samples older than keep_s are dropped; at most ``points`` are drawn, the newest last.
    for t in range(40, 200, 10):
        board = h.add(_board(float(t), {"a": t * 2}, {"e1": float(t)}))
    assert h.samples[0][0] >= 90.0
    assert len(board.times) <= 3 and board.times[-1] == 0.0
    assert board.endpoints[0].throughput[-1] == 190.0


async def test_the_board_shows_every_job_and_sums_each_endpoint_over_live_jobs(
    store: JobStore, settings: Settings
) -> None:
    now = time.time()
    await store.create_job(spec("live"))
    await store.add_items(
        "live",
        [PromptItem(i, p) for i, (p, _) in enumerate(prompts(10))],
        gen=await gen_of(store, "live"),
    )
    await store.seal("live", 10, gen=await gen_of(store, "live"))
    got = await store.read_new("live", "c", 4)
    await store.commit(
        "live",
        [
            (got[0][0], Result(index=0, text="a"), None),
            (got[1][0], Result(index=1, error="too long", error_kind="rejected"), None),
        ],
        gen=await gen_of(store, "live"),
    )
    await store.create_job(spec("elsewhere", model="nobody-serves-this"))
    await store.create_job(spec("gone"))
    await store.cancel("gone")
    await store.redis.sadd(store.keys.jobs, "broken")
    await store.redis.hset(store.keys.meta("broken"), "spec", b"\xc1 not msgpack")
    await store.publish_fleet(
        [
            EndpointInfo(
                endpoint="http://a:8000",
                worker="w1",
                models=("m",),
                circuit="closed",
                updated_s=now,
                period_s=2.0,
            ),
            EndpointInfo(
                endpoint="http://b:8000",
                worker="w1",
                models=("m",),
                circuit="open",
                updated_s=now - 60,
                period_s=2.0,
            ),
        ]
    )
    figures = {
        "w1|a": EndpointStats(
            endpoint="http://a:8000",
            worker="w1",
            circuit="closed",
            done=7,
            failed=1,
            errors=3,
            window=4,
            in_flight=2,
            rate_per_s=1.5,
            updated_s=now,
        ),
    }
    await store.publish_endpoints({"live": figures, "gone": figures})

    board = await read_overview(store, "redis://:s3cret@127.0.0.1:6379/0", now=now)
    assert "s3cret" not in board.redis
    jobs = {j.job: j for j in board.jobs}
    assert list(jobs) == ["broken", "elsewhere", "gone", "live"]
    assert jobs["broken"].state == "unreadable" and jobs["broken"].error
    assert jobs["elsewhere"].state == "waiting"
    assert "nobody-serves-this" in (jobs["elsewhere"].waiting or "")
    assert jobs["gone"].state == "cancelled"
    live = jobs["live"]
    assert (live.state, live.total, live.done, live.failed) == ("running", 10, 1, 1)
    assert (live.in_flight, live.pending, live.failed_by_kind) == (2, 6, {"rejected": 1})
    a, b = board.endpoints
    # Only the live job's figures count; the cancelled job's copy of them does not.
    assert (a.endpoint, a.circuit, a.done, a.failed, a.errors, a.window) == (
        "http://a:8000",
        "closed",
        7,
        1,
        3,
        4,
    )
    assert (b.endpoint, b.circuit, b.done) == ("http://b:8000", "silent", 0)


async def _agents_under_way(store: JobStore) -> None:
    """An agent job of five agents: two waiting for a tool, one done, two thinking; and the
    tool calls this Redis ran and shared."""
    specs, _ = build_agents("ag", JobOptions(max_tokens=8), AgentSpec(max_turns=2), [], source="t")
    await enqueue_agents(store, specs, agent_prompts("task {n}", [{"n": i} for i in range(5)]))
    gen = (await store.load_spec("ag")).generation
    await store.record_outcomes(
        "ag", gen=gen, waits={0: b"calls", 1: b"calls"}, results={4: b"result"}
    )
    await store.count_tools("runs", 3)
    await store.count_tools("shared", 7)


async def test_the_board_shows_an_agent_jobs_agents_by_state_and_the_tool_calls(
    store: JobStore,
) -> None:
    await _agents_under_way(store)
    await enqueue_prompts(store, spec("plain"), prompts(3))
    board = await read_overview(store, "redis://127.0.0.1:6379/0")
    jobs = {j.job: j for j in board.jobs}
    assert jobs["ag"].agents == AgentCounts(thinking=2, waiting=2, done=1)
    assert jobs["plain"].agents is None
    assert (board.tool_calls["runs"], board.tool_calls["shared"]) == (3, 7)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
async def test_the_page_shows_agents_by_state_and_the_tool_calls(
    store: JobStore, tmp_path: Path
) -> None:
    await _agents_under_way(store)
    dash = Dashboard(store, "redis://127.0.0.1:6379/0", 1.0)
    assert await dash.step()
    # Sampling as the command does: a board one read old is stale after 5 s, and a loaded
    # machine's browser took longer than that to ask for it (the page then showed no job).
    stop = asyncio.Event()
    sampling = asyncio.create_task(dash.run(stop))
    server = TestServer(dash.app(local_only=True), host="127.0.0.1")
    await server.start_server()
    try:
        async with Browser(tmp_path) as browser:
            await browser.goto(str(server.make_url("/")))
            await browser.wait_for("document.querySelector('#jobs tr[data-job=\"ag\"]') !== null")
            agents = await browser.evaluate(
                "document.querySelector('#jobs tr[data-job=\"ag\"] td[data-k=agents]').textContent"
            )
            tools = await browser.evaluate("document.getElementById('tools').textContent")
    finally:
        stop.set()
        await sampling
        await server.close()
    assert agents == "2 thinking, 2 waiting for a tool, 1 done"
    assert tools == "tool calls (all jobs): 3 run, 7 answered by a run already made or under way"


async def test_the_server_answers_localhost_only_and_never_shows_the_password(
    store: JobStore,
) -> None:
    dash = Dashboard(store, "redis://user:hunter2@127.0.0.1:6379/0?password=hunter2", 1.0)
    assert await dash.step()
    async with TestClient(TestServer(dash.app(local_only=True))) as client:
        page = await client.get("/")
        assert page.status == 200 and "swarm-queue" in await page.text()
        assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        data = await client.get("/api/board")
        text = await data.text()
        assert data.status == 200 and "hunter2" not in text and '"jobs"' in text
        rebound = await client.get("/api/board", headers={"Host": "attacker.example:8080"})
        assert rebound.status == 421
        assert (await client.get("/dashboard.js")).status == 200


def _figures(browser_rows: list[dict[str, str]], key: str) -> dict[str, dict[str, str]]:
    return {row[key]: row for row in browser_rows}


_READ_JOBS = """JSON.stringify([...document.querySelectorAll('#jobs tr[data-job]')].map(r =>
  Object.fromEntries([['job', r.dataset.job],
    ...[...r.querySelectorAll('td[data-k]')].map(td => [td.dataset.k, td.textContent])])))"""
_READ_ENDPOINTS = """JSON.stringify([...document.querySelectorAll('#endpoints tr[data-endpoint]')]
  .map(r => Object.fromEntries([['endpoint', r.dataset.endpoint],
    ...[...r.querySelectorAll('td[data-k]')].map(td => [td.dataset.k, td.textContent])])))"""


# Whether job %s's steps-or-agents cell matches the JavaScript regex %s.
_CELL_MATCHES = (
    "(() => { const c = document.querySelector('#jobs tr[data-job=\"%s\"] td[data-k=agents]');"
    " return c && %s.test(c.textContent) })()"
)


def _n(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it): "
    "the dashboard's browser test needs a real browser",
)
async def test_the_dashboard_in_chromium_shows_the_figures_redis_holds_during_a_job(
    fleet_factory: FleetFactory, store: JobStore, tmp_path: Path, redis_url: str, prefix: str
) -> None:
    fleet = fleet_factory(2, "--step-ms", "20")
    poison = {3, 50, 77}
    worker = fleet.worker("w1", [0, 1], burst=False)
    first = fleet.enqueue("first", 200, poison)
    assert await asyncio.to_thread(first.wait, 60) == 0
    deadline = time.monotonic() + 60
    while fleet.done("first") < 200:
        assert time.monotonic() < deadline, "the first job never finished"
        await asyncio.sleep(0.05)
    big = fleet.enqueue("big", 20_000, set())
    assert await asyncio.to_thread(big.wait, 60) == 0
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        BIN / "swarm-status",
        "--serve",
        str(port),
        "--every",
        "0.3",
        env=fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 60)).decode()
        assert line.strip() == (
            f"swarm-status: dashboard on http://127.0.0.1:{port}/ (Ctrl-C stops it)"
        )
        async with Browser(tmp_path) as browser:
            await browser.goto(f"http://127.0.0.1:{port}/")
            # The job under way, and the throughput chart drawn from at least two samples.
            await browser.wait_for(
                '(() => { const r = document.querySelector(\'#jobs tr[data-job="big"] '
                "td[data-k=done]'); return r && Number(r.textContent.replace(/,/g, '')) > 0 })()"
            )
            await browser.wait_for("document.querySelector('#total polyline') !== null")
            # Both endpoints published, with answers for the job (every 2 s, the first 2 s
            # after the worker started).
            await browser.wait_for(
                "[...document.querySelectorAll('#endpoints tr[data-endpoint] td[data-k=done]')]"
                ".filter(td => Number(td.textContent.replace(/,/g, '')) > 0).length == 2"
            )
            # Freeze the job mid-way: with its worker stopped, Redis holds still, and the
            # page's next board must show exactly what Redis holds.
            worker.send_signal(signal.SIGSTOP)
            stopped = time.time()
            await browser.wait_for(f"Number(document.body.dataset.updated) > {stopped + 0.5}")
            # Seen: the tables overflowed the page at 1,400 px; a wide one scrolls in its box.
            assert await browser.evaluate(
                "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            )
            jobs = _figures(json.loads(await browser.evaluate(_READ_JOBS)), "job")
            endpoints = _figures(json.loads(await browser.evaluate(_READ_ENDPOINTS)), "endpoint")
            shot = tmp_path / "dashboard.png"
            await browser.screenshot(shot)
        # Still frozen: what Redis holds now is what that board read.
        running = await store.status("big")
        done = await store.status("first")
        stats = {st.endpoint: st for st in await store.read_endpoints("big")}
        fleet_rows = {info.endpoint: info for info in await store.read_fleet()}
        worker.send_signal(signal.SIGCONT)
    finally:
        server.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(server.wait(), 30) == 130  # interrupted, as the CLI says

    assert 0 < running.done < 20_000, "the job was not under way"
    row = jobs["big"]
    assert row["state"] == "running"
    assert (_n(row["done"]), _n(row["failed"]), _n(row["total"])) == (
        running.done,
        running.failed,
        20_000,
    )
    assert (_n(row["in_flight"]), _n(row["pending"])) == (running.in_flight, running.pending)
    row = jobs["first"]
    assert row["state"] == "finished"
    assert (_n(row["done"]), _n(row["failed"])) == (200 - len(poison), len(poison))
    assert (
        row["failed_by_kind"]
        == ", ".join(f"{k} {n}" for k, n in done.failed_by_kind.items())
        == f"rejected {len(poison)}"
    )
    assert set(endpoints) == {fleet.url(0), fleet.url(1)}
    for url, shown in endpoints.items():
        st = stats[url]
        assert shown["circuit"] == fleet_rows[url].circuit == "closed"
        assert (_n(shown["done"]), _n(shown["failed"]), _n(shown["window"])) == (
            st.done,
            st.failed,
            st.window,
        )
    assert sum(_n(e["done"]) for e in endpoints.values()) > 0
    png = await asyncio.to_thread(shot.read_bytes)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    if target := os.environ.get("SWARM_DASHBOARD_PNG"):  # how docs/img/dashboard.png is made
        await asyncio.to_thread(Path(target).write_bytes, png)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_stops_the_dashboard_at_once_with_a_request_half_sent(
    cli_env: dict[str, str], sig: signal.Signals
) -> None:
    """Ctrl-C, or a scheduler's SIGTERM, ends it as an interrupted command (130), with a
    browser's connection left open mid-request."""
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        BIN / "swarm-status",
        "--serve",
        str(port),
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None and server.stderr is not None
        assert b"dashboard on" in await asyncio.wait_for(server.stdout.readline(), 60)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /api/board HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9\r\n\r\nx")
        await writer.drain()
        server.send_signal(sig)
        assert await asyncio.wait_for(server.wait(), 15) == 130
        assert (await server.stderr.read()).decode().strip() == "swarm-status: interrupted"
        writer.close()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()


async def test_redis_out_of_reach_is_shown_on_the_page_not_a_crash(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    store = JobStore.from_settings(settings, patient=False)
    try:
        dash = Dashboard(store, settings.redis_url, 1.0)
        assert not await dash.step()
        board = json.loads(dash.body)
        assert board["error"] and board["jobs"] == []
    finally:
        await store.close()


async def test_a_redis_lost_shows_no_figure_it_cannot_vouch_for(
    make_settings: Callable[..., Settings],
) -> None:
    with redis_server() as server:
        settings = make_settings(redis_url=server.url)
        store = JobStore.from_settings(settings, patient=False)
        try:
            await enqueue_prompts(store, spec("shown"), prompts(5))
            dash = Dashboard(store, settings.redis_url, 1.0)
            assert await dash.step()
            read_at = json.loads(dash.body)["generated_s"]
            assert [j["job"] for j in json.loads(dash.body)["jobs"]] == ["shown"]
            server.stop()
            assert not await dash.step()
            board = json.loads(dash.body)
            # No figure from before (on the code before, the last jobs stayed on the page)...
            assert board["jobs"] == [] and board["endpoints"] == []
            # ... the reason, and when Redis was last read.
            assert "unavailable" in board["error"] and board["generated_s"] == read_at
        finally:
            await store.close()


async def test_a_read_hung_on_a_redis_gone_away_shows_no_figure_either(
    make_settings: Callable[..., Settings],
) -> None:
    """Seen: the JSON kept the last figures with ``error: null`` 6 s after Redis was killed:
    the dashboard's client waits minutes for a Redis to come back, and its read hung."""
    with redis_server() as server:
        settings = make_settings(redis_url=server.url)
        store = JobStore.from_settings(settings)  # patient, as swarm-status --serve's is
        try:
            await enqueue_prompts(store, spec("shown"), prompts(5))
            dash = Dashboard(store, settings.redis_url, 1.0)
            assert await dash.step()
            server.stop()
            hung = asyncio.create_task(dash.step())  # waits for Redis to come back
            assert [j["job"] for j in json.loads(dash.current())["jobs"]] == ["shown"]
            dash.read_at -= 10  # ten seconds on: the read has hung past three periods
            board = json.loads(dash.current())
            assert board["jobs"] == [] and board["endpoints"] == []
            assert board["error"] == "Redis has not answered for 10 s (still trying)"
            hung.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hung
        finally:
            await store.close()


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it): "
    "the dashboard's browser test needs a real browser",
)
async def test_the_dashboard_shows_a_pipeline_an_agent_job_and_a_failing_endpoint(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """The workflows as a user watches them in a browser: a pipeline's steps, an agent job's
    agents by state, and an endpoint that refuses the worker's key, with its error. The
    docs/OPERATIONS.md's second screenshot is this page (``SWARM_DASHBOARD_WORKFLOWS_PNG=PATH``)."""
    fleet = fleet_factory(2, *TOOL_PARSER_ARGS, "--step-ms", "30")
    env = fleet.env
    (tmp_path / "check.txt").write_text("Check this answer: {answer}")
    (tmp_path / "task.txt").write_text(AGENT_TASK)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(300)))
    assert (
        await asyncio.to_thread(
            fleet.enqueue("study", 3000, set(), "--then", str(tmp_path / "check.txt")).wait, 60
        )
        == 0
    )
    agents = await asyncio.to_thread(
        command, env, "swarm-enqueue", tmp_path / "in.jsonl", "--job", "papers", "--task",
        tmp_path / "task.txt", "--tools", "slow_add,fetch", "--max-turns", "3",
    )  # fmt: skip
    assert agents.returncode == 0, agents.stderr
    log = tmp_path / "runs.log"
    log.touch()
    runner = tool_runner(env, log, tmp_path / "runner.log")
    port = free_port()
    with wrong_key_endpoint() as locked:
        worker = fleet.worker(
            "node1", [0, 1], burst=False, SWARM_ENDPOINTS=f"{fleet.url(0)},{fleet.url(1)},{locked}"
        )
        server = await asyncio.create_subprocess_exec(
            BIN / "swarm-status", "--serve", str(port), "--every", "0.5",
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            assert b"dashboard on" in await asyncio.wait_for(server.stdout.readline(), 60)
            async with Browser(tmp_path, width=1500, height=1000) as browser:
                await browser.goto(f"http://127.0.0.1:{port}/")
                # Bounds against a hang only: a loaded machine takes its time over the turns.
                await browser.wait_for(
                    _CELL_MATCHES % ("papers", r"/[1-9][0-9,]* done/"), timeout_s=600
                )
                await browser.wait_for(
                    _CELL_MATCHES % ("study", r"/^step 1: [1-9]/"), timeout_s=600
                )
                await browser.wait_for(
                    "[...document.querySelectorAll('#endpoints tr[data-endpoint] "
                    "td[data-k=circuit]')].some(td => td.textContent == 'broken')",
                    timeout_s=600,
                )
                await browser.wait_for(
                    '(() => { const d = document.querySelector(\'#jobs tr[data-job="study"] '
                    "td[data-k=done]'); return d && Number(d.textContent.replace(/,/g, '')) > 0 "
                    "})()"
                )
                jobs = _figures(json.loads(await browser.evaluate(_READ_JOBS)), "job")
                endpoints = _figures(
                    json.loads(await browser.evaluate(_READ_ENDPOINTS)), "endpoint"
                )
                shot = tmp_path / "workflows.png"
                await browser.screenshot(shot)
        finally:
            server.send_signal(signal.SIGINT)
            await asyncio.wait_for(server.wait(), 30)
            worker.terminate()
            await asyncio.to_thread(worker.wait, 60)
            runner.terminate()
            await asyncio.to_thread(runner.wait, 30)
    assert {"study", "papers"} <= set(jobs)
    agents_cell = jobs["papers"]["agents"]
    assert re.fullmatch(r"\d+ thinking, \d+ waiting for a tool, [1-9]\d* done", agents_cell)
    assert re.fullmatch(r"step 1: [\d,]+/(3,000|\?)", jobs["study"]["agents"])
    # No ETA of a workflow from its first step's figures (seen: "eta 0 s", 108 thinking).
    assert (jobs["papers"]["eta"], jobs["study"]["eta"]) == ("-", "-")
    assert endpoints[locked]["circuit"] == "broken"
    assert {endpoints[fleet.url(0)]["circuit"], endpoints[fleet.url(1)]["circuit"]} <= {
        "closed", "waiting",
    }  # fmt: skip
    png = await asyncio.to_thread(shot.read_bytes)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    if target := os.environ.get("SWARM_DASHBOARD_WORKFLOWS_PNG"):
        await asyncio.to_thread(Path(target).write_bytes, png)
