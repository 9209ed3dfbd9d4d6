"""``swarm-redis``: a Redis of one's own from the project (AOF in a data directory, a socket
only its user opens, or TCP behind a generated password), that the commands and a worker
use through the URL it prints, whose data outlives a stop and a start; and every command
says when it uses the default Redis because none was given."""

from __future__ import annotations

import argparse
import os
import re
import stat
from pathlib import Path

import pytest
import redis

from swarm_queue.common.cli import settings_from_args
from swarm_queue.common.embedded import free_port
from tests.harness import Fleet, check_output, collect, command

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}, **extra}


def test_a_local_redis_runs_a_job_and_keeps_its_data_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "r"
    env = _env()
    assert command(env, "swarm-redis", "status", "--dir", data).returncode == 3
    started = command(env, "swarm-redis", "start", "--dir", data)
    try:
        assert started.returncode == 0, started.stderr
        lines = started.stdout.splitlines()
        assert re.fullmatch(rf"swarm-redis: started \(pid \d+\), its data in {data} \(AOF on\)",
                            lines[0])  # fmt: skip
        url = f"unix://{data}/redis.sock"
        assert lines[1] == f"export SWARM_REDIS_URL={url}"
        assert command(env, "swarm-redis", "url", "--dir", data).stdout.strip() == url
        # Only its user may open its socket, and nobody but its user reads its files.
        assert stat.S_IMODE((data / "redis.sock").stat().st_mode) == 0o700
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        again = command(env, "swarm-redis", "start", "--dir", data)
        assert again.stdout.startswith("swarm-redis: already running")

        fleet = Fleet(tmp_path, url, "mine", 1)
        try:
            assert fleet.enqueue("own", 40, {7}).wait(timeout=60) == 0
            assert fleet.worker("w", [0]).wait(timeout=120) == 0, fleet.logs[-1].read_text()
            assert command(env, "swarm-redis", "stop", "--dir", data).stdout.startswith(
                "swarm-redis: stopped"
            )
            assert command(env, "swarm-redis", "status", "--dir", data).returncode == 3
            assert command(env, "swarm-redis", "start", "--dir", data).returncode == 0
            status = command(env, "swarm-redis", "status", "--dir", data)
            assert status.returncode == 0 and "running (pid" in status.stdout
            out = tmp_path / "own.jsonl"
            assert collect(fleet.env, "own", out).returncode == 1  # one prompt failed
            check_output(out, 40, {7})  # every answer there after the restart
        finally:
            fleet.close()
    finally:
        command(env, "swarm-redis", "stop", "--dir", data)
    assert command(env, "swarm-redis", "url", "--dir", data).returncode == 1


def test_a_local_redis_on_tcp_sits_behind_a_password_it_never_prints(tmp_path: Path) -> None:
    data = tmp_path / "t"
    port = free_port()
    env = _env()
    started = command(env, "swarm-redis", "start", "--dir", data, "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        password = (data / "password").read_text().strip()
        assert len(password) >= 24
        assert stat.S_IMODE((data / "password").stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "redis.conf").stat().st_mode) == 0o600
        assert started.stdout.splitlines()[1] == (
            f'export SWARM_REDIS_URL="$(swarm-redis url --dir {data})"   '
            f"# redis://:***@127.0.0.1:{port}/0"
        )
        status = command(env, "swarm-redis", "status", "--dir", data)
        assert password not in started.stdout + status.stdout + status.stderr
        url = command(env, "swarm-redis", "url", "--dir", data).stdout.strip()
        assert url == f"redis://:{password}@127.0.0.1:{port}/0"
        with redis.Redis(port=port) as stranger, pytest.raises(redis.AuthenticationError):
            stranger.ping()
        with redis.Redis.from_url(url) as owner:
            assert owner.ping()
    finally:
        command(env, "swarm-redis", "stop", "--dir", data)


@pytest.mark.parametrize(
    ("given", "said"),
    [({}, True), ({"SWARM_REDIS_URL": "redis://127.0.0.1:6379/0"}, False)],
)
def test_a_command_says_when_it_uses_the_default_redis(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], given: dict[str, str],
    said: bool,
) -> None:  # fmt: skip
    monkeypatch.delenv("SWARM_REDIS_URL", raising=False)
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("sys.argv", ["swarm-status"])
    settings = settings_from_args(argparse.Namespace(redis=None))
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    note = (
        "swarm-status: using the default Redis redis://127.0.0.1:6379/0 (SWARM_REDIS_URL is "
        "not set; `swarm-redis start` runs one of your own)\n"
    )
    assert capsys.readouterr().err == (note if said else "")
    settings_from_args(argparse.Namespace(redis="redis://elsewhere:6379/0"))
    assert capsys.readouterr().err == ""
