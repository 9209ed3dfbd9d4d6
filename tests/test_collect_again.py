"""A collection run again, or run beside another: a collector never truncates or deletes output it
did not write in this run, says when the results it wants left Redis with another collector's
--evict (never waits for them), and a late commit into an evicted index is neither stored nor
counted. Real Redis; the collector as the real command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from swarm_queue.common.models import Result
from swarm_queue.common.store import Commit, JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from tests.harness import BIN
from tests.helpers import gen_of, prompts, spec


async def _answered(store: JobStore, n: int) -> list[tuple[bytes, bytes | None]]:
    """Job ``j`` of ``n`` prompts, every one answered; returns its entries as read."""
    await enqueue_prompts(store, spec(), prompts(n))
    got = await store.read_new("j", "w", n)
    answers = [(eid, Result(index=i, text=f" answer {i}"), None) for i, (eid, _) in enumerate(got)]
    await store.commit("j", answers, gen=await gen_of(store))
    return got


def _collect(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / "swarm-collect", "j", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
async def test_a_finished_collection_run_again_is_left_alone_and_an_evicted_job_says_so(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    n = 2000
    await _answered(store, n)
    out = tmp_path / "out.jsonl"
    first = _collect(cli_env, "--out", out, "--evict")
    assert first.returncode == 0, first.stderr
    written = out.read_bytes()
    assert len(written.splitlines()) == n
    assert (await store.status("j")).evicted == n

    # The same command again (yesterday's, rerun): the file is complete, and left alone.
    again = _collect(cli_env, "--out", out, "--evict")
    assert again.returncode == 0, again.stderr
    assert f"{out} already holds all {n} results of job j; left alone" in again.stderr
    assert out.read_bytes() == written
    with_wait = _collect(cli_env, "--out", out, "--wait")
    assert with_wait.returncode == 0 and out.read_bytes() == written

    # Into another file: the results are in the first one only. Said at once, with --wait too.
    for extra in ([], ["--wait"]):
        other = _collect(cli_env, "--out", tmp_path / "other.jsonl", *extra)
        assert other.returncode == 1, other.stderr
        assert (
            f"job 'j': results 0 to {n - 1} were collected with --evict into another output "
            "and are no longer in Redis" in other.stderr
        )
        assert not (tmp_path / "other.jsonl").exists()
    parquet = _collect(cli_env, "--out", tmp_path / "other.parquet", "--format", "parquet")
    assert parquet.returncode == 1 and "no longer in Redis" in parquet.stderr


@pytest.mark.slow
async def test_output_no_collection_of_this_job_wrote_is_never_overwritten(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    await _answered(store, 50)
    notes = tmp_path / "notes.jsonl"
    notes.write_text("a file someone else wrote\n")
    refused = _collect(cli_env, "--out", notes)
    assert refused.returncode == 2
    assert f"{notes} exists and no unfinished swarm-collect of job 'j' wrote it" in refused.stderr
    assert notes.read_text() == "a file someone else wrote\n"

    # A Parquet directory collected completely, then collected again: left alone.
    pdir = tmp_path / "out.parquet"
    first = _collect(cli_env, "--out", pdir, "--format", "parquet")
    assert first.returncode == 0, first.stderr
    before = {name: (pdir / name).read_bytes() for name in os.listdir(pdir)}
    again = _collect(cli_env, "--out", pdir, "--format", "parquet")
    assert again.returncode == 0, again.stderr
    assert "already holds all 50 results of job j; left alone" in again.stderr
    assert {name: (pdir / name).read_bytes() for name in os.listdir(pdir)} == before


async def test_a_late_commit_into_an_evicted_index_is_neither_stored_nor_counted(
    store: JobStore, tmp_path: Path
) -> None:
    from swarm_queue.producer.output import collect_output

    got = await _answered(store, 10)
    gen = await gen_of(store)
    # One prompt failed, and a copy of prompt 3 is still running somewhere.
    late = [(got[3][0], Result(index=3, text=" a late copy"), None)]
    out = str(tmp_path / "out.jsonl")
    report = await collect_output(store, "j", out, wait=False, progress=False, evict=True)
    assert report.complete and report.written == 10
    assert await store.commit("j", late, gen=gen) == Commit(0, 0)
    status = await store.status("j")
    assert (status.done, status.failed, status.evicted) == (10, 0, 10)
    assert await store.redis.hlen(store.keys.results("j")) == 0  # nothing reappeared
    # Nothing below the mark can be queued again: its line is written already.
    assert await store.requeue("j", [(3, "rejected")], gen=gen) == 0
