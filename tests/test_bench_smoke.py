"""A smoke run of every benchmark scenario at tiny size, one test per scenario: the harness,
the baselines and the system all work end to end. (The speed targets are proven by the full
run, not here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.rows import Scenario
from bench.run import SCENARIOS, update_report
from bench.startup import ROUTES

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

BASELINES = {"static round-robin", "naive gather", "arq, one job per prompt"}


def _smoke(name: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "smoke.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--only", name, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    scenarios = json.loads(out.read_text())
    assert [s["name"] for s in scenarios] == [name]
    return scenarios[0]


def test_the_scenarios_are_the_ten_reported() -> None:
    assert list(SCENARIOS) == [
        "homogeneous",
        "heterogeneous",
        "dead_node",
        "overhead",
        "scale",
        "latency",
        "priority",
        "strict",
        "fleet_scale",
        "start",
    ]


@pytest.mark.parametrize("name", ["homogeneous", "heterogeneous", "dead_node", "overhead"])
def test_a_scenario_runs_the_system_and_every_baseline(name: str, tmp_path: Path) -> None:
    sc = _smoke(name, tmp_path)
    rows = {r["system"]: r for r in sc["rows"]}
    assert all(r["wall_s"] > 0 for r in rows.values())
    assert rows["swarm-queue"]["answered"] == rows["swarm-queue"]["prompts"] > 0
    # every baseline, side by side, in every scenario
    assert set(rows) >= BASELINES
    if name == "overhead":  # the workers' Prometheus pages, on, counted every prompt
        (on,) = (r for s, r in rows.items() if "metrics on" in s)
        assert on["extra"]["prompts done on the metrics pages"] == on["prompts"] > 0


def test_the_scale_scenario_answers_every_prompt_both_ways(tmp_path: Path) -> None:
    sc = _smoke("scale", tmp_path)
    rows = {r["system"]: r for r in sc["rows"]}
    assert all(r["wall_s"] > 0 for r in rows.values())
    assert [r["answered"] for r in sc["rows"]] == [r["prompts"] for r in sc["rows"]]
    assert sc["rows"][0]["prompts"] > 0 and len(sc["rows"]) == 6
    assert set(rows) >= BASELINES


def test_the_latency_scenario_reports_the_first_result_and_the_wait(tmp_path: Path) -> None:
    sc = _smoke("latency", tmp_path)
    rows = {r["system"]: r for r in sc["rows"]}
    assert all(r["wall_s"] > 0 for r in rows.values())
    assert rows["swarm-queue"]["answered"] == rows["swarm-queue"]["prompts"] > 0
    assert set(rows) >= BASELINES
    latency = {r["system"]: r["extra"] for r in sc["rows"]}
    assert latency["swarm-queue"]["first_result_s"] > 0
    assert latency["swarm-queue"]["mean_wait_s"] >= 0


def test_the_priority_scenario_compares_the_system_with_itself(tmp_path: Path) -> None:
    # Priority compares the system with itself (alone, urgent, same priority): the baselines
    # have no notion of jobs side by side.
    sc = _smoke("priority", tmp_path)
    assert [r["system"] for r in sc["rows"]] == [
        "alone, idle fleet",
        "priority 1, behind the big job",
        "same priority 0 (fair share)",
    ]
    assert all(r["answered"] == r["prompts"] > 0 and r["wall_s"] > 0 for r in sc["rows"])


def test_the_strict_scenario_runs_every_case_beside_static_round_robin(tmp_path: Path) -> None:
    sc = _smoke("strict", tmp_path)
    systems = [r["system"] for r in sc["rows"]]
    assert len(systems) == 10
    assert [s.split(":")[0] for s in systems] == ["swarm-queue", "static round-robin"] * 5
    for swarm, base in zip(sc["rows"][::2], sc["rows"][1::2], strict=True):
        assert swarm["answered"] == swarm["prompts"] > 0  # every prompt, even past a death
        assert base["system"].split(": ", 1)[1] == swarm["system"].split(": ", 1)[1]
        assert swarm["ideal_s"] > 0 and base["ideal_s"] == swarm["ideal_s"]
    assert "--burst" in systems[6] and "dies" in systems[8]


def test_two_hundred_endpoints_in_four_worker_processes_answer_every_prompt_once(
    tmp_path: Path,
) -> None:
    """The thousand-endpoint scenario, reduced: 200 endpoints, four worker processes of 50."""
    sc = _smoke("fleet_scale", tmp_path)
    (row,) = sc["rows"]
    assert row["answered"] == row["prompts"] == row["extra"]["done"] == 4000
    # 4 workers' connections at least (each endpoint's loop shares its worker's pool)
    assert row["extra"]["Redis clients"] >= 4
    assert sc["checks"] == {"every prompt answered, each once (done == total)": True}


def test_the_start_up_scenario_times_every_route_and_probes_before_the_first_request(
    tmp_path: Path,
) -> None:
    sc = _smoke("start", tmp_path)
    median = {k: v[0] for k, v in sc["extra"]["seconds"].items()}
    assert (
        0
        < median["python -c 'pass'"]
        < median["python -c 'import swarm_queue.worker.app, swarm_queue.worker.main'"]
    )
    for who in ("one worker", "4 workers at once"):
        # every route reached by every worker (NaN where one never was); the probe (/health,
        # /v1/models) comes before the first request, while the gauges (/metrics) are read
        # beside it, at the window's ticks while a request is in flight: a worker that took
        # the whole job between two ticks read none (seen under CPU pressure). The floors
        # are separate runs, so no order between them and these holds.
        first = {r: median[f"{who}: first `{r}`"] for r in ROUTES}
        gauges = first.pop("/metrics")
        assert all(0 < seconds < 60 for seconds in first.values()), first
        assert gauges != gauges or 0 < gauges < 60, gauges  # (NaN != NaN)
        assert max(first["/health"], first["/v1/models"]) <= first["/v1/completions"]


def test_a_section_measured_again_keeps_what_was_written_under_its_checks() -> None:
    """`bench.run --only NAME` replaces a scenario's table and checks; the paragraphs under
    them (earlier runs, their revisions) are a reader's history and stay."""
    sc = Scenario(name="fleet_scale", title="9. A thousand endpoints", note="One job.")
    sc.checks["every prompt answered"] = True
    old = (
        "# Benchmarks\n\n## 9. A thousand endpoints\n\nOne job.\n\n| old table |\n\n"
        "- met: every prompt answered\n\nRun on 2026-11-29 at abc1234: 544 clients.\n\n"
        "## 10. Start-up\n\nIts text.\n"
    )
    new = update_report(old, [sc], "python -m bench.run --only fleet_scale")
    assert "| old table |" not in new
    assert new.count("Run on 2026-11-29 at abc1234: 544 clients.\n") == 1
    assert new.index("- met: every prompt answered") < new.index("Run on 2026-11-29")
    assert new.index("Run on 2026-11-29") < new.index("## 10. Start-up\n\nIts text.\n")
