"""Run every benchmark scenario, the system and its baselines side by side, and write the report.

    .venv/bin/python -m bench.run            # full size; writes docs/BENCHMARKS.md and plots
    .venv/bin/python -m bench.run --smoke    # tiny sizes, a minute: what the test suite runs

Each scenario starts its own swarm-sim fleet (and shares one private Redis), runs swarm-queue
(long-running workers, one per endpoint, timed from the first enqueue to the last collected
line) and the baselines, and reports wall time, prompts/s and the fraction of the fleet's
theoretical capacity: the simulator's tokens per second at a full batch, summed over the
endpoints, against the exact number of tokens the prompt set asks for.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import platform
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.baselines import arq_one_job_per_prompt, naive_gather, static_round_robin
from bench.capacity import plot_capacity
from bench.fleetscale import fleet_scale_scenario
from bench.harness import (
    INSTANT,
    OUT,
    REDIS_US,
    ROOT,
    Bench,
    Sampler,
    SimFleetProc,
    SwarmRun,
    batch_service_s,
    ideal_makespan,
    kill_at_share,
    new_fleet,
    one_worker_process,
    prompt_iter,
    prompt_set,
    queue_times,
    redis_cost,
    run_scale,
    run_swarm,
    urgent_job_time,
)
from bench.rows import Row, Scenario
from bench.startup import startup_scenario
from bench.strict import strict_scenario
from bench.versus import carried_over, with_section
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig

DOCS = ROOT / "docs"
WORKER_US = "worker CPU us per prompt"
# A decode step of 20 ms + 0.1 ms per running sequence (about 46 ms at a full batch of 256):
# in the range of a large model on one GPU node.
REAL = EngineConfig(max_num_seqs=256, step_base_ms=20.0, step_per_seq_ms=0.1)


SCENARIOS = (
    "homogeneous",
    "heterogeneous",
    "dead_node",
    "overhead",
    "scale",
    "latency",
    "priority",
    "strict",
    "fleet_scale",
    "start",
)


Baseline = Callable[[], Awaitable[tuple[float, int]]]


async def _baselines(sc: Scenario, runs: dict[str, Baseline], n: int, ideal: float | None) -> None:
    for name, fn in runs.items():
        wall, answered = await fn()
        sc.rows.append(Row(name, wall, answered, n, ideal))


def _swarm_row(run: SwarmRun, n: int, ideal: float | None) -> Row:
    return Row(
        "swarm-queue",
        run.wall_s,
        run.results - run.failed,
        n,
        ideal,
        {
            "first_result_s": run.first_result_s,
            "enqueue_s": run.enqueue_s,
            "peak_redis_bytes": run.peak_memory,
            "max_waiting": run.max_waiting,
            "mean_wait_s": run.queue.mean_s,
            WORKER_US: 1e6 * run.worker_cpu_s / n,
        },
    )


async def fleet_scenario(
    bench: Bench,
    name: str,
    n: int,
    speeds: list[float],
    *,
    kill_at: float | None = None,
    max_tokens: int = 32,
) -> Scenario:
    """Scenarios 1-3: a fleet at realistic speed, optionally losing an endpoint."""
    prompts = prompt_set(n)
    fleet = new_fleet(len(speeds), REAL, speeds).start()
    alive = [True] * len(speeds)
    ideal: float | None = ideal_makespan(prompts, max_tokens, fleet.configs())
    titles = {
        "homogeneous": ("1. Homogeneous fleet", "4 endpoints at speed 1."),
        "heterogeneous": ("2. Heterogeneous fleet", "Speeds 1, 1, 1, 0.5: one slow node."),
        "dead_node": ("3. Dead node", "One of 4 endpoints dies a third of the way through."),
    }
    sc = Scenario(name, *titles[name])
    killed: dict[str, float] = {}

    async def killer(store: JobStore, t0: float) -> None:
        if kill_at is not None:
            killed.update(await kill_at_share(fleet, store, "bench", int(kill_at * n), t0))

    try:
        groups = [[u] for u in fleet.urls]
        run = await run_swarm(
            bench.url, f"b-{name}", fleet, groups, prompts, max_tokens, during=killer
        )
        if kill_at is not None:
            alive[-1] = False
            rest = prompts[int(killed["done"]) :]
            ideal = killed["t"] + ideal_makespan(rest, max_tokens, fleet.configs(alive))
            sc.note += (
                f" It died at {killed['t']:.1f} s with {killed['done']:.0f} results in; "
                "ideal = that time + the remaining tokens at the remaining capacity."
            )
        sc.rows.append(_swarm_row(run, n, ideal))
        sc.series = run.series
    finally:
        fleet.stop()
    baselines: dict[str, Callable[[list[str]], Coroutine[Any, Any, tuple[float, int]]]] = {
        "static round-robin": lambda urls: static_round_robin(urls, prompts, max_tokens),
        "naive gather": lambda urls: naive_gather(urls, prompts, max_tokens),
        "arq, one job per prompt": lambda urls: arq_one_job_per_prompt(
            bench.url, urls, prompts, max_tokens
        ),
    }
    for base_name, base in baselines.items():
        fleet = new_fleet(len(speeds), REAL, speeds).start()
        try:
            task = asyncio.create_task(base(fleet.urls))
            if kill_at is not None:  # the baselines meet the same death, at the same moment
                await asyncio.sleep(killed["t"])
                fleet.kill_endpoint(len(speeds) - 1)
            wall, answered = await task
            sc.rows.append(Row(base_name, wall, answered, n, ideal))
        finally:
            fleet.stop()
    swarm = sc.rows[0]
    rr = next(r for r in sc.rows if r.system == "static round-robin")
    frac = swarm.capacity_fraction or 0.0
    sc.checks["every prompt answered"] = swarm.answered == n
    if name == "homogeneous":
        sc.checks[">= 95% of fleet capacity"] = frac >= 0.95
        sc.checks["not slower than static round-robin"] = swarm.wall_s <= rr.wall_s * 1.0
    elif name == "heterogeneous":
        sc.checks[">= 93% of fleet capacity"] = frac >= 0.93
        sc.checks[">= 1.6x faster than static round-robin"] = rr.wall_s / swarm.wall_s >= 1.6
    else:
        sc.checks["within 1.10x of the ideal for the remaining capacity"] = frac >= 1 / 1.10
        sc.note += (
            " (The ideal leaves out the work the surviving engines had in progress at "
            "the moment of death, so it is slightly pessimistic: over 100% is possible.)"
        )
    return sc


async def _instant_baselines(
    sc: Scenario, bench: Bench, urls: list[str], prompts: list[str], baseline_n: int
) -> None:
    """The three baselines on instant endpoints. The per-request ones run a few hundred
    prompts/s here: their rate is measured on the first ``baseline_n`` prompts rather than
    waiting many minutes for all of them."""
    await _baselines(
        sc,
        {"static round-robin": lambda: static_round_robin(urls, prompts, 16)},
        len(prompts),
        None,
    )
    few = prompts[:baseline_n]
    await _baselines(
        sc,
        {
            "naive gather": lambda: naive_gather(urls, few, 16),
            "arq, one job per prompt": lambda: arq_one_job_per_prompt(bench.url, urls, few, 16),
        },
        len(few),
        None,
    )


async def overhead_scenario(bench: Bench, n: int, baseline_n: int, repeats: int) -> Scenario:
    """Scenario 4: an endpoint that answers instantly; what the system itself costs."""
    prompts = prompt_set(n)
    sc = Scenario(
        "overhead",
        "4. Orchestration overhead",
        f"2 instant endpoints, 2 workers (one per endpoint), {n:,} prompts: enqueue, "
        "workers and collect together.",
    )
    fleet = new_fleet(2, INSTANT).start()
    try:
        # What Redis itself spends per prompt: its CPU time and the commands it ran (those
        # inside Lua scripts included), at the default batch and at the scenario's batch.
        for system, env in (
            ("swarm-queue, batch 32 (default)", {}),
            ("swarm-queue", {"SWARM_BATCH_SIZE": "256", "SWARM_INFLIGHT": "4"}),
        ):
            async with redis_cost(bench.url, n) as cost:
                run = await run_swarm(
                    bench.url, "b-overhead", fleet, [[u] for u in fleet.urls], prompts, 16,
                    worker_env=env,
                )  # fmt: skip
            row = _swarm_row(run, n, None)
            row.system = system
            row.extra.update(cost)
            sc.rows.append(row)
            await _flush(bench)  # the same job name runs again
        await _metrics_on_and_off(sc, bench, fleet, prompts, repeats)
        await _instant_baselines(sc, bench, fleet.urls, prompts, baseline_n)
    finally:
        fleet.stop()
    swarm = next(r for r in sc.rows if r.system == "swarm-queue")
    arq = next(r for r in sc.rows if r.system.startswith("arq"))
    sc.checks[">= 20,000 prompts/s end to end"] = swarm.rate >= 20_000
    sc.checks["<= 10 us of Redis CPU per prompt (batch 256)"] = swarm.extra[REDIS_US] <= 10
    default = next(r for r in sc.rows if r.system == "swarm-queue, batch 32 (default)")
    sc.checks["< 50 us of worker CPU per prompt (batch 32)"] = default.extra[WORKER_US] < 50
    sc.checks[">= 20x arq one-job-per-prompt"] = swarm.rate >= 20 * arq.rate
    return sc


async def _metrics_on_and_off(
    sc: Scenario, bench: Bench, fleet: SimFleetProc, prompts: list[str], repeats: int
) -> None:
    """The default batch with the workers' Prometheus metrics off and on, runs alternated
    (this machine's noise drifts), medians compared: the metrics must cost the hot path
    under 5%."""
    n = len(prompts)
    walls: dict[bool, list[float]] = {False: [], True: []}
    answered: dict[bool, list[int]] = {False: [], True: []}
    scraped: list[float] = []
    for _ in range(repeats):
        for on in (False, True):
            run = await run_swarm(
                bench.url, "b-overhead", fleet, [[u] for u in fleet.urls], prompts, 16,
                metrics=on,
            )  # fmt: skip
            walls[on].append(run.wall_s)
            answered[on].append(run.results)
            if on:
                scraped.append(run.scraped_done)
            await _flush(bench)
    for on in (False, True):
        wall = statistics.median(walls[on])
        row = Row(
            f"swarm-queue, batch 32, metrics {'on' if on else 'off'} (median of {repeats})",
            wall,
            min(answered[on]),
            n,
        )
        if on:
            row.extra["prompts done on the metrics pages"] = int(min(scraped))
        sc.rows.append(row)
    off_s, on_s = (statistics.median(walls[k]) for k in (False, True))
    sc.checks["metrics on within 5% of metrics off (batch 32, medians)"] = on_s <= 1.05 * off_s
    sc.checks["the metrics pages count every prompt"] = min(scraped) == n


async def scale_scenario(bench: Bench, n: int, size: int, window: int, baseline_n: int) -> Scenario:
    """Scenario 5: a million 1 KB prompts: the enqueue rate, the end-to-end rate on instant
    endpoints, and Redis memory with and without the bounds (``--window``, ``--evict``)."""
    sc = Scenario(
        "scale",
        "5. Scale",
        f"{n:,} prompts of {size:,} bytes. First `swarm-enqueue` alone (no worker running: "
        "the producer's and Redis's own rate, and what a queued prompt costs in Redis). Then "
        "end to end on 2 instant endpoints with 2 workers, enqueue and collect running "
        f"together: once bounded (`--window {window:,}` and `swarm-collect --evict`), once "
        "unbounded. *Per prompt held* is the peak of Redis `used_memory` above the empty "
        "server, over the most prompts Redis held at once (the window, or every prompt). "
        "The baselines get the same prompts in the client's memory; the per-request ones "
        f"are timed on the first {baseline_n:,}.",
    )
    spec = JobSpec(job="bench", params=SamplingParams(max_tokens=16))
    store = JobStore.from_settings(Settings(redis_url=bench.url, prefix="b-scale"))
    try:
        await _flush(bench)
        base = await _used_memory(bench)
        t0 = time.monotonic()
        await enqueue_prompts(store, spec, prompt_iter(n, size))
        enq_s = time.monotonic() - t0
        held = await _used_memory(bench) - base
        sc.rows.append(
            Row(
                "swarm-enqueue alone",
                enq_s,
                n,
                n,
                extra={"per_prompt_bytes": held / n, "peak_redis_bytes": held + base},
            )
        )
        await _flush(bench)
        base = await _used_memory(bench)
    finally:
        await store.close()
    env = {"SWARM_BATCH_SIZE": "256"}
    for label, bounded in (
        (f"end to end, --window {window:,} --evict", True),
        ("end to end, unbounded", False),
    ):
        fleet = new_fleet(2, INSTANT).start()
        try:
            run = await run_scale(
                bench.url,
                f"b-scale-{int(bounded)}",
                fleet,
                n,
                size,
                window if bounded else None,
                worker_env=env,
            )
        finally:
            fleet.stop()
        extra = {
            "enqueue_s": run.enqueue_s,
            "peak_redis_bytes": run.peak_memory,
            "per_prompt_bytes": (run.peak_memory - base) / (window if bounded else n),
        }
        sc.rows.append(Row(label, run.wall_s, run.results - run.failed, n, None, extra))
        sc.memory[label] = [(t, m) for t, _, _, m in run.series]
    store = JobStore.from_settings(Settings(redis_url=bench.url, prefix="b-scale"))
    try:  # the million results left by the unbounded run would inflate later scenarios' peaks
        await _flush(bench)
    finally:
        await store.close()
    # The baselines hold every prompt in the client's memory. Static round-robin sends each
    # endpoint one request of half the prompts (500 MB here); the per-request baselines run a
    # few hundred prompts/s, so their rate is measured on the first baseline_n prompts.
    prompts = [p for p, _ in prompt_iter(n, size)]
    fleet = new_fleet(2, INSTANT).start()
    try:
        await _instant_baselines(sc, bench, fleet.urls, prompts, baseline_n)
    finally:
        fleet.stop()
        prompts.clear()
    sc.checks[">= 25,000 prompts/s enqueued"] = sc.rows[0].rate >= 25_000
    sc.checks["every prompt answered, both ways"] = all(r.answered == n for r in sc.rows[1:3])
    sc.checks["bounded peak under a tenth of the unbounded one"] = (
        sc.rows[1].extra["peak_redis_bytes"] - base
        < (sc.rows[2].extra["peak_redis_bytes"] - base) / 10
    )
    return sc


async def _used_memory(bench: Bench) -> int:
    """The bench's private Redis's memory in use (read with a client of its own: the job store
    is the product's view of Redis, not an admin tool)."""
    admin = aioredis.from_url(bench.url)
    try:
        return int((await admin.info("memory"))["used_memory"])
    finally:
        await admin.aclose()


async def _flush(bench: Bench) -> None:
    admin = aioredis.from_url(bench.url)
    try:
        await admin.flushdb()
    finally:
        await admin.aclose()


async def latency_scenario(bench: Bench, n: int, max_tokens: int = 32) -> Scenario:
    """Scenario 6: how soon results come, and how long prompts queue inside the endpoints."""
    prompts = prompt_set(n)
    speeds = [1.0] * 4
    fleet = new_fleet(len(speeds), REAL, speeds).start()
    try:  # one batch of the job on an idle endpoint, the median of three
        service = sorted(
            [await batch_service_s(fleet.urls[0], prompts[:32], max_tokens) for _ in range(3)]
        )[1]
    finally:
        fleet.stop()
    ideal = ideal_makespan(prompts, max_tokens, fleet.configs())
    sc = Scenario(
        "latency",
        "6. Latency",
        f"4 endpoints at speed 1, {n:,} prompts. One batch of 32 of these prompts takes "
        f"{service:.2f} s on an idle endpoint. *Mean wait* is each sequence's time in the "
        "endpoint's waiting queue before it got a slot (vLLM's `request_queue_time`), read "
        "from the endpoints after the run. The first two rows are the same system with the "
        "in-flight window adapted to vLLM's gauges (the default) and fixed at 16 batches.",
    )
    sc.extra["batch_service_s"] = service
    variants = {
        "swarm-queue": {},
        "swarm-queue, fixed window of 16": {"SWARM_INFLIGHT_MAX": "0"},
    }
    for label, env in variants.items():
        fleet = new_fleet(len(speeds), REAL, speeds).start()
        try:
            run = await run_swarm(
                bench.url,
                f"b-lat-{len(sc.rows)}",
                fleet,
                [[u] for u in fleet.urls],
                prompts,
                max_tokens,
                worker_env=env,
            )
        finally:
            fleet.stop()
        row = _swarm_row(run, n, ideal)
        row.system = label
        row.extra["waited_over_1s"] = run.queue.over_1s / max(1, run.queue.count)
        sc.rows.append(row)
        sc.waiting[label] = [(t, sum(w)) for t, _, w, _ in run.series]
    baselines: dict[str, Callable[[list[str], list[float]], Awaitable[tuple[float, int]]]] = {
        "static round-robin": lambda urls, first: static_round_robin(
            urls, prompts, max_tokens, first=first
        ),
        "naive gather": lambda urls, first: naive_gather(urls, prompts, max_tokens, first=first),
        # arq reports no per-job completion times: no first result for it
        "arq, one job per prompt": lambda urls, first: arq_one_job_per_prompt(
            bench.url, urls, prompts, max_tokens
        ),
    }
    for label, base in baselines.items():
        fleet = new_fleet(len(speeds), REAL, speeds).start()
        try:
            first: list[float] = []
            sampler = Sampler(fleet.urls).start()
            wall, answered = await base(fleet.urls, first)
            await sampler.stop()
            queue = await queue_times(fleet.urls)
        finally:
            fleet.stop()
        extra: dict[str, Any] = {"first_result_s": first[0]} if first else {}
        extra |= {
            "max_waiting": sampler.max_waiting,
            "mean_wait_s": queue.mean_s,
            "waited_over_1s": queue.over_1s / max(1, queue.count),
        }
        sc.rows.append(Row(label, wall, answered, n, ideal, extra))
    swarm = sc.rows[0]
    sc.checks["first result within 2x one batch's service time on an idle endpoint"] = (
        swarm.extra["first_result_s"] <= 2 * service
    )
    sc.checks["mean wait inside an endpoint under one batch's service time"] = (
        swarm.extra["mean_wait_s"] < service
    )
    sc.checks[">= 95% of fleet capacity with the adaptive window"] = (
        swarm.capacity_fraction or 0.0
    ) >= 0.95
    return sc


async def priority_scenario(
    bench: Bench, n_big: int, n_urgent: int, max_tokens: int = 32
) -> Scenario:
    """Scenario 7: a small urgent job queued while a big one keeps the fleet busy."""
    big = prompt_set(n_big)
    urgent = [f"Urgent {p}" for p in prompt_set(n_urgent)]
    speeds = [1.0] * 4
    ideal = ideal_makespan(urgent, max_tokens, new_fleet(4, REAL, speeds).configs())
    sc = Scenario(
        "priority",
        "7. Priority",
        f"4 endpoints at speed 1, workers running. A job of {n_urgent:,} prompts is queued "
        f"alone; then again, once a job of {n_big:,} prompts has {n_big // 10:,} answered and "
        "keeps every endpoint full, at priority 1 and at the same priority 0. *Wall* is "
        "from queuing the small job to its last result; *of capacity* is against its "
        "minimum on an idle fleet. A FIFO queue (arq and most task queues) would start it "
        "only after the big job's remaining prompts.",
    )
    variants = [
        ("alone, idle fleet", 0, False),
        ("priority 1, behind the big job", 1, True),
        ("same priority 0 (fair share)", 0, True),
    ]
    for label, priority, busy in variants:
        fleet = new_fleet(len(speeds), REAL, speeds).start()
        try:
            wall, meanwhile, preempted = await urgent_job_time(
                bench.url,
                f"b-prio-{len(sc.rows)}",
                fleet,
                urgent,
                max_tokens,
                priority=priority,
                background=big if busy else None,
                background_done=n_big // 10,
            )
        finally:
            fleet.stop()
        extra = {"big_meanwhile": float(meanwhile), "preempted": float(preempted)} if busy else {}
        sc.rows.append(Row(label, wall, n_urgent, n_urgent, ideal, extra))
    alone, urgent_row, fair = sc.rows
    sc.extra["ratio_priority"] = urgent_row.wall_s / alone.wall_s
    sc.extra["ratio_fair"] = fair.wall_s / alone.wall_s
    ratio, fair_ratio = urgent_row.wall_s / alone.wall_s, fair.wall_s / alone.wall_s
    check = (
        f"priority 1 behind the big job within 1.5x of alone ({ratio:.2f}x; at the same "
        f"priority: {fair_ratio:.2f}x)"
    )
    sc.checks[check] = ratio <= 1.5
    return sc


# -- report ---------------------------------------------------------------------------------


def _plot(sc: Scenario, path: Path) -> None:
    """Throughput per endpoint (scenarios 1-3), queue over time (6) or memory over time (5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if sc.series:
        times = [t for t, *_ in sc.series]
        for e in range(len(sc.series[0][1])):
            done = [d[e] for _, d, _, _ in sc.series]
            rate = [0.0] + [
                (done[i] - done[i - 1]) / (times[i] - times[i - 1]) for i in range(1, len(done))
            ]
            ax.plot(times, rate, label=f"endpoint {e + 1}")
        ax.set_ylabel("sequences finished / s")
    for label, points in sc.waiting.items():
        ax.plot([t for t, _ in points], [w for _, w in points], label=label)
        ax.set_ylabel("sequences waiting (all endpoints)")
    for label, mem in sc.memory.items():
        ax.plot([t for t, _ in mem], [m / 2**20 for _, m in mem], label=label)
        ax.set_ylabel("Redis used_memory (MiB)")
    ax.set_xlabel("seconds since first enqueue")
    ax.set_title(sc.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _has_plot(sc: Scenario) -> bool:
    return bool(sc.series or sc.waiting or sc.memory)


DEFAULTS_NOTE = """## Defaults, and why

- **`SWARM_BATCH_SIZE=32`.** A list request answers only when its longest sequence has
  finished, so its short sequences free their slots long before the request ends: with
  outputs of 8 to 32 tokens a batch keeps on average only about 20/32 of its slots busy. What
  keeps an engine full is the total in flight, not the batch size: in earlier single runs
  16 x 32, 20 x 32 and 32 x 16 in flight landed within 0.3% of each other. 32 keeps a
  failure's blast radius (a retried or bisected batch) small and the requests short.
- **Adaptive in-flight window (`SWARM_INFLIGHT_MAX=32`), on by default.** Each worker reads
  its endpoint's `vllm:num_requests_running` / `vllm:num_requests_waiting` every 0.25 s. It
  opens with 2 batches and doubles while the engine has free slots and nothing waiting (a slow
  start: the first results come back at a lightly loaded engine's pace), then grows by one
  batch when nothing waits on two looks running; when more than one batch waits beyond the
  running slots it sheds half the surplus, counted from the batches in flight. (Until
  issue 13 it waited for more than two: in scenario 8 some endpoint then had more than one
  batch waiting in 87-97% of the samples; at one batch, 10-22%. Capacity in the same run:
  scenario 1 98.7% (99.0% before), scenario 2 96.9% (94.9%), scenario 8's cases within half a
  point of before. The mean wait inside the endpoint fell from 0.13 s to 0.09 s.) Scenario 6 puts
  it beside a fixed window of 16 batches: the same throughput, and a fraction of the wait
  inside the endpoint, because the fixed window keeps a queue of about one full batch of
  sequences waiting at every endpoint for the whole job. A fixed window of 10 x 32 (320
  sequences for 256 slots) left the engines underfed, at 92% of capacity, in an earlier run:
  how much must be in flight depends on the output lengths, which is why the window follows
  the gauges rather than a constant. Looking every 0.5 s instead of 0.25 s brought the first
  result closer (1.0 s) but let the queues run dry at times: 95% of capacity in a single run
  of scenarios 1 and 6, against 98-99% at 0.25 s.
- **Speculative copies at a job's tail (`SWARM_SPECULATE`, on).** Once every prompt of a job
  is out, an endpoint with nothing in flight runs a copy of a batch another endpoint still
  holds, the oldest first, each prompt once across the fleet; the first commit wins. Copies
  taken while the endpoint still had its own batches queued never won (0 of about 1,700 copied
  prompts in one run of scenario 8): they waited behind that endpoint's own queue. Taken only
  by an idle endpoint, they cost 64-160 prompts per job of scenario 8 (under 1% of 10,000 and
  20,000) and about a third of them came first. The strict configuration has little tail to
  cut (every output the same length, a queue of at most about one batch); long and uneven
  outputs, a slow node, or a stuck request are where they matter.
- **`SWARM_INFLIGHT=16`.** The fixed window, used when an endpoint has no vLLM gauges at
  `/metrics` (another server, a proxy) or with `SWARM_INFLIGHT_MAX=0`: 16 x 32 = 512 sequences
  in flight, twice vLLM's default `max_num_seqs` of 256, kept these engines full.
- **`SWARM_CLAIM_IDLE_MS=60000`.** A live worker refreshes its claims every third of this, so
  its length only decides how soon the batches of a worker that died silently are taken over.
  A batch handed back by a failing endpoint is reclaimable at once, whatever this value.
- **`swarm-enqueue --window N`** queues in chunks of a quarter of the window, so the window
  stays mostly full while the producer waits for room; scenario 5 shows what it costs.
"""


def report(scenarios: list[Scenario], command: str, elapsed_s: float) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Reproduce with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{_cores()} cores, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}; shared and noisy, so every scenario runs the system and its "
        f"baselines in the same run and the ratios are what to read. Whole run: "
        f"{elapsed_s:.0f} s.",
        "",
        "Endpoints are `swarm-sim` engines: continuous batching of at most 256 sequences, a "
        "decode step of 20 ms + 0.1 ms per running sequence (divided by the speed factor), "
        "one token per step per sequence; prompts ask for `max_tokens=32` and generate 8-32 "
        "tokens. **Of capacity** is the theoretical minimum wall time over the measured one. "
        "The minimum is computed by running the simulator's own scheduler offline with every "
        "prompt already inside the engines at t=0, split in proportion to each engine's "
        "capacity: continuous batching at its best, ramp-down tail included (for the dead "
        "node: the time of death, plus the remaining prompts on the remaining engines).",
        "",
    ]
    for sc in scenarios:
        lines += _section(sc)
    return "\n".join(lines) + "\n" + DEFAULTS_NOTE


def _section(sc: Scenario) -> list[str]:
    lines = [f"## {sc.title}", "", sc.note, ""]
    # A scenario that times something other than prompts brings its own table.
    lines += sc.extra.get("table") or [
        "| system | wall (s) | prompts/s | answered | of capacity | notes |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in sc.rows:
        frac = f"{r.capacity_fraction:.1%}" if r.capacity_fraction else "n/a"
        notes = ", ".join(_note(k, v) for k, v in r.extra.items())
        lines.append(
            f"| {r.system} | {r.wall_s:.2f} | {r.rate:,.0f} | "
            f"{r.answered:,}/{r.prompts:,} | {frac} | {notes} |"
        )
    lines.append("")
    for check, ok in sc.checks.items():
        lines.append(f"- {'met' if ok else '**not met**'}: {check}")
    if _has_plot(sc):
        lines += ["", f"![{sc.title}](img/bench-{sc.name}.png)"]
    lines.append("")
    return lines


def update_report(text: str, scenarios: list[Scenario], command: str) -> str:
    """``text`` (the report) with each scenario's section replaced by this run's, or added
    before the defaults note; the section says which command measured it. What was written
    under the old section's checks (earlier runs, their revisions) stays under the new."""
    for sc in scenarios:
        section = _section(sc)
        section[2] = f"{sc.note} Measured separately, with `{command}`."
        block = "\n".join(section) + "\n"
        start = text.find(f"## {sc.title}\n")
        if start < 0:
            at = text.find("## Defaults, and why")
            text = text[:at] + block + text[at:] if at >= 0 else text + "\n" + block
            continue
        end = text.find("\n## ", start + 1)
        end = end + 1 if end >= 0 else len(text)
        text = text[:start] + block + _prose(text[start:end]) + text[end:]
    return text


def _prose(section: str) -> str:
    """What a section holds under its checks (and its plot): written by hand, kept."""
    lines = section.splitlines(keepends=True)
    checks = [i for i, line in enumerate(lines) if line.startswith(("- met: ", "- **not met**: "))]
    if not checks:
        return ""
    rest = lines[checks[-1] + 1 :]
    while rest and (not rest[0].strip() or rest[0].startswith("![")):
        rest = rest[1:]
    return "".join(rest) + ("\n" if rest else "")


def _note(key: str, value: Any) -> str:
    if key == "peak_redis_bytes":
        return f"Redis peak {value / 2**20:.1f} MiB"
    if key == "max_waiting":
        return f"max waiting at an endpoint {value:.0f}"
    if key == "mean_wait_s":
        return f"mean wait inside the endpoint {value:.2f} s"
    if key == "per_prompt_bytes":
        return f"{value:,.0f} bytes per prompt held"
    if key == "big_meanwhile":
        return f"{value:,.0f} prompts of the big job answered meanwhile"
    if key == "preempted":
        return f"{value:,.0f} prompts of the big job preempted (sent again later)"
    if key == "waited_over_1s":
        return f"{value:.0%} waited over 1 s"
    if isinstance(value, int):
        return f"{key.replace('_', ' ')} {value:,}"
    return f"{key.replace('_', ' ')} {value:.2f}"


def _cores() -> int:
    import os

    return os.cpu_count() or 0


async def main_async(args: argparse.Namespace) -> list[Scenario]:
    s = 0.02 if args.smoke else 1.0
    OUT.mkdir(parents=True, exist_ok=True)
    scenarios = []
    want = set(args.only or SCENARIOS)
    with Bench() as bench:
        if "homogeneous" in want:
            scenarios.append(await fleet_scenario(bench, "homogeneous", int(20_000 * s), [1.0] * 4))
        if "heterogeneous" in want:
            scenarios.append(
                await fleet_scenario(bench, "heterogeneous", int(20_000 * s), [1.0, 1.0, 1.0, 0.5])
            )
        if "dead_node" in want:
            scenarios.append(
                await fleet_scenario(bench, "dead_node", int(20_000 * s), [1.0] * 4, kill_at=1 / 3)
            )
        if "overhead" in want:
            scenarios.append(
                await overhead_scenario(
                    bench, int(100_000 * s), int(10_000 * s), 1 if args.smoke else 3
                )
            )
        if "scale" in want:
            scenarios.append(
                await scale_scenario(
                    bench, int(1_000_000 * s), 1000, int(50_000 * s), int(10_000 * s)
                )
            )
        if "latency" in want:
            scenarios.append(await latency_scenario(bench, int(20_000 * s)))
        if "priority" in want:
            scenarios.append(await priority_scenario(bench, int(50_000 * s), max(20, int(500 * s))))
        if "strict" in want:
            scenarios.append(await strict_scenario(bench, s))
        if "fleet_scale" in want:
            endpoints = 200 if args.smoke else 1000
            scenarios.append(
                await fleet_scale_scenario(bench, int(200_000 * s), endpoints, 50, endpoints // 200)
            )
        if "start" in want:
            scenarios.append(await startup_scenario(bench, 1 if args.smoke else 7))
    return scenarios


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes; no report written")
    p.add_argument(
        "--only",
        action="append",
        metavar="SCENARIO",
        help="run only this scenario (repeatable); the report keeps the others' sections",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="where the figures go as JSON (default: bench/out/smoke.json or results.json)",
    )
    args = p.parse_args()
    if not args.smoke and importlib.util.find_spec("matplotlib") is None:
        # Found out at once, not after the scenarios have run (their plots come last).
        p.error("the report's plots need matplotlib: pip install -e '.[bench]'")
    # A run stopped with SIGTERM unwinds like an interrupted one: every scenario's finally
    # stops its workers and simulators (else they outlive the run and load the machine).
    signal.signal(signal.SIGTERM, _exit_on_term)
    if args.smoke:
        one_worker_process()
    t0 = time.monotonic()
    scenarios = asyncio.run(main_async(args))
    elapsed = time.monotonic() - t0
    Path(args.json or OUT / ("smoke.json" if args.smoke else "results.json")).write_text(
        json.dumps(
            [{**asdict(sc), "series": sc.series[-3:]} for sc in scenarios], indent=1, default=str
        )
    )
    for sc in scenarios:
        print(f"{sc.title}")
        for r in sc.rows:
            frac = f"{r.capacity_fraction:.1%}" if r.capacity_fraction else "n/a"
            print(
                f"  {r.system:26s} {r.wall_s:8.2f} s {r.rate:10,.0f}/s "
                f"{r.answered}/{r.prompts} capacity {frac}"
            )
        for check, ok in sc.checks.items():
            print(f"  {'met    ' if ok else 'NOT MET'} {check}")
    if not args.smoke:
        (DOCS / "img").mkdir(parents=True, exist_ok=True)
        for sc in scenarios:
            if _has_plot(sc):
                _plot(sc, DOCS / "img" / f"bench-{sc.name}.png")
            if sc.name == "overhead":  # docs/SCALE.md's capacity chart
                us = {
                    ("batch 256" if r.system == "swarm-queue" else "batch 32"): r.extra[REDIS_US]
                    for r in sc.rows
                    if REDIS_US in r.extra
                }
                plot_capacity(us, DOCS / "img" / "scale-capacity.png")
        path = DOCS / "BENCHMARKS.md"
        if args.only:  # this run's sections replace theirs; the others stay as measured
            command = " ".join(["python -m bench.run", *(f"--only {n}" for n in args.only)])
            path.write_text(update_report(path.read_text(), scenarios, command))
        else:
            text = report(scenarios, "python -m bench.run", elapsed)
            old = path.read_text() if path.exists() else ""
            # Sections measured by commands of their own (versus, pipeline, agents, cold,
            # start-up before and after, the gateway, issue 34's targets) stay.
            titles = [line for line in old.splitlines() if line.startswith("## ")]
            for title in titles:
                kept = carried_over(old, title)
                if kept and f"\n{title}\n" not in text:
                    text = with_section(text, kept, title)
            path.write_text(text)


if __name__ == "__main__":
    main()
