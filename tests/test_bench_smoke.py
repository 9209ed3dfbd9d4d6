"""A smoke run of every benchmark scenario at tiny size: the harness, the baselines and the
system all work end to end. (The speed targets are proven by the full run, not here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_every_benchmark_scenario_runs_at_tiny_size() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    scenarios = {s["name"]: s for s in json.loads((ROOT / "bench/out/smoke.json").read_text())}
    assert list(scenarios) == [
        "homogeneous",
        "heterogeneous",
        "dead_node",
        "overhead",
        "scale",
        "latency",
        "priority",
    ]
    # Priority compares the system with itself (alone, urgent, same priority): the baselines
    # have no notion of jobs side by side.
    priority = scenarios.pop("priority")
    assert [r["system"] for r in priority["rows"]] == [
        "alone, idle fleet",
        "priority 1, behind the big job",
        "same priority 0 (fair share)",
    ]
    assert all(r["answered"] == r["prompts"] > 0 and r["wall_s"] > 0 for r in priority["rows"])
    for name, sc in scenarios.items():
        rows = {r["system"]: r for r in sc["rows"]}
        assert all(r["wall_s"] > 0 for r in rows.values())
        if name == "scale":
            assert [r["answered"] for r in sc["rows"]] == [r["prompts"] for r in sc["rows"]]
            assert sc["rows"][0]["prompts"] > 0 and len(sc["rows"]) == 6
            assert {"static round-robin", "naive gather", "arq, one job per prompt"} <= set(rows)
            continue
        assert rows["swarm-queue"]["answered"] == rows["swarm-queue"]["prompts"] > 0
        # every baseline, side by side, in every scenario
        assert {"static round-robin", "naive gather", "arq, one job per prompt"} <= set(rows)
    latency = {r["system"]: r["extra"] for r in scenarios["latency"]["rows"]}
    assert latency["swarm-queue"]["first_result_s"] > 0
    assert latency["swarm-queue"]["mean_wait_s"] >= 0
