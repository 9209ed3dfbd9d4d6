"""One fleet, many jobs, many models, with real worker processes and real Redis: a job whose
model no endpoint serves waits visibly and never stops the fleet or the other jobs."""

from __future__ import annotations

import signal
import subprocess

import msgspec
import pytest

from swarm_queue.common.keys import Keys
from tests.harness import (
    BIN,
    Fleet,
    FleetFactory,
    check_output,
    command,
    fleet_prompt,
    sync_client,
    wrong_key_endpoint,
)
from tests.helpers import wait_count, wait_until

pytestmark = pytest.mark.slow

N_A, N_B, N_C = 2000, 1500, 300


def _status(fleet: Fleet, *args: str) -> str:
    out = subprocess.run(
        [BIN / args[0], *args[1:]], env=fleet.env, capture_output=True, text=True, timeout=60
    )
    return out.stdout + out.stderr


def _queue_three_jobs(fleet: Fleet) -> None:
    # C first: the job nobody serves is the first one every worker sees.
    for job, n, model in (("c", N_C, "model-c"), ("a", N_A, "model-a"), ("b", N_B, "model-b")):
        enqueue = fleet.enqueue(job, n, set(), "--model", model)
        assert enqueue.wait(timeout=60) == 0


def test_jobs_for_two_models_finish_while_a_third_waits_for_its_endpoint(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(2, "--model", "model-a,model-b")
    _queue_three_jobs(fleet)
    worker = fleet.worker("w", [0, 1], burst=False)
    wait_count("jobs a and b done", lambda: fleet.done("a") + fleet.done("b"), N_A + N_B)
    # Every prompt went to the endpoint serving its model, and nothing else reached it.
    assert (fleet.answered(0), fleet.answered(1)) == (N_A, N_B)
    assert fleet.done("c") == 0
    assert worker.poll() is None, fleet.logs[0].read_text()[-2000:]
    waiting = "no live endpoint serves model 'model-c'; live endpoints serve: model-a, model-b"
    wait_until("c shown waiting", lambda: waiting in _status(fleet, "swarm-status", "c"))
    assert _status(fleet, "swarm-status", "c").startswith("job c: waiting\n")
    jobs = {line.split()[0]: line.split()[1] for line in _status(fleet, "swarm-jobs").splitlines()}
    assert (jobs["a"], jobs["b"], jobs["c"]) == ("finished", "finished", "waiting")

    # An endpoint serving model-c appears: c starts and finishes, on it alone.
    fleet_c = fleet_factory(1, "--model", "model-c")
    worker_c = fleet_c.worker("wc", [0], burst=False)
    assert wait_count("job c done", lambda: fleet.done("c"), N_C) == N_C
    assert fleet_c.answered(0) == N_C
    assert (fleet.answered(0), fleet.answered(1)) == (N_A, N_B)
    for w in (worker, worker_c):
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=60) == 0
    for job, n in (("a", N_A), ("b", N_B), ("c", N_C)):
        collect = fleet.collect(job)
        collect.communicate(timeout=60)
        assert collect.returncode == 0
        check_output(fleet.tmp / f"{job}.jsonl", n, set())
    log = fleet.logs[0].read_text()
    assert "unusable" not in log and "no usable endpoint" not in log


def test_burst_workers_exit_0_once_their_models_jobs_are_done(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(2, "--model", "model-a,model-b")
    _queue_three_jobs(fleet)
    workers = [fleet.worker("wa", [0]), fleet.worker("wb", [1])]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    assert (fleet.done("a"), fleet.done("b"), fleet.done("c")) == (N_A, N_B, 0)
    assert (fleet.answered(0), fleet.answered(1)) == (N_A, N_B)
    for log in fleet.logs:
        last = [x for x in log.read_text().splitlines() if "waiting for other endpoints" in x]
        assert len(last) == 1 and last[0].endswith("c (model 'model-c')"), last


def test_a_burst_worker_with_an_unusable_endpoint_finishes_the_job_then_exits_1(
    fleet_factory: FleetFactory,
) -> None:
    with wrong_key_endpoint() as locked:
        fleet = fleet_factory(1)
        assert fleet.enqueue("j", 500, set()).wait(timeout=60) == 0
        worker = fleet.worker("w", [0], SWARM_ENDPOINTS=f"{locked},{fleet.url(0)}")
        assert worker.wait(timeout=120) == 1
    assert fleet.done("j") == 500 and fleet.answered(0) == 500
    log = fleet.logs[0].read_text()
    assert f"exiting with an error: endpoint unusable: {locked}: HTTP 401: invalid API key" in log


def test_two_models_and_an_unusable_endpoint_in_one_burst_worker(
    fleet_factory: FleetFactory,
) -> None:
    """The shared case at once: jobs for two models, the job nobody serves, and one endpoint
    with a wrong key, all in one worker. Both served jobs finish exactly on their endpoints;
    the worker exits 1 for its broken endpoint, with the unserved job still waiting."""
    with wrong_key_endpoint() as locked:
        fleet = fleet_factory(2, "--model", "model-a,model-b")
        _queue_three_jobs(fleet)
        endpoints = f"{fleet.url(0)},{locked},{fleet.url(1)}"
        worker = fleet.worker("w", [0, 1], SWARM_ENDPOINTS=endpoints)
        assert worker.wait(timeout=120) == 1
    assert (fleet.done("a"), fleet.done("b"), fleet.done("c")) == (N_A, N_B, 0)
    assert (fleet.answered(0), fleet.answered(1)) == (N_A, N_B)
    log = fleet.logs[0].read_text()
    assert f"exiting with an error: endpoint unusable: {locked}: HTTP 401" in log
    assert "c (model 'model-c')" in log


def test_a_job_without_a_model_answered_by_two_models_says_so_and_each_line_names_its_model(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(2, "--model", "model-a,model-b")
    worker = fleet.worker("w", [0, 1], burst=False)
    client = sync_client(fleet.redis_url)
    try:
        wait_until("both endpoints published", lambda: client.hlen(Keys(fleet.prefix).fleet) == 2)
    finally:
        client.close()
    src = fleet.tmp / "any.txt"
    src.write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(400)))
    queued = command(fleet.env, "swarm-enqueue", src, "--job", "any", "--max-tokens", "12")
    assert queued.returncode == 0, queued.stderr
    assert (
        "swarm-enqueue: warning: the live endpoints serve 2 models (model-a, model-b): a job "
        "without --model is answered by whichever each endpoint serves, so its answers would "
        "mix them; give --model NAME"
    ) in queued.stderr
    assert wait_count("job any done", lambda: fleet.done("any"), 400) == 400
    # Its endpoints' figures are published every period: the warning follows them.
    wait_until("the warning", lambda: "is being answered by 2 models" in _stderr(fleet, "any"))
    warning = _stderr(fleet, "any")
    assert f"model-a ({fleet.url(0)}); model-b ({fleet.url(1)})" in warning
    assert "queue it with --model NAME to pin one" in warning
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    collect = fleet.collect("any")
    _out, err = collect.communicate(timeout=60)
    assert collect.returncode == 0
    lines = [msgspec.json.decode(x) for x in (fleet.tmp / "any.jsonl").read_bytes().splitlines()]
    by_endpoint = {fleet.url(0): "model-a", fleet.url(1): "model-b"}
    assert {x["model"] for x in lines} == {"model-a", "model-b"}
    assert all(x["model"] == by_endpoint[x["endpoint"]] for x in lines)
    a = sum(x["model"] == "model-a" for x in lines)
    assert f"job any: answered by 2 models: model-a {a}, model-b {400 - a}" in err


def _stderr(fleet: Fleet, job: str) -> str:
    out = command(fleet.env, "swarm-status", job)
    assert out.returncode == 0, out.stderr
    return out.stderr
