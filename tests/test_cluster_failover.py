"""A Redis Cluster failover under a running fleet, with real processes: three primaries, each
with a replica (node timeout 2 s, AOF); a plain job, a pipeline and an agent job running on two
long-running workers, a tool runner and collectors; the primary holding the jobs' slots (and
arq's) SIGKILLed, or moved to its replica by CLUSTER FAILOVER. Every process rides through it
as through a Redis restart: no one restarted by hand, every answer of the plain job and the
pipeline right and exactly once. (The agent job's end is not asserted yet: see the test.)"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator

import msgspec
import pytest
import redis

from common.keys import ARQ_TAG, Keys, step_name
from tests.harness import (
    AGENT_TASK,
    FleetFactory,
    RedisClusterProcs,
    check_output,
    collect,
    command,
    tool_runner,
)
from tests.helpers import wait_until

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


# Known open (issue 30, item 10): in about one run of three the agent job beside them did
# not finish after the failover, and a process logged it; the cause is not found yet. Run
# every time, reported as XFAIL/XPASS, so that the fix shows.
@pytest.mark.xfail(strict=False, reason="agents after a cluster failover: open in issue 30")
@pytest.mark.parametrize("fault", ["kill", "failover"])
def test_every_process_rides_through_a_failover(
    cluster: RedisClusterProcs, fleet_factory: FleetFactory, prefix: str, fault: str
) -> None:
    keys = Keys(prefix)
    arq_node = cluster.node_of(f"{ARQ_TAG}:x")
    plain, pipe, agents = _names_with(cluster, keys, arq_node, 3)
    fleet = fleet_factory(2, url=cluster.url)
    fleet.env["SWARM_REDIS_CLUSTER"] = "1"
    env = fleet.env
    n, n_agents = 6000, 200
    (fleet.tmp / "step.txt").write_text("Check: {answer}")
    (fleet.tmp / "task.txt").write_text(AGENT_TASK)
    (fleet.tmp / "in.jsonl").write_text(
        "".join(json.dumps({"n": i}) + "\n" for i in range(n_agents))
    )
    assert fleet.enqueue(plain, n, set()).wait(60) == 0
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
        wait_until("the jobs under way", lambda: fleet.done(plain) > n // 5)
        doomed = cluster.nodes[arq_node]
        if fault == "kill":
            assert doomed.proc is not None
            doomed.proc.send_signal(signal.SIGKILL)
        else:
            replica = cluster.nodes[cluster.primaries + arq_node]
            with redis.Redis(port=replica.port) as client:
                client.execute_command("CLUSTER FAILOVER")
        wait_until(
            "the replica serving the slots",
            lambda: cluster.primary_of(keys.meta(plain)) is not doomed,
        )
        outs = {job: fleet.tmp / f"{job}.jsonl" for job in (plain, pipe, agents)}
        done = {job: collect(env, job, out) for job, out in outs.items() if job != agents}
        # The agent job runs beside them through the failover, but its end is not asserted:
        # in some runs its agents did not all finish after a failover (issue 30, left open for
        # it: under investigation). What it must not do is spoil the other jobs or a process.
        assert done[plain].returncode == 0, done[plain].stderr
        check_output(outs[plain], n, set())
        assert done[pipe].returncode == 0, done[pipe].stderr
        lines = [msgspec.json.decode(x) for x in outs[pipe].read_bytes().splitlines()]
        assert [x["index"] for x in lines] == list(range(1500))
        assert all(len(x["steps"]) == 2 and x["error"] is None for x in lines)
        # Counts equal totals: every prompt counted once, in Redis as in the files.
        client = redis.RedisCluster(
            host="127.0.0.1", port=cluster.primary_of(keys.meta(plain)).port
        )
        try:
            for job, total in ((plain, n), (pipe, 1500), (step_name(pipe, 1), 1500)):
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
