"""Scenario 10: instant start (issue 13). How long from starting ``swarm-worker --burst`` to its
first request, and where the time goes, against a stub endpoint in this process that records
when each route is first reached. Beside it, the floor any such worker pays: a bare interpreter,
and one that imports openai. Four and eight workers started at once show what a burst job's
start costs on this machine's cores."""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata

from aiohttp import web

from bench.harness import OUT, ROOT, Bench, free_ports
from bench.rows import Scenario
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts

__all__ = ["ROUTES", "startup_scenario"]

ROUTES = ("/health", "/v1/models", "/metrics", "/v1/completions")
TARGET_S = 0.5  # issue 13: a worker with a healthy endpoint sends its first request by then
READY_S = 1.0  # issue 34: a worker ready (first request sent) by then, alone and eight at once
AT_ONCE = (1, 4, 8)
# Each answer takes this long, so that the job lasts until the last of four workers starting
# at once has sent its first request too.
ANSWER_S = 0.05
PROMPTS_PER_WORKER = 2000


@dataclass
class Stub:
    """Instant OpenAI-compatible endpoints on ``ports`` that note when each route is first
    reached (seconds since ``t0``), per port."""

    ports: list[int]
    t0: float = 0.0
    first: dict[tuple[int, str], float] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    def reset(self) -> None:
        self.t0 = time.monotonic()
        self.first.clear()

    def _note(self, request: web.Request) -> None:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        self.first.setdefault((port, request.path), time.monotonic() - self.t0)

    async def _health(self, request: web.Request) -> web.Response:
        self._note(request)
        return web.Response()

    async def _models(self, request: web.Request) -> web.Response:
        self._note(request)
        model = {"id": "stub", "object": "model", "max_model_len": 4096}
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self._note(request)
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def _completions(self, request: web.Request) -> web.Response:
        self._note(request)
        await asyncio.sleep(ANSWER_S)
        prompts = (await request.json())["prompt"]
        choices = [{"index": i, "text": "ok", "finish_reason": "stop"} for i in range(len(prompts))]
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response(
            {
                "id": "c",
                "object": "text_completion",
                "model": "stub",
                "choices": choices,
                "usage": usage,
            }
        )

    async def start(self) -> Stub:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for port in self.ports:
            await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def _floor_s(code: str) -> float:
    """From starting ``python -c code`` to the end of ``code`` (its exit, which tears the
    modules down, left out: Linux's monotonic clock is one for every process)."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"{code}; import time; print(time.monotonic())",
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return float(out) - t0


async def _starts(bench: Bench, stub: Stub, workers: int, tag: str) -> dict[str, float]:
    """Start ``workers`` burst workers at once, each on its own stub port, with a job waiting;
    the latest of them to reach each route (NaN if one never did)."""
    prefix = f"start-{tag}"
    store = JobStore.from_settings(Settings(redis_url=bench.url, prefix=prefix))
    try:
        await enqueue_prompts(
            store,
            JobSpec(job="start", params=SamplingParams(max_tokens=4)),
            ((f"prompt {i}", None) for i in range(PROMPTS_PER_WORKER * workers)),
        )
    finally:
        await store.close()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    stub.reset()
    procs = []
    for i, port in enumerate(stub.ports[:workers]):
        env = {
            **base,
            "SWARM_REDIS_URL": bench.url,
            "SWARM_PREFIX": prefix,
            "SWARM_ENDPOINTS": f"http://127.0.0.1:{port}",
            "SWARM_WORKER_NAME": f"start-{i}",
        }
        with open(OUT / f"worker-{prefix}-{i}.log", "wb") as log:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "swarm_queue.worker.main",
                    "--burst",
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    await asyncio.gather(*(p.wait() for p in procs))
    out = {}
    for route in ROUTES:
        seen = [stub.first.get((port, route), math.nan) for port in stub.ports[:workers]]
        out[route] = math.nan if any(map(math.isnan, seen)) else max(seen)
    return out


async def startup_scenario(bench: Bench, repeats: int) -> Scenario:
    sc = Scenario(
        "start",
        "10. Start-up",
        "From starting `swarm-worker --burst` (one endpoint, a job already waiting) to its first "
        "request, against an instant stub endpoint that notes when each route is first reached. "
        f"Median of {repeats} starts, and the slowest. The floor beside it: a bare interpreter, "
        "one that only imports openai, and one that imports the worker's modules (each timed "
        "to the end of its imports, not its exit). With four or eight workers started at "
        "once, each time is the latest of them.",
    )
    OUT.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {}
    for code in ("pass", "import openai", "import swarm_queue.worker.app, swarm_queue.worker.main"):
        times[f"python -c '{code}'"] = [await _floor_s(code) for _ in range(repeats)]
    stub = await Stub(free_ports(max(AT_ONCE))).start()
    try:
        for workers in AT_ONCE:
            runs = [await _starts(bench, stub, workers, f"{workers}-{i}") for i in range(repeats)]
            who = "one worker" if workers == 1 else f"{workers} workers at once"
            for route in ROUTES:
                times[f"{who}: first `{route}`"] = [r[route] for r in runs]
    finally:
        await stub.stop()
    # (median, slowest) per line, for the report and the JSON
    sc.extra["seconds"] = {k: (statistics.median(v), max(v)) for k, v in times.items()}
    sc.extra["table"] = [
        "| what | median (s) | slowest (s) |",
        "| --- | ---: | ---: |",
        *(f"| {k} | {m:.3f} | {x:.3f} |" for k, (m, x) in sc.extra["seconds"].items()),
    ]
    first = sc.extra["seconds"]["one worker: first `/v1/completions`"][0]
    imports = sc.extra["seconds"][
        "python -c 'import swarm_queue.worker.app, swarm_queue.worker.main'"
    ][0]
    openai_s = sc.extra["seconds"]["python -c 'import openai'"][0]
    sc.note += (
        f" Of the one worker's {first:.2f} s, {imports:.2f} s is the floor of importing its "
        f"modules, {openai_s:.2f} s of it openai {metadata.version('openai')} alone; the rest, "
        f"{first - imports:.2f} s, is the worker's own start (medians of separate runs)."
    )
    sc.checks[f"one worker sends its first request within {TARGET_S} s (median)"] = (
        first <= TARGET_S
    )
    for workers in AT_ONCE[::2]:
        who = "one worker" if workers == 1 else f"{workers} workers at once"
        got = sc.extra["seconds"][f"{who}: first `/v1/completions`"][0]
        sc.checks[f"{who}: first request within {READY_S:g} s (median)"] = got <= READY_S
    return sc
