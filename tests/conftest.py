"""Shared fixtures: a real Redis (the machine's, or one started here), per-test key prefixes,
in-process swarm-sim fleets.

Redis: a redis-server each test process starts for itself (tests/servers.py says which binary),
never one that merely answers on 6379, which may be somebody else's; ``SWARM_TEST_REDIS_URL``
names one of your own instead. Each test gets its own key prefix, deleted afterwards, so tests
never see each other's keys.

``--cpu-stress N`` runs N busy processes beside the suite for its whole run: the promises
(exactly once, dedup, counts) must hold on a loaded machine too, e.g. ``pytest -n 8
--cpu-stress 4`` on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from swarm_queue.common.embedded import free_port
from swarm_queue.common.keys import ARQ_TAG
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet
from tests.servers import redis_server

if TYPE_CHECKING:
    from tests.harness import Fleet, FleetFactory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-stress",
        type=int,
        default=0,
        metavar="N",
        help="run N busy processes beside the suite (promises must hold under load)",
    )


_hogs: list[subprocess.Popen[bytes]] = []


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller runs the hogs
        return
    for _ in range(config.getoption("--cpu-stress")):
        _hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))


def pytest_unconfigure(config: pytest.Config) -> None:
    for hog in _hogs:
        hog.kill()
        hog.wait()
    _hogs.clear()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("SWARM_TEST_REDIS_URL", "").strip()
    if url:
        yield url
    else:
        with redis_server() as server:
            yield server.url


def _glob(pattern: str) -> str:
    """``pattern`` for SCAN MATCH with the braces of a hash tag taken literally."""
    return pattern.replace("{", "\\{").replace("}", "\\}")


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        # The prefix's keys, and arq's (under arq's hash tag: see Keys.arq_queue).
        patterns = [f"{name}:*", f"{ARQ_TAG}:{name}:*", f"arq:*{ARQ_TAG}:{name}:*"]
        keys = [k for p in patterns for k in client.scan_iter(match=_glob(p), count=1000)]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def make_settings(redis_url: str, prefix: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "prefix": prefix,
            "worker_name": "test",
            "poll_ms": 50,
            "jobs_refresh_s": 0.05,
            "backoff_base_s": 0.01,
            "backoff_cap_s": 0.05,
        }
        if "inflight" in overrides:  # a test that sets the window means that window, fixed
            values["inflight_max"] = 0
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def cli_env(redis_url: str, prefix: str) -> dict[str, str]:
    """The environment of a command run against this test's Redis and prefix."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    return {**e, "SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[JobStore]:
    s = JobStore.from_settings(settings)
    yield s
    await s.close()


FAST = EngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0)


@pytest.fixture
def sim_fleet() -> Callable[..., SimFleet]:
    """Factory: ``sim_fleet(n, config=..., faults=[...], **endpoint_kwargs)`` -> unstarted fleet."""

    def make(
        n: int,
        config: EngineConfig = FAST,
        faults: list[FaultConfig] | None = None,
        **kwargs: Any,
    ) -> SimFleet:
        return SimFleet(
            [
                SimEndpoint(free_port(), config, (faults or [FaultConfig()] * n)[i], **kwargs)
                for i in range(n)
            ]
        )

    return make


@pytest.fixture
def fleet_factory(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[FleetFactory]:
    """Factory: ``fleet_factory(n_ports, *sim_args)`` -> a swarm-sim process with helpers for
    worker processes around this test's Redis and prefix; everything is killed at the end."""
    from tests.harness import Fleet

    fleets: list[Fleet] = []

    class _Fleet(Fleet):
        def __init__(self, n_ports: int, *sim_args: str, url: str = redis_url) -> None:
            super().__init__(tmp_path, url, prefix, n_ports, *sim_args)
            fleets.append(self)

    yield _Fleet
    for f in fleets:
        f.close()
