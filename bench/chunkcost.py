"""What Redis spends a prompt with and without chunked entries: scenario 4's two rows (2
instant endpoints, 2 workers; the default batch of 32, and 256 with 4 in flight) for chunk 1
and chunk 16 alternated, each row's prompts/s, Redis CPU a prompt (and of it, the part spent
in the kernel: its system calls), commands a prompt (Lua's included, from INFO
commandstats), the worker processes' CPU a prompt, and with ``--top`` the commands that cost
most.

    python -m bench.chunkcost [N] [--rounds 2] [--top] [--chunks 1,16]
"""

from __future__ import annotations

import argparse
import asyncio

import redis.asyncio as aioredis

from bench.harness import (
    INSTANT,
    Bench,
    SimFleetProc,
    new_fleet,
    prompt_set,
    redis_cpu_s,
    run_swarm,
)

ROWS: tuple[tuple[str, dict[str, str]], ...] = (
    ("32", {}),
    ("256", {"SWARM_BATCH_SIZE": "256", "SWARM_INFLIGHT": "4"}),
)


async def _row(
    url: str, fleet: SimFleetProc, prompts: list[str], env: dict[str, str], chunk: int, top: bool
) -> str:
    n = len(prompts)
    r = aioredis.Redis.from_url(url)
    try:
        await r.config_resetstat()
        before = await redis_cpu_s(r)
        sys_before = float((await r.info("cpu"))["used_cpu_sys"])
        run = await run_swarm(
            url, "b-chunk", fleet, [[u] for u in fleet.urls], prompts, 16,
            worker_env=env, chunk=chunk,
        )  # fmt: skip
        spent = await redis_cpu_s(r) - before
        in_kernel = float((await r.info("cpu"))["used_cpu_sys"]) - sys_before
        stats = await r.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if "config" not in k)
        line = (f"{n / run.wall_s:9,.0f} prompts/s  {spent / n * 1e6:5.1f} us "
                f"({in_kernel / n * 1e6:4.1f} in the kernel)  "
                f"{calls / n:5.2f} commands a prompt, "
                f"workers {run.worker_cpu_s / n * 1e6:5.1f} us")  # fmt: skip
        if top:
            worst = sorted(stats.items(), key=lambda kv: -float(kv[1]["usec"]))[:8]
            line += "".join(
                f"\n      {k.removeprefix('cmdstat_'):12s} {int(v['calls']) / n:6.3f} a prompt, "
                f"{float(v['usec']) / n:5.2f} us"
                for k, v in worst
            )
        await r.flushall()
        return line
    finally:
        await r.aclose()


async def main(n: int, rounds: int, top: bool, chunks: tuple[int, ...]) -> None:
    prompts = prompt_set(n)
    with Bench() as bench:
        fleet = new_fleet(2, INSTANT).start()
        try:
            for k in range(rounds):
                for chunk in chunks:
                    for batch, env in ROWS:
                        got = await _row(bench.url, fleet, prompts, env, chunk, top)
                        print(f"round {k + 1}, batch {batch:>3}, chunk {chunk:>2}: {got}")
        finally:
            fleet.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, nargs="?", default=100_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--top", action="store_true")
    p.add_argument("--chunks", default="1,16", help="the chunk sizes to run, comma-separated")
    a = p.parse_args()
    asyncio.run(main(a.n, a.rounds, a.top, tuple(int(c) for c in a.chunks.split(","))))
