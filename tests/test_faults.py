"""Fault injection with real processes: workers SIGKILLed mid-job, HTTP 500s, connection resets,
over-long prompts, a dead and a stalled endpoint, and Redis restarted mid-job.

Every test checks the exact count of results, every text, that no index appears twice, and that
exactly the over-long prompts failed, with the server's message.
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import pytest
import redis

from swarm_queue.common.keys import Keys
from tests.harness import FleetFactory, check_output, collect
from tests.helpers import wait_count, wait_until
from tests.servers import redis_server

pytestmark = pytest.mark.slow

# A dead or stalled endpoint noticed in seconds: short request and probe timeouts, and its
# circuit opened after three failures in a row.
QUICK = {
    "SWARM_REQUEST_TIMEOUT_S": "2",
    "SWARM_PROBE_TIMEOUT_S": "1",
    "SWARM_CIRCUIT_FAILURES": "3",
}


def test_workers_killed_repeatedly_with_server_errors_resets_and_poison_prompts(
    fleet_factory: FleetFactory,
) -> None:
    n = 10_000
    poison = set(range(7, n, 1000))  # 0.1%
    fleet = fleet_factory(4, "--error-rate", "0.05", "--reset-rate", "0.01")
    assert fleet.enqueue("chaos", n, poison).wait(timeout=120) == 0
    collector = fleet.collect("chaos")
    fast = {
        "SWARM_CLAIM_IDLE_MS": "1500",
        "SWARM_MAX_ATTEMPTS": "20",
        "SWARM_CIRCUIT_FAILURES": "50",
    }
    live = {"a": fleet.worker("a", [0, 1], env=fast), "b": fleet.worker("b", [2, 3], env=fast)}
    kills = 0
    for threshold in range(1000, 8001, 1000):  # a kill every 1,000 results
        deadline = time.monotonic() + 120
        while fleet.done("chaos") < threshold and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = "a" if kills % 2 == 0 else "b"
        live[victim].send_signal(signal.SIGKILL)
        live[victim].wait()
        kills += 1
        # Alternate: the successor has the same name (resumes its own leftovers) or a new one
        # (the orphans are taken over by XAUTOCLAIM after the idle time).
        name = victim if kills % 4 < 2 else f"{victim}{kills}"
        live[victim] = fleet.worker(name, [0, 1] if victim == "a" else [2, 3], env=fast)
    _out, err = collector.communicate(timeout=300)
    codes = [w.wait(timeout=120) for w in live.values()]
    assert collector.returncode == 1, err  # 1: some prompts failed (the poison ones)
    assert f"wrote {n} of {n} results ({n - len(poison)} ok, {len(poison)} failed)" in err
    assert codes == [0, 0], [log.read_text()[-2000:] for log in fleet.logs]
    assert kills == 8
    check_output(fleet.tmp / "chaos.jsonl", n, poison)


def test_a_dead_and_a_stalled_endpoint_leave_the_job_to_the_healthy_ones(
    fleet_factory: FleetFactory,
) -> None:
    n = 6000
    poison = {11, 4444}
    fleet = fleet_factory(4)
    assert fleet.enqueue("nodes", n, poison).wait(timeout=120) == 0
    collector = fleet.collect("nodes")
    quick = {**QUICK, "SWARM_INFLIGHT_MAX": "64"}
    dying = fleet.worker("dying", [0], env=quick)
    stalling = fleet.worker("stalling", [1], env=quick)
    healthy = [fleet.worker("h1", [2], env=quick), fleet.worker("h2", [3], env=quick)]
    # Both doomed workers must be at work (past their /health wait) when their endpoints go.
    deadline = time.monotonic() + 60
    while fleet.done("nodes") < 500 or not all(
        "taking work" in log.read_text() for log in fleet.logs[:2]
    ):
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.01)
    fleet.faults(0, die_after_s=0.0)
    fleet.faults(1, stall_after_s=0.0)
    _out, err = collector.communicate(timeout=300)
    assert collector.returncode == 1, err
    # The job is over: the burst worker of the stalled endpoint does not linger on its probe.
    assert stalling.wait(timeout=10) == 0
    assert [w.wait(timeout=120) for w in (dying, *healthy)] == [0, 0, 0]
    check_output(fleet.tmp / "nodes.jsonl", n, poison)
    logs = [log.read_text() for log in fleet.logs]
    # (The stalled one's circuit opens only if its requests time out before the job ends:
    # once it has, they are cut short.)
    assert "circuit open" in logs[0]
    assert "released" in logs[0] + logs[1]


def test_a_burst_worker_whose_endpoint_stalls_exits_within_seconds_of_the_jobs_end(
    fleet_factory: FleetFactory,
) -> None:
    n = 600
    fleet = fleet_factory(2)
    assert fleet.enqueue("tail", n, set()).wait(timeout=60) == 0
    quick = {"SWARM_REQUEST_TIMEOUT_S": "2", "SWARM_PROBE_TIMEOUT_S": "1"}
    stalling = fleet.worker("stalling", [1], env=quick)
    wait_until("the stalling worker at work", lambda: "taking work" in fleet.logs[0].read_text())
    fleet.faults(1, stall_after_s=0.0)  # every request and every probe now hangs
    healthy = fleet.worker("healthy", [0], env=quick)
    assert healthy.wait(timeout=120) == 0
    assert fleet.done("tail") == n
    # The job is over; the stalled endpoint's worker sees it (between two probes, or with its
    # requests still hanging, which it then cuts short) and exits.
    assert stalling.wait(timeout=5) == 0, fleet.logs[0].read_text()[-2000:]


def test_a_burst_worker_whose_every_endpoint_died_exits_1_and_leaves_the_work_to_others(
    fleet_factory: FleetFactory,
) -> None:
    """Seen on a real vLLM: the engine process died (a CPU build's bug) and its burst worker
    probed it for ten minutes, never exiting, burning the allocation. Now it gives up after
    SWARM_ENDPOINT_DEAD_S, exits 1 naming the endpoint, and another worker finishes the job."""
    n = 4000
    fleet = fleet_factory(2)
    assert fleet.enqueue("left", n, set()).wait(timeout=60) == 0
    quick = {**QUICK, "SWARM_ENDPOINT_DEAD_S": "3"}
    doomed = fleet.worker("doomed", [0], env=quick)
    wait_count("the doomed worker at work", lambda: fleet.done("left"), 201)
    fleet.faults(0, die_after_s=0.0)
    # Bounded: before, it probed the dead port for ever.
    assert doomed.wait(timeout=120) == 1
    log = fleet.logs[0].read_text()
    assert f"every endpoint died: {fleet.url(0)}: no answer for " in log, log[-3000:]
    left = n - fleet.done("left")
    assert left > 0  # it left work: the job was not failed, nor held
    assert fleet.worker("rescuer", [1], env=quick).wait(timeout=240) == 0
    out = fleet.tmp / "left.jsonl"
    assert collect(fleet.env, "left", out).returncode == 0
    check_output(out, n, set())


def test_redis_restarted_mid_job_everyone_reconnects_and_nothing_is_lost(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    n = 10_000
    poison = {3, 9_999}
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = redis_server(appendonly=True, workdir=str(workdir)).start()
    try:
        fleet = fleet_factory(2, url=server.url)
        producer = fleet.enqueue("restart", n, poison)
        # (a --burst worker started before the job exists has nothing to drain and ends at
        # once, never meeting the restart: seen once, on a loaded machine)
        with redis.Redis.from_url(server.url) as client:
            meta = Keys(fleet.prefix).meta("restart")
            wait_until("the job created", lambda: client.exists(meta))
        workers = [fleet.worker("w1", [0]), fleet.worker("w2", [1])]
        collector = fleet.collect("restart")
        # Both workers up (a loaded machine starts one late: it would first meet Redis after
        # the restart, with nothing to reconnect to) and the job under way.
        while fleet.done("restart") < 3000 or not all(
            f"worker {name}:" in log.read_text()
            for name, log in zip(("w1", "w2"), fleet.logs[:2], strict=True)
        ):
            time.sleep(0.01)
        server.stop()  # a clean restart: AOF flushed, the same data comes back
        time.sleep(2)  # the outage's length (a restart takes a while), not a wait for anything
        server.start()
        assert producer.wait(timeout=120) == 0, (tmp_path / "enqueue-restart.log").read_text()
        _out, err = collector.communicate(timeout=300)
        assert collector.returncode == 1, err
        assert f"wrote {n} of {n} results" in err
        assert [w.wait(timeout=120) for w in workers] == [0, 0], [
            log.read_text()[-2000:] for log in fleet.logs
        ]
        check_output(fleet.tmp / "restart.jsonl", n, poison)
        # Workers that had reached Redis waited for it, and said so (a first contact that
        # fails is an error instead: tests/test_redis_reach.py). (The collector, between two
        # reads then, may never have seen it gone.)
        for log in fleet.logs:
            said = log.read_text()
            assert f"Redis at {server.url} does not answer: reconnecting" in said
            assert re.search(rf"Redis at {re.escape(server.url)} answers again after \d", said)
    finally:
        server.close()


def test_entries_a_restart_delivered_with_a_lost_reply_are_taken_back_at_once(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A stream read whose reply goes with its connection (Redis restarting) has delivered
    entries to the worker's consumer that the worker never received, and redis-py's retry
    on a new connection hides the loss: seen, a restarted run waited the claim idle time
    (60 s) for one batch. A worker whose connection was lost looks for its own leftovers
    again and takes them back at once (here the claim idle time is 10 minutes)."""
    n = 400
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = redis_server(appendonly=True, workdir=str(workdir)).start()
    worker = None
    try:
        fleet = fleet_factory(1, "--step-ms", "20", url=server.url)
        assert fleet.enqueue("lost", n, set()).wait(timeout=60) == 0
        worker = fleet.worker("w", [0], burst=False, SWARM_CLAIM_IDLE_MS="600000")
        wait_count("the worker's first answers", lambda: fleet.done("lost"), 32)
        stream = f"{fleet.prefix}:{{lost}}:q"
        worker.send_signal(signal.SIGSTOP)
        try:
            with redis.Redis(port=server.port) as client:
                (consumer,) = [c["name"] for c in client.xinfo_consumers(stream, "workers")]
                # Delivered to the worker's consumer; the reply never reaches the worker.
                got = client.xreadgroup("workers", consumer, {stream: ">"}, count=2)
                assert len(got[0][1]) == 2  # (two chunks: 32 prompts)
            server.stop()  # a clean restart: AOF flushed, the same data comes back
            server.start()
        finally:
            worker.send_signal(signal.SIGCONT)
        assert wait_count("job lost done", lambda: fleet.done("lost"), n, stall_s=60) == n
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
        server.close()


def test_sigterm_finishes_batches_in_flight_or_leaves_them_for_the_successor(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(1, "--step-ms", "40")  # a batch takes about half a second
    n = 1200
    assert fleet.enqueue("stop", n, set()).wait(timeout=60) == 0
    client = redis.Redis.from_url(fleet.redis_url)
    stream = f"{fleet.prefix}:{{stop}}:q"

    def in_flight() -> int:
        return int(client.xpending(stream, "workers")["pending"])

    try:
        for grace, expect_left in (("30", False), ("0.1", True)):
            worker = fleet.worker("w", [0], SWARM_SHUTDOWN_GRACE_S=grace)
            while in_flight() == 0:
                time.sleep(0.005)
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0
            log = fleet.logs[-1].read_text()
            assert "stopping: finishing batches in flight" in log
            if expect_left:  # cancelled after the grace period: still pending, not lost
                assert "grace period over" in log and in_flight() > 0
            else:  # finished and committed within the grace period
                assert in_flight() == 0 and fleet.done("stop") > 0
        successor = fleet.worker("w", [0])  # same name: resumes its own leftovers first
        assert successor.wait(timeout=120) == 0
        assert "resuming" in fleet.logs[-1].read_text()
        assert fleet.done("stop") == n and in_flight() == 0
    finally:
        client.close()


def test_a_worker_killed_every_second_or_so_under_one_name_dead_letters_nothing(
    fleet_factory: FleetFactory,
) -> None:
    """A restart taking back its own batches is no death against them: only a batch running
    when its worker died counts. Each restart takes back hundreds of entries that wait for a
    slot, and a kill while they wait is not theirs; counting it dead-lettered innocent prompts
    (3,831 of 10,000 in 36 kills, before)."""
    n = 20_000
    fleet = fleet_factory(2, "--step-ms", "10")
    assert fleet.enqueue("kills", n, set()).wait(timeout=60) == 0
    client = redis.Redis.from_url(fleet.redis_url)
    stream = f"{fleet.prefix}:{{kills}}:q"
    rng = random.Random(7)
    kills = 0
    # Below the default of 8, so the old counting fails here (88 of 20,000 dead-lettered at
    # 4); not as low as 3, where a prompt that happens to be running at 4 of the kills is, by
    # design, taken for one that kills workers (seen once under CI's load).
    limit = {"SWARM_MAX_DELIVERIES": "4"}
    try:
        while kills < 8 and fleet.done("kills") < n:
            before = fleet.done("kills")
            worker = fleet.worker("k", [0, 1], env=limit)
            # Killed while it holds work, at a moment drawn at random once it has answered:
            # the fault being modelled. (Under CPU pressure a worker killed before its
            # first answers reran the same leftovers at each kill, and two prompts ran at five
            # of the eight: dead-lettered as a worker-killer is, by design.)
            wait_until(
                "the worker holds work", lambda: client.xpending(stream, "workers")["pending"] > 0
            )
            wait_until("the worker's first answer", lambda b=before: fleet.done("kills") > b)
            time.sleep(rng.uniform(1.0, 2.0))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
        last = fleet.worker("k", [0, 1], env=limit)
        assert last.wait(timeout=120) == 0, fleet.logs[-1].read_text()[-2000:]
    finally:
        client.close()
    assert kills >= 8
    collector = fleet.collect("kills")
    _out, err = collector.communicate(timeout=120)
    assert collector.returncode == 0, err  # 0: every prompt answered, none dead-lettered
    check_output(fleet.tmp / "kills.jsonl", n, set())


@pytest.mark.parametrize("arq_cli", [False, True])
def test_a_worker_whose_redis_went_away_stops_within_its_grace_on_sigterm(
    fleet_factory: FleetFactory, arq_cli: bool
) -> None:
    """Seen: burst arq workers whose Redis went away were still alive 85 s after SIGTERM
    (each write of their shutdown waited minutes for Redis). Their work stays queued in
    Redis; a stop must not wait on a Redis that is not there past the grace period."""
    with redis_server() as server:
        fleet = fleet_factory(1, "--step-ms", "50", url=server.url)
        assert fleet.enqueue("j", 3000, set()).wait(timeout=60) == 0
        worker = fleet.worker("w", [0], arq_cli=arq_cli, SWARM_SHUTDOWN_GRACE_S="3")
        wait_until("the worker under way", lambda: fleet.done("j") > 0)
        server.stop()
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)
        took = time.monotonic() - t0
    # The grace period (3 s), then at most the watch past it (10 s), and the process's exit.
    assert took < 3 + 10 + 5, f"stopped {took:.0f} s after SIGTERM"
    assert "Redis does not answer: stopping without the last writes" in fleet.logs[0].read_text()
