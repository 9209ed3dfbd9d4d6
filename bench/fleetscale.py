"""Scenario 9: a thousand endpoints on one Redis (issue 13). One job over many simulated
endpoints (several simulator processes of instant engines), served by worker processes of 50
endpoints each, as on a large HPC allocation. Measured: that it completes exactly, and what it
costs: Redis clients, memory and CPU per prompt, and worker CPU per endpoint, idle and busy."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from bench.harness import (
    INSTANT,
    REDIS_US,
    Bench,
    SimFleetProc,
    Workers,
    new_fleet,
    prompt_set,
    redis_cost,
    redis_cpu_s,
)
from bench.rows import Row, Scenario
from swarm_queue.common.jobspec import DEFAULT_CHUNK
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import write_output

__all__ = ["FleetCost", "fleet_scale_scenario"]

IDLE_S = 5.0  # how long the idle fleet's cost is measured


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


@dataclass
class FleetCost:
    """What one run measured."""

    wall_s: float
    written: int
    done: int
    redis_clients: int
    redis_peak_bytes: int
    redis_cpu_us_per_prompt: float
    redis_calls_per_prompt: float
    redis_idle_pct: float
    worker_idle_pct_per_endpoint: float
    worker_busy_pct_per_endpoint: float


async def run_fleet(
    bench: Bench, n: int, endpoints: int, per_worker: int, sims: int, prefix: str
) -> FleetCost:
    """One job of ``n`` prompts over ``endpoints`` instant endpoints in ``sims`` simulator
    processes, served by long-running workers of ``per_worker`` endpoints each."""
    fleets: list[SimFleetProc] = [
        new_fleet(endpoints // sims, INSTANT).start() for _ in range(sims)
    ]
    urls = [u for f in fleets for u in f.urls]
    groups = [urls[i : i + per_worker] for i in range(0, len(urls), per_worker)]
    settings = Settings(redis_url=bench.url, prefix=prefix)
    store = JobStore.from_settings(settings)
    r = aioredis.Redis.from_url(bench.url)
    # The fleet as a user runs it: the registry read at the default period (the other
    # scenarios read it every 0.1 s, to start their short jobs at once), prompts chunked as
    # swarm-enqueue chunks them.
    refresh = {"SWARM_JOBS_REFRESH_S": str(Settings().jobs_refresh_s)}
    workers = Workers(bench.url, prefix, groups, env=refresh, separate=True).start()
    try:
        pids = [p.pid for p in workers.procs]
        # Ready: every endpoint of every worker is in the fleet registry.
        deadline = time.monotonic() + 300
        while len(await store.read_fleet()) < len(urls):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not register their endpoints")
            await asyncio.sleep(0.5)
        c0, rc0, t_idle = _cpu_s(pids), await redis_cpu_s(r), time.monotonic()
        await asyncio.sleep(IDLE_S)
        idle_span = time.monotonic() - t_idle
        idle = (_cpu_s(pids) - c0) / idle_span
        redis_idle = (await redis_cpu_s(r) - rc0) / idle_span

        c0 = _cpu_s(pids)
        peak, clients = 0, 0
        t0 = time.monotonic()

        async def sample() -> None:
            nonlocal peak, clients
            while True:
                peak = max(peak, int((await r.info("memory"))["used_memory"]))
                clients = max(clients, int((await r.info("clients"))["connected_clients"]))
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        spec = JobSpec(job="fleet", params=SamplingParams(max_tokens=16), chunk=DEFAULT_CHUNK)
        async with redis_cost(bench.url, n) as cost:
            await enqueue_prompts(store, spec, ((p, None) for p in prompt_set(n)))
            with open(os.devnull, "wb") as sink:
                report = await write_output(store, "fleet", sink, wait=True, poll_s=0.1)
        wall = time.monotonic() - t0
        busy = (_cpu_s(pids) - c0) / wall
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        status = await store.status("fleet")
        return FleetCost(
            wall_s=wall,
            written=report.written,
            done=status.done,
            redis_clients=clients,
            redis_peak_bytes=peak,
            redis_cpu_us_per_prompt=cost[REDIS_US],
            redis_calls_per_prompt=cost["Redis commands per prompt"],
            redis_idle_pct=100 * redis_idle,
            worker_idle_pct_per_endpoint=100 * idle / len(urls),
            worker_busy_pct_per_endpoint=100 * busy / len(urls),
        )
    finally:
        workers.stop()
        for f in fleets:
            f.stop()
        await r.aclose()
        await store.close()


async def fleet_scale_scenario(
    bench: Bench, n: int, endpoints: int, per_worker: int, sims: int
) -> Scenario:
    sc = Scenario(
        "fleet_scale",
        "9. A thousand endpoints",
        f"One job of {n:,} prompts over {endpoints:,} instant endpoints ({sims} simulator "
        f"processes), served by {endpoints // per_worker} long-running worker processes of "
        f"{per_worker} endpoints each, all on one Redis and this machine's {os.cpu_count()} "
        "cores. *Worker CPU per endpoint* is the workers' CPU time over the endpoints, in % of "
        f"one core: idle (the fleet registered, no job, over {IDLE_S:.0f} s) and busy (during "
        "the job). The workers read the job registry at the default period (1 s; the other "
        "scenarios every 0.1 s) and the prompts go "
        f"{DEFAULT_CHUNK} to a stream entry, as swarm-enqueue queues them. Redis figures cover "
        "enqueue, workers and collector together; see docs/SCALE.md for what they mean for a "
        "fleet.",
    )
    cost = await run_fleet(bench, n, endpoints, per_worker, sims, "b-fleet")
    sc.rows.append(
        Row(
            "swarm-queue",
            cost.wall_s,
            cost.written,
            n,
            extra={
                "done": cost.done,
                "Redis clients": cost.redis_clients,
                "peak_redis_bytes": cost.redis_peak_bytes,
                REDIS_US: cost.redis_cpu_us_per_prompt,
                "Redis commands per prompt": cost.redis_calls_per_prompt,
                "Redis CPU % of a core, fleet idle": cost.redis_idle_pct,
                "worker CPU % per endpoint idle": cost.worker_idle_pct_per_endpoint,
                "worker CPU % per endpoint busy": cost.worker_busy_pct_per_endpoint,
            },
        )
    )
    sc.extra = {"cost": cost.__dict__}
    sc.checks["every prompt answered, each once (done == total)"] = cost.written == n == cost.done
    return sc
