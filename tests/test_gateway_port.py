"""The tests' gateway process lands on a port of its own: one chosen free and taken by another
process before the gateway binds it (seen under CPU pressure: the client then talked to a
swarm-sim and got 404) is left for another."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from swarm_queue.common.embedded import free_port
from tests import gatewayproc as gw


def test_a_gateway_whose_free_port_was_taken_meanwhile_starts_on_another(
    cli_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        ports = iter([held, free_port()])
        monkeypatch.setattr(gw, "free_port", lambda: next(ports))
        with gw.gateway(cli_env, tmp_path) as (proc, port, _log):
            assert port != held
            assert gw.client(port).models.list().object == "list"
            assert proc.poll() is None
