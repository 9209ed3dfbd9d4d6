"""Answers of a swarm-retry reach the collected file. Seen: after swarm-cancel, swarm-collect
and swarm-retry --kind cancelled, the same collect said the file "already holds all 20000
results; left alone" while 14,688 lines still said cancelled; after --evict, the retry found
"no failed prompts" though 7,280 had failed. Now the collector brings a complete file up to
date (every format of lines), and --evict keeps what a retry needs. Real processes."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from swarm_queue.sim.text import completion_for
from tests.harness import MAX_TOKENS, FleetFactory, collect, command, fleet_prompt

pytestmark = pytest.mark.slow

N = 600


def _cancelled_part_way(fleet_factory: FleetFactory, job: str):  # type: ignore[no-untyped-def]
    """A fleet with job ``job`` of N prompts, some answered and the rest cancelled."""
    fleet = fleet_factory(1, "--step-ms", "30")
    assert fleet.enqueue(job, N, set()).wait(timeout=60) == 0
    worker = fleet.worker("w", [0], burst=False, SWARM_BATCH_SIZE="8", SWARM_INFLIGHT="1")
    while fleet.done(job) < 40:
        assert worker.poll() is None, fleet.logs[-1].read_text()[-2000:]
        time.sleep(0.02)
    # The worker stopped first: a cancel that a fast worker could outrun would leave nothing
    # cancelled (seen once workers started faster).
    worker.terminate()
    assert worker.wait(timeout=60) == 0
    cancelled = command(fleet.env, "swarm-cancel", job)
    assert cancelled.returncode == 0, cancelled.stderr
    return fleet


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def _expected(i: int) -> str:
    return completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0]


@pytest.mark.parametrize("evict", [False, True])
def test_retried_prompts_reach_the_collected_file(
    fleet_factory: FleetFactory, tmp_path: Path, evict: bool
) -> None:
    job = "ev" if evict else "kept"
    fleet = _cancelled_part_way(fleet_factory, job)
    extra = ["--evict"] if evict else []
    out, table = tmp_path / f"{job}.jsonl", tmp_path / f"{job}.csv"
    # The same job as CSV too, first: after --evict only the evicting output holds results.
    assert collect(fleet.env, job, table, "--format", "csv").returncode == 1
    parts = tmp_path / f"{job}.parquet"
    assert collect(fleet.env, job, parts, "--format", "parquet").returncode == 1
    first = collect(fleet.env, job, out, *extra)
    assert first.returncode == 1, first.stderr  # cancelled prompts are failures
    lines = _jsonl(out)
    cancelled = [x["index"] for x in lines if x.get("error_kind") == "cancelled"]
    assert len(lines) == N and 0 < len(cancelled) < N - 30
    # Its progress, though stderr is no terminal: said at once and at the end.
    assert f"swarm-collect: job {job}: {N} of {N} answered, failed {len(cancelled)}" in first.stderr

    retry = command(fleet.env, "swarm-retry", job, "--kind", "cancelled")
    assert retry.returncode == 0, retry.stderr
    assert retry.stdout.strip() == (
        f"job {job}: {len(cancelled)} failed prompts queued again (cancelled {len(cancelled)})"
    )
    assert fleet.worker("w2", [0]).wait(timeout=180) == 0, fleet.logs[-1].read_text()[-2000:]

    again = collect(fleet.env, job, out, *extra)
    assert again.returncode == 0, again.stderr
    assert (
        f"swarm-collect: job {job} was retried since {out} was collected: brought it up to date "
        f"({len(cancelled)} rows changed)"
    ) in again.stderr
    assert f"job {job}: wrote {N} of {N} results ({N} ok, 0 failed)" in again.stderr
    lines = _jsonl(out)
    assert [x["index"] for x in lines] == list(range(N))
    assert [(x["index"], x.get("text")) for x in lines] == [(i, _expected(i)) for i in range(N)]
    assert not (tmp_path / f"{job}.jsonl.refresh").exists()

    table_again = collect(fleet.env, job, table, "--format", "csv")
    if evict:  # its retried answers left Redis for the evicting output: it says so
        assert table_again.returncode == 1
        assert "collected with --evict into another output since" in table_again.stderr
    else:
        assert table_again.returncode == 0, table_again.stderr
        with open(table, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [r["text"] for r in rows] == [_expected(i) for i in range(N)]
        parts_again = collect(fleet.env, job, parts, "--format", "parquet")
        assert parts_again.returncode == 0, parts_again.stderr
        assert f"brought it up to date ({len(cancelled)} rows changed)" in parts_again.stderr
        frame = pq.read_table(parts).to_pydict()
        assert frame["index"] == list(range(N))
        assert frame["text"] == [_expected(i) for i in range(N)]
        assert set(frame["error"]) == {None}

    # Up to date now: a third run leaves it alone.
    third = collect(fleet.env, job, out, *extra)
    assert third.returncode == 0 and "already holds all" in third.stderr
    status = command(fleet.env, "swarm-status", job)
    assert "failed     0" in status.stdout, status.stdout
