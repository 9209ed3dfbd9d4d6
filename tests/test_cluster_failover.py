"""A Redis Cluster failover under a running fleet, with real processes: three primaries, each
with a replica (node timeout 2 s, AOF); a plain job, one spread over the three primaries
(``--shards 3``), a pipeline and an agent job running on two long-running workers, a tool
runner and collectors; the primary holding the jobs' slots (and arq's, and a shard of the
spread job) SIGKILLed, or moved to its replica by CLUSTER FAILOVER. Every process rides
through it as through a Redis restart: no one restarted by hand, every answer of the plain
jobs and the pipeline right and exactly once, every agent finished with its tools' answers."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator

import msgspec
import pytest
import redis

from swarm_queue.common.keys import ARQ_TAG, Keys, step_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.shards import Shards
from swarm_queue.common.store import JobStore
from tests.harness import (
    AGENT_TASK,
    TOOL_PARSER_ARGS,
    FleetFactory,
    RedisClusterProcs,
    check_output,
    collect,
    command,
    tool_runner,
)
from tests.helpers import wait_count, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[RedisClusterProcs]:
    procs = RedisClusterProcs(3, replicas=True, node_timeout_ms=2000).start()
    yield procs
    procs.close()


def _names_with(cluster: RedisClusterProcs, keys: Keys, node: int, n: int) -> list[str]:
    """``n`` job names whose keys sit on primary ``node``."""
    names = [f"job{i}" for i in range(2000) if cluster.node_of(keys.stream(f"job{i}")) == node]
    return names[:n]


async def test_scripts_and_a_delete_follow_the_slot_to_a_primary_without_the_scripts(
    cluster: RedisClusterProcs, prefix: str
) -> None:
    """A replica promoted in a failover knows none of the scripts (Redis keeps its script
    cache in memory only, and a replica that resynced has an empty one), and commands that
    were on their way to the old primary all come back MOVED at once. Every script still runs
    and a job's delete still finds every key: seen failing every call after such a failover
    (redis-py counting the new primary a replica, so that its script load and its scan of
    the primaries went everywhere but there)."""
    keys = Keys(prefix)
    job = "job0"
    with redis.Redis(port=cluster.nodes[0].port) as client:  # the node clients ask first
        wait_until(
            "every shard's replica known",
            lambda: all(len(r) == 4 for r in client.execute_command("CLUSTER SLOTS", parse=False)),
        )
    settings = Settings(redis_url=cluster.url, prefix=prefix, redis_cluster=True)
    store = JobStore.from_settings(settings)
    try:
        await store.create_job(JobSpec(job=job))  # a script, known to the primary from now
        assert await store.acquire_producer_lock(job, "a", 60_000) is None
        node = cluster.node_of(keys.meta(job))
        doomed, replica = cluster.nodes[node], cluster.nodes[cluster.primaries + node]
        # (A takeover does not wait for the replica to have the primary's last writes: seen
        # once, the lock lost with them, in a loaded suite.)
        with redis.Redis(port=doomed.port) as client:
            assert client.execute_command("WAIT", 1, 10_000) == 1
        cluster.fail_over(keys.meta(job), takeover=True)
        with redis.Redis(port=replica.port) as client:
            client.script_flush()
        assert doomed is not replica
        # A takeover does not ask the old primary either: until it hears of it, it still takes
        # writes for the slot, which the new primary never sees (seen once in a loaded suite:
        # the delete below went there, every key left on the new primary). What follows is
        # about the client following the slot, so it starts once the old primary has stepped
        # down.
        with redis.Redis(port=doomed.port) as client:
            wait_until("the old primary to step down", lambda: client.role()[0] == b"slave")
        # Three reads in flight to the old primary: three MOVED answers.
        metas = await asyncio.gather(*(store.meta(job) for _ in range(3)))
        assert all(m == metas[0] for m in metas)
        # Scripts: the lock's holder is still the one who took it, and it is given back.
        assert await store.acquire_producer_lock(job, "b", 60_000) == "a"
        await store.release_producer_lock(job, "a")
        assert await store.acquire_producer_lock(job, "b", 60_000) is None
        # Every key of the job deleted, on the node that serves it now.
        assert await store.delete_job(job) >= 2
        with redis.Redis(port=replica.port) as client:
            assert client.keys(f"{prefix}:{{{job}}}:*") == []
    finally:
        await store.close()


@pytest.mark.parametrize("fault", ["kill", "failover"])
def test_every_process_rides_through_a_failover(
    cluster: RedisClusterProcs, fleet_factory: FleetFactory, prefix: str, fault: str
) -> None:
    keys = Keys(prefix)
    arq_node = cluster.node_of(f"{ARQ_TAG}:x")
    plain, pipe, agents = _names_with(cluster, keys, arq_node, 3)
    fleet = fleet_factory(2, *TOOL_PARSER_ARGS, url=cluster.url)
    fleet.env["SWARM_REDIS_CLUSTER"] = "1"
    # A tool try lost with a SIGKILLed primary is asked again once its claim expires (3 times
    # a runner's hold of a call, plus 30 s): with the default 60 s timeout that is minutes,
    # longer than collect()'s stall window; the tools here take 0.2 s.
    fleet.env["SWARM_TOOL_TIMEOUT_S"] = "5"
    env = fleet.env
    n, n_agents = 6000, 200
    (fleet.tmp / "step.txt").write_text("Check: {answer}")
    (fleet.tmp / "task.txt").write_text(AGENT_TASK)
    (fleet.tmp / "in.jsonl").write_text(
        "".join(json.dumps({"n": i}) + "\n" for i in range(n_agents))
    )
    assert fleet.enqueue(plain, n, set()).wait(60) == 0
    # One job over the three primaries: a shard of it is on the doomed one, whichever it is.
    wide, n_wide = "wide", 3000
    assert fleet.enqueue(wide, n_wide, set(), "--shards", "3", "--chunk", "4").wait(60) == 0
    pipeline = fleet.enqueue(pipe, 1500, set(), "--then", str(fleet.tmp / "step.txt"))
    assert pipeline.wait(60) == 0
    enq = command(
        env, "swarm-enqueue", fleet.tmp / "in.jsonl", "--job", agents, "--task",
        fleet.tmp / "task.txt", "--tools", "slow_add,fetch", "--max-turns", "3",
    )  # fmt: skip
    assert enq.returncode == 0, enq.stderr
    log = fleet.tmp / "runs.log"
    log.touch()
    runner = tool_runner(env, log, fleet.tmp / "runner.log")
    workers = [fleet.worker("a", [0], burst=False), fleet.worker("b", [1], burst=False)]
    try:
        wait_count("the jobs under way", lambda: fleet.done(plain), n // 5 + 1)
        doomed = cluster.nodes[arq_node]
        if fault == "kill":
            assert doomed.proc is not None
            doomed.proc.send_signal(signal.SIGKILL)
        else:
            cluster.fail_over(keys.meta(plain))
        wait_until(
            "the replica serving the slots",
            lambda: cluster.primary_of(keys.meta(plain)) is not doomed,
        )
        outs = {job: fleet.tmp / f"{job}.jsonl" for job in (plain, pipe, agents, wide)}
        done = {job: collect(env, job, out) for job, out in outs.items()}
        assert done[plain].returncode == 0, done[plain].stderr
        check_output(outs[plain], n, set())
        assert done[wide].returncode == 0, done[wide].stderr
        check_output(outs[wide], n_wide, set())
        assert done[pipe].returncode == 0, done[pipe].stderr
        lines = [msgspec.json.decode(x) for x in outs[pipe].read_bytes().splitlines()]
        assert [x["index"] for x in lines] == list(range(1500))
        assert all(len(x["steps"]) == 2 and x["error"] is None for x in lines)
        assert done[agents].returncode == 0, done[agents].stderr
        agent_lines = [msgspec.json.decode(x) for x in outs[agents].read_bytes().splitlines()]
        assert [x["index"] for x in agent_lines] == list(range(n_agents))
        assert all("failure" not in x and x["tool_calls"] == 2 for x in agent_lines)
        runs = log.read_text().split()
        # Each call ran: the shared one at least once, each agent's own fetch; again only
        # where a try was lost with the old primary (at least once, as documented).
        assert runs.count("slow_add") >= 1 and runs.count("fetch") >= n_agents
        # Counts equal totals: every prompt counted once, in Redis as in the files.
        client = redis.RedisCluster(
            host="127.0.0.1", port=cluster.primary_of(keys.meta(plain)).port
        )
        try:
            layout = Shards.of(wide, 3, 4)
            shares = zip(layout.names, layout.shares(n_wide), strict=True)
            for job, total in ((plain, n), (pipe, 1500), (step_name(pipe, 1), 1500), *shares):
                meta = client.hgetall(keys.meta(job))
                assert (
                    int(meta[b"done"]) + int(meta.get(b"failed", 0)) == total == int(meta[b"total"])
                )
        finally:
            client.close()
        # No process was restarted by hand, and none died.
        assert all(w.poll() is None for w in [*workers, runner])
        for path in fleet.logs:
            assert "Traceback" not in path.read_text(), path.read_text()[-3000:]
    finally:
        for proc in [*workers, runner]:
            proc.terminate()
        for proc in [*workers, runner]:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
