"""Settings are read the same way by every entry point: the commands, the worker, the tool
runner and the Python API (issue 46, item 14), and no secret is printed on the way."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.sim.server import SimFleet
from tests.harness import BIN


async def test_the_api_reads_its_settings_as_every_command_does(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet], tmp_path: Path
) -> None:
    """Seen: ``Swarm()`` ignored ``SWARM_REDIS_URL`` and ``SWARM_HOSTFILE`` and took no
    hostfile. Now the environment's ``SWARM_*`` settings, then its arguments."""
    from swarm_queue.producer.api import Swarm

    env = {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix, "SWARM_BATCH_SIZE": "7"}
    async with Swarm(env=env) as swarm:
        assert swarm.settings is not None
        s = swarm.settings
        assert (s.redis_url, s.prefix, s.batch_size, s.endpoints) == (redis_url, prefix, 7, ())
    async with sim_fleet(1) as fleet:
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"127.0.0.1\t{fleet.endpoints[0].port}\n")
        async with Swarm(env=env, hostfile=str(hostfile)) as swarm:
            assert swarm.settings is not None
            assert [e.url for e in swarm.settings.endpoints] == fleet.urls
        async with Swarm(env={**env, "SWARM_HOSTFILE": str(hostfile)}, batch_size=3) as swarm:
            assert swarm.settings is not None
            assert [e.url for e in swarm.settings.endpoints] == fleet.urls
            assert swarm.settings.batch_size == 3  # an argument over the environment
    with pytest.raises(ConfigError, match="no Redis URL and no endpoints"):
        Swarm(env={})


@pytest.mark.parametrize("command", ["swarm-worker", "swarm-tools"])
def test_the_worker_and_the_tool_runner_take_redis_and_never_echo_a_password(
    command: str,
) -> None:
    """Seen: ``swarm-worker --redis URL`` refused (the README said any command takes it),
    and argparse echoed the URL, password and all."""
    url = "redis://alice:s3cret-pw@127.0.0.1:1/0"
    usage = subprocess.run(
        [BIN / command, "--redis", url, "--no-such-flag=" + url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert usage.returncode == 2
    assert "s3cret-pw" not in usage.stderr + usage.stdout
    assert "unrecognized arguments: --no-such-flag=redis://alice:***@127.0.0.1:1/0" in (
        usage.stderr
    )
    repo = str(Path(__file__).resolve().parent.parent)  # tests.agent_tools importable
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env["PYTHONPATH"] = repo
    unreached = subprocess.run(
        [BIN / command, "--redis", url],
        env={**env, "SWARM_TOOLS": "tests.agent_tools:*", "SWARM_ENDPOINTS": "127.0.0.1:1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unreached.returncode != 0
    assert "s3cret-pw" not in unreached.stderr + unreached.stdout
    assert "redis://alice:***@127.0.0.1:1/0" in unreached.stderr
