"""The embedded Redis (the demo's, the suite's, a producer's without a URL) runs on a port of
its own: a port it picked that another process took before the server bound it (seen in CI: a
cluster node exited with 1 under the suite's load) is left for another, and a server that
answers on the port is only taken for this one once this one said it is ready."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from swarm_queue.common import embedded
from swarm_queue.common.embedded import free_port
from tests.servers import redis_server


@contextmanager
def _held() -> Iterator[int]:
    """A port another process's socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_server_whose_picked_port_was_taken_meanwhile_starts_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _held() as held:
        ports = iter([held, free_port()])
        monkeypatch.setattr(embedded, "free_port", lambda pair=0: next(ports))
        with redis_server() as server:
            assert server.port != held
            with redis.Redis(port=server.port) as client:
                assert client.info("server")["process_id"] == server.proc.pid


def test_a_cluster_node_picks_its_port_with_its_bus_port_free_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []

    def pick(pair: int = 0) -> int:
        asked.append(pair)
        return free_port(pair)

    monkeypatch.setattr(embedded, "free_port", pick)
    redis_server(extra_args=("--cluster-enabled", "yes")).close()
    assert asked == [10_000]


def test_a_port_given_and_taken_fails_with_the_servers_own_reason() -> None:
    with _held() as held:
        server = redis_server(held)
        try:
            with pytest.raises(RuntimeError, match=f"could not bind port {held}: .*in use"):
                server.start()
        finally:
            server.close()


def test_ports_picked_one_after_another_before_any_is_bound_all_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in CI: a fleet's four endpoints given the same port twice (free when each was
    picked, as none was bound yet), its simulator exiting at once."""
    first = free_port()
    with socket.socket() as s:  # (a port free now that this process has not given out)
        s.bind(("127.0.0.1", 0))
        other = s.getsockname()[1]
    picks = iter([first, other])
    monkeypatch.setattr(random, "randrange", lambda lo, hi: next(picks))
    assert free_port() == other
