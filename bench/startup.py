"""Scenario 10: instant start (issue 13). How long from starting ``swarm-worker --burst`` to its
first request, and where the time goes, against a stub endpoint in this process that records
when each route is first reached. Beside it, the floor any such worker pays: a bare interpreter,
one that imports the third-party packages the worker needs, and one that imports the worker.
Four and eight workers started at once show what a burst job's start costs on this machine's
cores. The checkout's modules are compiled to bytecode first, as ``pip install`` and any run
of Python leave them (this machine's ``PYTHONDONTWRITEBYTECODE`` would otherwise have every
start compile them again: 0.26 s of it)."""

from __future__ import annotations

import asyncio
import compileall
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
# The floors: what the worker imports of others, and all it imports.
THIRD_PARTY = "import asyncio, aiohttp, redis.asyncio, arq, msgspec"
WORKER = "import swarm_queue.worker.app, swarm_queue.worker.main"
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
        try:
            prompts = (await request.json())["prompt"]
        except ConnectionResetError:  # a burst worker that was done went away meanwhile
            return web.Response(status=499)
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


def _compile(root: Path) -> None:
    """Compile the checkout at ``root`` to bytecode, as an installed package is."""
    for package in ("common", "worker", "flows", "producer", "sim", "swarm_queue"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


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


async def _starts(
    bench: Bench,
    stub: Stub,
    workers: int,
    tag: str,
    *,
    one_process: bool = False,
    root: Path = ROOT,
) -> dict[str, float]:
    """Start ``workers`` burst workers at once, each on its own stub port, with a job waiting
    (``one_process``: one worker process with all of those endpoints, as a node of several
    engines runs it), the worker's code from the checkout at ``root``; the latest of them to
    reach each route (NaN if one never did)."""
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
    base["PYTHONPATH"] = str(root)
    stub.reset()
    urls = [f"http://127.0.0.1:{port}" for port in stub.ports[:workers]]
    groups = [",".join(urls)] if one_process else urls
    procs = []
    for i, endpoints in enumerate(groups):
        env = {
            **base,
            "SWARM_REDIS_URL": bench.url,
            "SWARM_PREFIX": prefix,
            "SWARM_ENDPOINTS": endpoints,
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
                    cwd=root,
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
        "one that imports only the third-party packages the worker uses, and one that imports "
        "the worker's modules (each timed to the end of its imports, not its exit). With four "
        "or eight workers started at once, each time is the latest of them. The checkout is "
        "compiled to bytecode first, as an installed package is.",
    )
    OUT.mkdir(parents=True, exist_ok=True)
    _compile(ROOT)
    times: dict[str, list[float]] = {}
    for code in ("pass", THIRD_PARTY, WORKER):
        times[f"python -c '{code}'"] = [await _floor_s(code) for _ in range(repeats)]
    stub = await Stub(free_ports(max(AT_ONCE))).start()
    try:
        for workers in AT_ONCE:
            runs = [await _starts(bench, stub, workers, f"{workers}-{i}") for i in range(repeats)]
            who = "one worker" if workers == 1 else f"{workers} workers at once"
            for route in ROUTES:
                times[f"{who}: first `{route}`"] = [r[route] for r in runs]
        workers = max(AT_ONCE)
        runs = [
            await _starts(bench, stub, workers, f"one-{i}", one_process=True)
            for i in range(repeats)
        ]
        times[f"{workers} endpoints in one worker process: first `/v1/completions`"] = [
            r["/v1/completions"] for r in runs
        ]
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
    imports = sc.extra["seconds"][f"python -c '{WORKER}'"][0]
    third = sc.extra["seconds"][f"python -c '{THIRD_PARTY}'"][0]
    sc.note += (
        f" Of the one worker's {first:.2f} s, {imports:.2f} s is the floor of importing its "
        f"modules, {third:.2f} s of it the third-party packages; the rest, "
        f"{first - imports:.2f} s, is the worker's own start (medians of separate runs)."
    )
    sc.checks[f"one worker sends its first request within {TARGET_S} s (median)"] = (
        first <= TARGET_S
    )
    for workers in AT_ONCE[::2]:
        who = "one worker" if workers == 1 else f"{workers} workers at once"
        got = sc.extra["seconds"][f"{who}: first `/v1/completions`"][0]
        sc.checks[f"{who}: first request within {READY_S:g} s (median)"] = got <= READY_S
    workers = max(AT_ONCE)
    got = sc.extra["seconds"][
        f"{workers} endpoints in one worker process: first `/v1/completions`"
    ][0]
    sc.checks[
        f"{workers} endpoints in one worker process: each sent a request within "
        f"{READY_S:g} s (median)"
    ] = got <= READY_S
    sc.note += (
        f" {workers} processes at once share this machine's {os.cpu_count()} cores: each pays "
        f"its imports, {imports:.2f} s of CPU, before it can send."
    )
    return sc


async def _versus(before: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """First requests of one worker and of eight at once, by this checkout and by the one at
    ``before``, in alternating rounds."""
    OUT.mkdir(parents=True, exist_ok=True)
    _compile(ROOT)
    _compile(before)
    sides = {"before": before, "after": ROOT}
    got: dict[str, dict[str, list[float]]] = {}
    with Bench() as bench:
        stub = await Stub(free_ports(max(AT_ONCE))).start()
        try:
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for workers in (1, max(AT_ONCE)):
                    for side in order:
                        first = await _starts(
                            bench, stub, workers, f"v{r}-{workers}-{side}", root=sides[side]
                        )
                        got.setdefault(f"{workers}", {}).setdefault(side, []).append(
                            first["/v1/completions"]
                        )
                print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
        finally:
            await stub.stop()
    return got


TITLE = "## 10. Start-up: before and after"


def main(argv: list[str] | None = None) -> None:
    import argparse

    from bench.versus import publish, worktree

    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, metavar="REV", help="the revision compared with")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    with worktree(args.before) as before:
        got = asyncio.run(_versus(before, args.rounds))
    lines = [
        f"{TITLE}\n",
        "From starting `swarm-worker --burst` to its first `/v1/completions` request (the "
        "latest of those started at once), the worker's code from this checkout and from "
        f"{args.before}, in {args.rounds} alternating rounds; medians. Measured with "
        f"`python -m bench.startup --before {args.before} --rounds {args.rounds}`.\n",
        "| workers started at once | before (s) | after (s) | after / before | every round, "
        "before | after |",
        "| ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for workers, sides in got.items():
        b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
        every = [", ".join(f"{x:.2f}" for x in sides[s]) for s in ("before", "after")]
        lines.append(f"| {workers} | {b:.3f} | {a:.3f} | {a / b:.2f} | {every[0]} | {every[1]} |")
    publish("\n".join(lines) + "\n", TITLE)


if __name__ == "__main__":
    main()
