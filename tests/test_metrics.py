"""The worker's Prometheus metrics (SWARM_METRICS_PORT): scraped from a real worker process
during a job and after it, and checked against Redis."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import Commit, JobStatus
from swarm_queue.worker.prometheus import EndpointGauges, PrometheusMetrics
from tests.harness import FleetFactory
from tests.helpers import wait_until
from tests.servers import redis_server

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _parse(text: str) -> Samples:
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return _parse(resp.read().decode())


def _scrape_soon(port: int) -> Samples:
    """The samples, or none while the worker is not serving them yet."""
    try:
        return _scrape(port)
    except OSError:
        return {}


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


def test_the_hooks_become_prometheus_samples() -> None:
    status = JobStatus("j", 10, 10, 3, 2, 4, 1, 0.0, False)
    m = PrometheusMetrics(
        lambda: [
            EndpointGauges("http://a", 6, 5, "closed"),
            EndpointGauges("http://b", 2, 0, "open"),
        ],
        lambda: {"j": status},
    )
    m.batch("j", "http://a", 32)
    m.request("j", "http://a", 0.3, "ok")
    m.request("j", "http://a", 2.0, "retryable")
    m.retry("j", "http://a")
    m.committed("j", "http://a", Commit(3, 2, {"rejected": 1, "no_choice": 1}))
    s = _parse(m.page().decode())
    assert _sum(s, "swarm_prompts_done_total", job="j", endpoint="http://a") == 3
    assert _sum(s, "swarm_prompts_failed_total", kind="rejected") == 1
    assert _sum(s, "swarm_prompts_failed_total", kind="no_choice") == 1
    assert _sum(s, "swarm_requests_total", outcome="ok") == 1
    assert _sum(s, "swarm_requests_total", outcome="retryable") == 1
    assert _sum(s, "swarm_request_retries_total") == 1
    assert _sum(s, "swarm_request_duration_seconds_count", endpoint="http://a") == 2
    assert _sum(s, "swarm_request_duration_seconds_sum", endpoint="http://a") == pytest.approx(2.3)
    assert _sum(s, "swarm_batch_size_prompts_sum") == 32
    assert _sum(s, "swarm_window_batches", endpoint="http://a") == 6
    assert _sum(s, "swarm_in_flight_batches", endpoint="http://a") == 5
    assert _sum(s, "swarm_circuit_state", endpoint="http://b", state="open") == 1
    assert _sum(s, "swarm_circuit_state", endpoint="http://b") == 1  # one state at a time
    assert _sum(s, "swarm_job_pending_prompts", job="j") == 1
    assert _sum(s, "swarm_job_in_flight_prompts", job="j") == 4


def test_a_job_spread_over_shards_is_one_job_in_the_metrics() -> None:
    """Its shards' batches are counted under the job's label, as its gauges are."""
    m = PrometheusMetrics(lambda: [], lambda: {})
    for name in ("wide", "wide#4", "wide#1"):
        m.request(name, "http://a", 0.1, "ok")
        m.retry(name, "http://a")
        m.committed(name, "http://a", Commit(5, 1, {"rejected": 1}))
    s = _parse(m.page().decode())
    assert {lab["job"] for lab, _ in s["swarm_prompts_done_total"]} == {"wide"}
    assert _sum(s, "swarm_prompts_done_total", job="wide") == 15
    assert _sum(s, "swarm_prompts_failed_total", job="wide", kind="rejected") == 3
    assert _sum(s, "swarm_requests_total", job="wide") == 3
    assert _sum(s, "swarm_request_retries_total", job="wide") == 3


def test_a_bad_metrics_port_is_refused_with_the_variable_named() -> None:
    with pytest.raises(ConfigError, match="SWARM_METRICS_PORT must be <= 65535, got 70000"):
        Settings.from_env({"SWARM_METRICS_PORT": "70000"})
    with pytest.raises(ConfigError, match="SWARM_METRICS_PORT='nine' is not a valid int"):
        Settings.from_env({"SWARM_METRICS_PORT": "nine"})


@pytest.mark.slow
def test_a_worker_serves_metrics_that_agree_with_redis_during_and_after_a_job(
    fleet_factory: FleetFactory, redis_url: str, prefix: str
) -> None:
    n, poison = 400, {5, 277}
    fleet = fleet_factory(2)
    for i in (0, 1):  # every request fails until cleared: the job waits, in flight
        fleet.faults(i, error_rate=1.0)
    port = free_port()
    worker = fleet.worker(
        "metrics",
        [0, 1],
        burst=False,
        SWARM_METRICS_PORT=str(port),
        SWARM_STATS_PERIOD_S="0.2",
        SWARM_CIRCUIT_FAILURES="3",
    )
    assert fleet.enqueue("m", n, poison).wait(timeout=60) == 0
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    meta = f"{prefix}:{{m}}:meta"

    # During: nothing answered, requests failing and retried, the whole job queued or held.
    def failing() -> bool:
        try:
            s = _scrape(port)
        except OSError:
            return False
        assert _sum(s, "swarm_prompts_done_total") == 0
        return _sum(s, "swarm_request_retries_total") > 0 and bool(
            s.get("swarm_job_pending_prompts")
        )

    wait_until("failing requests seen in the metrics", failing)
    s = _scrape(port)
    assert _sum(s, "swarm_requests_total", outcome="retryable") >= _sum(
        s, "swarm_request_retries_total"
    )
    held = _sum(s, "swarm_job_pending_prompts", job="m") + _sum(
        s, "swarm_job_in_flight_prompts", job="m"
    )
    assert held == n
    for url in (fleet.url(0), fleet.url(1)):
        assert _sum(s, "swarm_circuit_state", endpoint=url) == 1  # exactly one state

    for i in (0, 1):
        fleet.faults(i, error_rate=0.0)

    # Each result is counted right after its commit: never more than Redis has, then equal.
    def agrees() -> bool:
        s = _scrape(port)
        done, failed = (int(x or 0) for x in r.hmget(meta, ["done", "failed"]))
        scraped_done = _sum(s, "swarm_prompts_done_total", job="m")
        scraped_failed = _sum(s, "swarm_prompts_failed_total", job="m")
        assert scraped_done <= done and scraped_failed <= failed
        return done + failed == n and (scraped_done, scraped_failed) == (done, failed)

    wait_until("the metrics to count the whole job", agrees)
    s = _scrape(port)
    assert _sum(s, "swarm_prompts_done_total", job="m") == n - len(poison)
    assert _sum(s, "swarm_prompts_failed_total", job="m", kind="rejected") == len(poison)
    assert int(r.hget(meta, "failed:rejected") or 0) == len(poison)
    for url in (fleet.url(0), fleet.url(1)):
        requests = _sum(s, "swarm_requests_total", endpoint=url)
        assert requests > 0  # both endpoints worked, after the faults cleared
        assert _sum(s, "swarm_request_duration_seconds_count", endpoint=url) == requests
    # every prompt went out in some batch, the rejected ones again after bisection
    assert _sum(s, "swarm_batch_size_prompts_sum") >= n
    worker.terminate()
    assert worker.wait(timeout=60) == 0
    r.close()


def test_the_example_dashboard_asks_only_for_metrics_a_worker_serves() -> None:
    dashboard = json.loads((ROOT / "examples" / "grafana" / "swarm-queue.json").read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bswarm_\w+", target["expr"])
    }
    status = JobStatus("j", 2, 2, 1, 1, 0, 0, 0.0, True)
    m = PrometheusMetrics(
        lambda: [EndpointGauges("http://a", 1, 0, "closed")], lambda: {"j": status}
    )
    m.committed("j", "http://a", Commit(1, 1, {"rejected": 1}))
    m.request("j", "http://a", 0.1, "ok")
    m.retry("j", "http://a")
    m.batch("j", "http://a", 1)
    served = set(_parse(m.page().decode()))
    assert asked and asked <= served, asked - served


def test_a_worker_whose_metrics_port_is_taken_stops_at_once_saying_so(
    redis_url: str, prefix: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        env.update(
            SWARM_REDIS_URL=redis_url,
            SWARM_PREFIX=prefix,
            SWARM_ENDPOINTS="http://127.0.0.1:9",
            SWARM_METRICS_PORT=str(port),
            SWARM_METRICS_ADDR="127.0.0.1",
        )
        out = subprocess.run(
            [sys.executable, "-m", "swarm_queue.worker.main", "--burst"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    assert (
        f"SWARM_METRICS_PORT={port}: cannot listen on 127.0.0.1:{port} (Address already in use)"
        in out.stderr
    )


@pytest.mark.slow
def test_while_redis_is_out_of_reach_the_metrics_say_so_and_show_no_stale_figure(
    fleet_factory: FleetFactory,
) -> None:
    with redis_server() as server:
        fleet = fleet_factory(1, url=server.url)
        port = free_port()
        worker = fleet.worker(
            "m", [0], burst=False, SWARM_METRICS_PORT=str(port), SWARM_STATS_PERIOD_S="0.2"
        )
        assert fleet.enqueue("big", 50_000, set()).wait(timeout=60) == 0
        wait_until(
            "the job's gauges", lambda: bool(_scrape_soon(port).get("swarm_job_pending_prompts"))
        )
        s = _scrape(port)
        assert _sum(s, "swarm_redis_up") == 1
        assert _sum(s, "swarm_circuit_state", endpoint=fleet.url(0), state="closed") == 1

        server.stop()  # mid-job
        wait_until("Redis seen out of reach", lambda: _sum(_scrape(port), "swarm_redis_up") == 0)
        s = _scrape(port)
        # No endpoint takes work, none is shown 'closed', and no job's figure from before
        # (on the code before: circuits 'closed' and the last queue figures, as if live).
        assert _sum(s, "swarm_circuit_state", endpoint=fleet.url(0), state="paused") == 1
        assert _sum(s, "swarm_circuit_state", endpoint=fleet.url(0), state="closed") == 0
        assert not s.get("swarm_job_pending_prompts")

        server.start()  # empty: the job is lost with it, and the worker goes on
        wait_until("Redis reached again", lambda: _sum(_scrape(port), "swarm_redis_up") == 1)
        s = _scrape(port)
        assert _sum(s, "swarm_circuit_state", endpoint=fleet.url(0), state="closed") == 1
        worker.terminate()
        assert worker.wait(timeout=60) == 0
