"""swarm-queue on a real Redis Cluster of three primaries, started here: jobs spread over the
shards by their hash tags, worker and collector processes, a tree reduce advanced by arq (whose
keys share one slot), and the clear error of a client that does not know it is on a cluster."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import msgspec
import pytest
import redis

from swarm_queue.common.errors import StoreRefused, StoreUnavailable
from swarm_queue.common.keys import Keys
from swarm_queue.common.room import SHARE
from swarm_queue.common.settings import Settings
from swarm_queue.common.shards import Shards
from swarm_queue.common.store import JobStore
from tests.harness import (
    BIN,
    TEMPLATE,
    FleetFactory,
    RedisClusterProcs,
    check_output,
    expected_tree,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterProcs]:
    procs = RedisClusterProcs(3).start()
    yield procs
    procs.close()


def _names_on_shards(cluster: RedisClusterProcs, keys: Keys, n: int) -> list[str]:
    """``n`` job names, no two on the same shard while shards remain."""
    names: list[str] = []
    used: set[int] = set()
    for i in range(1000):
        node = cluster.node_of(keys.stream(f"job{i}"))
        if node not in used or len(used) == len(cluster.nodes):
            names.append(f"job{i}")
            used.add(node)
        if len(names) == n:
            return names
    raise AssertionError("no names found")


def test_jobs_over_three_shards_with_workers_collectors_and_a_tree_reduce(
    cluster: RedisClusterProcs, fleet_factory: FleetFactory, prefix: str
) -> None:
    keys = Keys(prefix)
    fleet = fleet_factory(2, url=cluster.url)
    fleet.env["SWARM_REDIS_CLUSTER"] = "1"
    jobs = _names_on_shards(cluster, keys, 3)
    assert len({cluster.node_of(keys.stream(j)) for j in jobs}) == 3
    tree, n_tree, fanin = "tree", 200, 10
    poison = {7, 150}

    for job in jobs:
        assert fleet.enqueue(job, 300, poison).wait(60) == 0
    template = fleet.tmp / "reduce.txt"
    template.write_text(TEMPLATE)
    assert (
        fleet.enqueue(
            tree,
            n_tree,
            set(),
            "--reduce",
            "tree",
            "--reduce-prompt",
            str(template),
            "--fanin",
            str(fanin),
        ).wait(60)
        == 0
    )
    collectors = {job: fleet.collect(job) for job in jobs}
    workers = [fleet.worker("a", [0]), fleet.worker("b", [1]), fleet.worker("c", [0, 1])]
    for w, log in zip(workers, fleet.logs, strict=True):
        assert w.wait(timeout=180) == 0, log.read_text()[-3000:]
    for job, proc in collectors.items():
        _, err = proc.communicate(timeout=60)
        # exit 1: every line written, two of them failures (the over-long prompts)
        assert proc.returncode == 1, err
        assert "wrote 300 of 300 results (298 ok, 2 failed)" in err
        check_output(fleet.tmp / f"{job}.jsonl", 300, poison)

    final = subprocess.run(
        [BIN / "swarm-collect", tree, "--final", "--out", fleet.tmp / "final.json"],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert final.returncode == 0, final.stderr
    doc = msgspec.json.decode((fleet.tmp / "final.json").read_bytes())
    answer, per_level = expected_tree(n_tree, fanin)
    assert doc["value"] == answer
    assert [(lv["level"], lv["prompts"]) for lv in doc["levels"]] == [
        (i + 1, count) for i, count in enumerate(per_level)
    ]
    # arq queued and polled its jobs on the primary serving its one slot, and nowhere else.
    arq_node = cluster.node_of(keys.arq_queue)
    for i, node in enumerate(cluster.nodes):
        with redis.Redis(port=node.port) as client:
            stats = client.info("commandstats")
        polled = stats.get("cmdstat_zrangebyscore", {}).get("calls", 0)
        queued = stats.get("cmdstat_psetex", {}).get("calls", 0)
        assert (polled > 0, queued > 0) == ((True, True) if i == arq_node else (False, False))


def test_one_job_sharded_over_the_three_primaries_holds_a_third_on_each_and_is_exact(
    cluster: RedisClusterProcs, fleet_factory: FleetFactory, prefix: str
) -> None:
    """``--shards auto`` (one a primary): one job's prompts, results and counters on the three
    primaries, a third on each; every line exact and in order."""
    keys = Keys(prefix)
    n, poison, job = 3000, {7, 1500, 2999}, "wide"
    names = Shards.of(job, 3, 4).names
    assert sorted(cluster.node_of(keys.stream(name)) for name in names) == [0, 1, 2]
    fleet = fleet_factory(2, url=cluster.url)
    fleet.env["SWARM_REDIS_CLUSTER"] = "1"
    assert fleet.enqueue(job, n, poison, "--shards", "auto", "--chunk", "4").wait(60) == 0
    collector = fleet.collect(job)
    workers = [fleet.worker("a", [0]), fleet.worker("b", [1])]
    for w, log in zip(workers, fleet.logs, strict=True):
        assert w.wait(timeout=180) == 0, log.read_text()[-3000:]
    _, err = collector.communicate(timeout=60)
    assert collector.returncode == 1, err  # the over-long prompts failed
    assert f"wrote {n} of {n} results ({n - 3} ok, 3 failed)" in err
    check_output(fleet.tmp / f"{job}.jsonl", n, poison)
    # Each primary holds its shard's results and counts (1,024 / 1,024 / 952 of them): a
    # third of the job's data and so of its work on each (its CPU's shares, measured:
    # bench/clustershard.py, 32-36% each).
    layout = Shards.of(job, 3, 4)
    for name, share in zip(names, layout.shares(n), strict=True):
        with redis.Redis(port=cluster.nodes[cluster.node_of(keys.meta(name))].port) as client:
            fields = client.hkeys(keys.results(name))  # (a field an index, or a chunk's)
            assert sum(4 if f.startswith(b"c") else 1 for f in fields) == share
            done, failed = (int(x or 0) for x in client.hmget(keys.meta(name), ["done", "failed"]))
            assert done + failed == share


def test_a_sharded_job_keeps_room_on_each_primary_for_the_answers_of_its_own_shard(
    cluster: RedisClusterProcs, fleet_factory: FleetFactory, prefix: str
) -> None:
    """Each primary has room for the answers of its own shard of a job over the three, not for
    the whole job's: all of it is queued, no worker running (before, the node of shard 0 was
    asked to hold the whole job's answers, and the producer waited for ever)."""
    keys = Keys(prefix)
    n, job = 3000, "roomy"
    fleet = fleet_factory(1, url=cluster.url)
    fleet.env["SWARM_REDIS_CLUSTER"] = "1"
    clients = [redis.Redis(port=node.port) for node in cluster.nodes]
    producer = None
    try:
        for client in clients:  # 8 MiB free under the share of maxmemory a producer fills
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", int((used + 8 * 2**20) / SHARE))
        # An answer is taken for 4,300 bytes (max_tokens 1,000) until some are measured: a
        # shard's 1,000 need 4.3 MB of a node's 8, the job's 3,000 need 12.9.
        producer = fleet.enqueue(job, n, set(), "--shards", "auto", "--max-tokens", "1000")
        assert producer.wait(timeout=90) == 0, (fleet.tmp / f"enqueue-{job}.log").read_text()
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
        for client in clients:
            client.config_set("maxmemory", 0)
            client.close()
    layout = Shards.of(job, 3, 16)
    for name, share in zip(layout.names, layout.shares(n), strict=True):
        with redis.Redis(port=cluster.nodes[cluster.node_of(keys.meta(name))].port) as client:
            assert int(client.hget(keys.meta(name), "enqueued") or 0) == share


async def test_a_client_not_told_of_the_cluster_says_so(
    cluster: RedisClusterProcs, prefix: str
) -> None:
    keys = Keys(prefix)
    elsewhere = next(f"j{i}" for i in range(100) if cluster.node_of(keys.meta(f"j{i}")) != 0)
    store = JobStore.from_settings(Settings(redis_url=cluster.url, prefix=prefix), patient=False)
    try:
        with pytest.raises(StoreUnavailable, match="set SWARM_REDIS_CLUSTER=1"):
            await store.status(elsewhere)
    finally:
        await store.close()


async def test_a_client_told_of_a_cluster_where_there_is_none_says_so(
    redis_url: str, prefix: str
) -> None:
    """A mistyped SWARM_REDIS_CLUSTER=1 on a plain Redis is refused with what to change, not
    waited for as an outage (before: "unavailable" for ever)."""
    settings = Settings(redis_url=redis_url, prefix=prefix, redis_cluster=True)
    store = JobStore.from_settings(settings, patient=False)
    try:
        with pytest.raises(StoreRefused, match=r"no cluster .*unset SWARM_REDIS_CLUSTER"):
            await store.status("j")
    finally:
        await store.close()
