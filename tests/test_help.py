"""Every installed command answers --help with its usage, exit 0, without a Redis or an
endpoint (seen: swarm-tools --help printed an error)."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.harness import command

pytestmark = pytest.mark.slow

SCRIPTS = sorted(
    tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"
    ]["scripts"]
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_command_answers_help(script: str) -> None:
    # No Redis to reach: a command that tried would fail, not print its usage.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SWARM_")},
           "SWARM_REDIS_URL": "redis://127.0.0.1:9/0"}  # fmt: skip
    done = command(env, script, "--help", timeout_s=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}"), done.stdout[:200]
    assert done.stderr == ""
    # Read by people, not Sphinx (seen: ``swarm-status JOB`` and :mod:`producer.dashboard`).
    assert not re.search(r"``|:[a-z]+:`", done.stdout), done.stdout
