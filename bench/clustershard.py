"""One job on a Redis Cluster of three primaries, in one slot (``--shards 1``) and spread over
the three (``--shards 3``), alternated: its prompts/s, each primary's share of the job's Redis
CPU (INFO cpu of each node), and Redis CPU and commands a prompt summed over the nodes
(INFO commandstats, Lua's commands included), and whether every answer read back in input
order (the shards' results merged, as a collector reads them) is its prompt's, once. 2
instant endpoints, 2 workers, the default batch and chunk: scenario 4's first row, on a
cluster.

    python -m bench.clustershard [N] [--rounds 2]

The nodes are ``redis-server`` from PATH when there is one (else the embedded one), each
started here on a free port: never a Redis of anyone else's.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time

import redis
import redis.asyncio as aioredis

from bench.harness import INSTANT, SimFleetProc, new_fleet, prompt_set, redis_cpu_s, run_swarm
from swarm_queue.common.embedded import EmbeddedRedis, free_port
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.sim.text import completion_for

PRIMARIES = 3
SLOTS = 16384


class Cluster:
    """Three redis-server primaries on loopback, the slots split evenly among them."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        self.nodes = [
            EmbeddedRedis(
                free_port(pair=10_000),
                binary=binary,
                extra_args=("--cluster-enabled", "yes", "--cluster-node-timeout", "5000"),
            )
            for _ in range(PRIMARIES)
        ]
        self.binary = binary or "embedded"

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        share = SLOTS // PRIMARIES
        for i, c in enumerate(clients):
            hi = SLOTS if i == PRIMARIES - 1 else (i + 1) * share
            c.execute_command("CLUSTER ADDSLOTS", *range(i * share, hi))
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 60
        while not all(_ok(c) for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come up")
            time.sleep(0.05)
        for c in clients:
            c.close()
        return self

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _ok(c: redis.Redis) -> bool:
    info = c.execute_command("CLUSTER INFO")
    return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == PRIMARIES


async def _row(cluster: Cluster, fleet: SimFleetProc, prompts: list[str], shards: int) -> str:
    n = len(prompts)
    nodes = [aioredis.Redis(port=node.port) for node in cluster.nodes]
    try:
        for r in nodes:
            await r.config_resetstat()
        before = [await redis_cpu_s(r) for r in nodes]
        run = await run_swarm(
            cluster.url, f"b-shard{shards}", fleet, [[u] for u in fleet.urls], prompts, 16,
            worker_env={"SWARM_REDIS_CLUSTER": "1"}, shards=shards, cluster=True,
        )  # fmt: skip
        spent = [await redis_cpu_s(r) - b for r, b in zip(nodes, before, strict=True)]
        exact = await _exact(cluster.url, f"b-shard{shards}", prompts)
        calls = 0
        for r in nodes:
            stats = await r.info("commandstats")
            calls += sum(
                int(v["calls"])
                for k, v in stats.items()
                if not k.startswith(("cmdstat_config", "cmdstat_cluster", "cmdstat_info"))
            )
            await r.flushall()
        shares = " / ".join(f"{s / sum(spent):4.0%}" for s in spent)
        return (
            f"{n / run.wall_s:8,.0f} prompts/s  each primary {shares} of the job's Redis CPU  "
            f"{sum(spent) / n * 1e6:5.1f} us  {calls / n:5.2f} commands a prompt  "
            f"every line exact and in order: {'yes' if exact else 'NO'}"
        )
    finally:
        for r in nodes:
            await r.aclose()


async def _exact(url: str, prefix: str, prompts: list[str]) -> bool:
    """Whether the job's results, read in input order as a collector reads them (its shards'
    merged), are each prompt's answer, once, in order."""
    store = JobStore.from_settings(Settings(redis_url=url, prefix=prefix, redis_cluster=True))
    try:
        results = await store.read_results("bench", len(prompts))
    finally:
        await store.close()
    return [r.index for r in results] == list(range(len(prompts))) and all(
        r.text == completion_for(p, 16)[0] for r, p in zip(results, prompts, strict=True)
    )


async def main(n: int, rounds: int) -> None:
    prompts = prompt_set(n)
    cluster = Cluster().start()
    print(f"3 primaries ({cluster.binary}), {n:,} prompts, 2 instant endpoints, 2 workers")
    try:
        fleet = new_fleet(2, INSTANT).start()
        try:
            for k in range(rounds):
                for shards in (1, PRIMARIES):
                    got = await _row(cluster, fleet, prompts, shards)
                    print(f"round {k + 1}, --shards {shards}: {got}", flush=True)
        finally:
            fleet.stop()
    finally:
        cluster.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, nargs="?", default=300_000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.n, a.rounds))
