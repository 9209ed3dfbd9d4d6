"""docs/MIGRATING.md's runnable example of every Aurora-Swarm pattern on the embedded setup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def _run(example: str) -> dict[str, str]:
    """The example's output lines, by their first word; it must exit 0."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line for line in out.stdout.splitlines()}


def test_every_aurora_pattern_runs_on_the_embedded_setup() -> None:
    lines = _run("from_aurora.py")
    assert "40 answers in order" in lines["scatter_gather"]
    assert "8 answers to one prompt" in lines["broadcast"]
    assert "one answer from 40 inputs" in lines["tree_reduce"]
    assert "40/40 inputs through 3 steps" in lines["pipeline"]
    assert "3 rounds, board {'hypotheses': 6, 'critiques': 3}" in lines["blackboard"]
    assert "40 vectors" in lines["embeddings"]
    assert "mean majority share" in lines["self-consistency"]
    assert "10 prompts, max" in lines["semantic_entropy"]


def test_the_agents_example_runs_on_the_embedded_setup() -> None:
    lines = _run("agents.py")
    assert "after 3 turns" in lines["agent"]
    assert "50/50 answered as data, 150 turns" in lines["agents"]
    assert "of prompt tokens from the engines' prefix cache" in lines["prefix"]
