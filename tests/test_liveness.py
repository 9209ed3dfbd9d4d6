"""Every job ends, answered or failed with its reason, whatever the endpoints do: against real
Redis, real worker processes and a swarm-sim that misbehaves as servers were seen to (issue
46). Each of these jobs once ran for ever."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.store import JobStore
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, MAX_TOKENS, FleetFactory, collect
from tests.helpers import prompts, spec

POISON = "<poison>"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def _poisoned(i: int) -> str:
    return f"Explain observation #{i} of the survey{POISON if i % 12 == 5 else ''}."


@pytest.mark.slow
@pytest.mark.parametrize("chunk", ["1", "8"])
def test_a_prompt_every_endpoint_fails_with_a_500_fails_alone_and_its_batch_is_answered(
    fleet_factory: FleetFactory, tmp_path: Path, chunk: str
) -> None:
    """Seen: 1 prompt in 12 that makes the server fail its whole list with HTTP 500 (a
    tokenizer error on one odd input), two endpoints: 0 of 600 answered in 90 s, thousands
    of requests, circuits opening on endpoints other jobs share. Now a list's 500 is bisected
    as a 400 is, and a prompt that fails alone on every endpoint that tried it fails with
    the server's message; the others are answered, in order, and no circuit opens."""
    fleet = fleet_factory(2, "--fail-on", POISON)
    n = 600
    src = tmp_path / "p.txt"
    src.write_text("".join(_poisoned(i) + "\n" for i in range(n)))
    queued = subprocess.run(
        [
            BIN / "swarm-enqueue",
            src,
            "--job",
            "p",
            "--max-tokens",
            str(MAX_TOKENS),
            "--chunk",
            chunk,
        ],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert queued.returncode == 0, queued.stderr
    worker = fleet.worker("w", [0, 1])
    out = tmp_path / "p.jsonl"
    done = collect(fleet.env, "p", out, stall_s=60)
    assert done.returncode == 1, done.stderr  # some failed
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    poison = {i for i in range(n) if i % 12 == 5}
    assert {x["index"] for x in lines if x["error"] is not None} == poison
    for x in lines:
        if x["index"] in poison:
            assert x["error_kind"] == "server_error", x
            assert "HTTP 500 on this prompt alone: EngineCore encountered an issue" in x["error"]
            # Its tries on every endpoint that gave it back count too: blamed on each only
            # after 3 tries alone at least.
            given = int(re.search(r"given back (?:by )?(\d+)", x["error"])[1])
            assert x["attempts"] >= 3 * given, x
        else:
            assert x["text"] == completion_for(_poisoned(x["index"]), MAX_TOKENS)[0]
    assert worker.wait(timeout=60) == 0
    log = fleet.logs[0].read_text()
    assert "circuit open" not in log, log
    # Bounded: each poison prompt is tried by at most three endpoints' turns.
    assert fleet.requests(0) + fleet.requests(1) < 3000


@pytest.mark.slow
@pytest.mark.parametrize("chunk", ["1", "8"])
def test_a_prompt_the_server_hangs_on_is_dead_lettered_and_its_batch_answered(
    fleet_factory: FleetFactory, tmp_path: Path, chunk: str
) -> None:
    """A prompt an engine gets stuck on (no answer, ever): each run ends in the request's
    timeout, and such a run is that prompt's death, as a worker's is: from the second it runs
    alone, past SWARM_MAX_DELIVERIES it is dead-lettered, and the job ends. Before, a batch
    given up on a timeout was released uncounted, taken again, and the job never ended.
    Every line's attempts count its runs that never ended."""
    fleet = fleet_factory(2, "--hang-on", POISON)
    n, poison = 40, 5
    src = tmp_path / "h.txt"
    text = [f"Explain observation #{i}{POISON if i == poison else ''}." for i in range(n)]
    src.write_text("".join(x + "\n" for x in text))
    queued = subprocess.run(
        [BIN / "swarm-enqueue", src, "--job", "h", "--max-tokens", str(MAX_TOKENS),
         "--chunk", chunk],
        env=fleet.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    worker = fleet.worker(
        "w", [0, 1], SWARM_REQUEST_TIMEOUT_S="0.5", SWARM_MAX_ATTEMPTS="2",
        SWARM_MAX_DELIVERIES="3", SWARM_BATCH_SIZE="8", SWARM_SPECULATE="0",
    )  # fmt: skip
    out = tmp_path / "h.jsonl"
    done = collect(fleet.env, "h", out, stall_s=60)
    assert done.returncode == 1, done.stderr  # one failed
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    assert [x["index"] for x in lines if x["error"] is not None] == [poison]
    assert lines[poison]["error_kind"] == "dead_letter"
    assert lines[poison]["error"].startswith("dead-lettered: run 4 times")
    for x in lines:
        if x["index"] != poison:
            assert x["text"] == completion_for(text[x["index"]], MAX_TOKENS)[0]
    # Its first batch's other prompts ran with it once, lost with it.
    assert any(x["attempts"] >= 2 for x in lines if x["index"] != poison)
    assert worker.wait(timeout=60) == 0


async def test_a_collector_following_a_misspelt_job_ends_naming_the_jobs_it_may_mean(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Seen: ``swarm-collect genes-v2 --wait`` (the job is genes-v1) waited for ever. It
    waits a bounded time for a job not queued yet (it may start before its producer), says
    which jobs it may mean, and ends."""
    await enqueue_prompts(store, spec("genes-v1"), prompts(3))
    began = time.monotonic()
    proc = await asyncio.to_thread(
        subprocess.run,
        [BIN / "swarm-collect", "genes-v2", "--out", tmp_path / "o.jsonl", "--wait",
         "--appear-timeout", "1"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - began < 30
    assert "no job named 'genes-v2'" in proc.stderr
    assert "did you mean 'genes-v1'?" in proc.stderr and "none was queued in 1 s" in proc.stderr


def _half_good(path: Path, n: int, bad: int) -> None:
    """``n`` JSONL prompt lines, line ``bad`` (from 1) of them broken."""
    path.write_text(
        "".join(
            "{broken\n"
            if i + 1 == bad
            else msgspec.json.encode({"prompt": f"q{i}"}).decode() + "\n"
            for i in range(n)
        )
    )


async def test_a_bad_line_half_way_through_a_file_queues_none_of_it(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Seen: ``file.jsonl:5001: invalid JSON`` and exit 2, but lines 1-5,000 running and the
    job "still being enqueued" for ever (it is queued in chunks of 1,000). A file is checked
    whole first."""
    src = tmp_path / "in.jsonl"
    _half_good(src, 1500, 1201)
    proc = await asyncio.to_thread(
        subprocess.run,
        [BIN / "swarm-enqueue", src, "--job", "half"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{src}:1201: invalid JSON" in proc.stderr
    assert "half" not in await store.list_jobs()


async def test_a_bad_line_half_way_through_stdin_ends_the_job_where_it_stands(
    store: JobStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """stdin cannot be read twice: the job is sealed with what was queued before the bad
    line, and says so, so that its workers and ``collect --wait`` end."""
    src = tmp_path / "in.jsonl"
    _half_good(src, 1500, 1201)
    proc = await asyncio.to_thread(
        subprocess.run,
        [BIN / "swarm-enqueue", "-", "--job", "half"],
        input=src.read_text(), env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "<stdin>:1201: invalid JSON" in proc.stderr
    assert "job half ends at <stdin>:1201 with the 1200 prompts queued before it" in proc.stderr
    status = await store.status("half")  # sealed: it finishes once the 1,200 are answered
    assert (status.total, status.pending + status.done) == (1200, 1200)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lie", "args"),
    [
        ({"short_samples": 1}, ("--samples", "7", "--temperature", "0.8")),
        ({"nan_vectors": True}, ("--embed",)),
    ],
    ids=["one-sample-short", "nan-vectors"],
)
def test_a_lone_endpoint_whose_answers_cannot_be_used_ends_its_job(
    fleet_factory: FleetFactory, lie: dict[str, Any], args: tuple[str, ...]
) -> None:
    """Seen: the only endpoint of its model answering ``n = 7`` one sample short (0 of 300 in
    90 s, about 20,000 requests: its circuit opened, the probe, asking n = 1, passed, the
    circuit closed, again), and one answering embeddings holding NaN (the body unreadable
    JSON, taken for a passing fault; its probe a completion). A probe now asks what failed
    (its n, its route), and the job ends, each prompt failed with the endpoint's error."""
    fleet = fleet_factory(2, "--model", "good,liar")
    fleet.faults(1, **lie)
    n = 100
    assert fleet.enqueue("lies", n, set(), "--model", "liar", *args).wait(60) == 0
    worker = fleet.worker("w", [0, 1])
    out = fleet.tmp / "lies.jsonl"
    done = collect(fleet.env, "lies", out, stall_s=60)
    assert done.returncode == 1, done.stderr
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    assert {x["error_kind"] for x in lines} <= {"malformed", "no_choice"}, lines[0]
    assert all("no other endpoint serves the job's model" in x["error"] for x in lines)
    assert fleet.requests(1) < 200
    assert worker.wait(timeout=60) == 0
