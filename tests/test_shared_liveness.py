"""The shared case of issue 46: on one fleet and one Redis, the jobs that once ran for ever, side
by side: a job for a model whose lone endpoint answers unusably, a job with a prompt every
server fails with HTTP 500, a best-of job, an agent job cancelled while its agents wait for a
tool, and a gateway batch whose input is deleted and whose gateway is killed; beside them, a
healthy job. Every job ends, each prompt answered or failed with its reason, and the healthy
one is untouched. Real processes throughout."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from swarm_queue.sim.text import completion_for
from tests import gatewayproc as gw
from tests.harness import MAX_TOKENS, TOOL_PARSER_ARGS, FleetFactory, collect, command
from tests.helpers import wait_count

POISON = "<poison>"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(x + "\n" for x in lines))
    return path


def _collect(env: dict[str, str], tmp: Path, job: str, *rc: int) -> list[dict[str, Any]]:
    """The job's lines, once it ended with one of the exit statuses ``rc``."""
    out = tmp / f"{job}.jsonl"
    done = collect(env, job, out, stall_s=90)
    assert done.returncode in rc, (job, done.returncode, done.stderr[-2000:])
    return _lines(out)


@pytest.mark.slow
def test_the_jobs_that_once_never_ended_all_end_beside_a_healthy_one_left_untouched(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    # Ports 0 and 1 serve model m; port 2, alone, model lone, answering n > 1 one sample short.
    fleet = fleet_factory(3, "--model", "m,m,lone", "--fail-on", POISON, *TOOL_PARSER_ARGS)
    fleet.faults(2, short_samples=1)
    env, tmp = fleet.env, fleet.tmp
    healthy = [f"healthy: what does record {i} of the survey say?" for i in range(1500)]
    poisoned = [f"poisoned: record {i}{POISON if i % 12 == 5 else ''}?" for i in range(300)]
    (tmp / "judge.txt").write_text("Rate from 0 to 9, as [[n]]: {answer}")
    (tmp / "task.txt").write_text('Find paper {n}. CALL slow_add({{"a": 1, "b": 2}})')
    (tmp / "agents.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(20)))
    m = ("--model", "m", "--max-tokens", str(MAX_TOKENS))
    for args in (
        [_write(tmp / "healthy.txt", healthy), "--job", "healthy", *m],
        [_write(tmp / "poisoned.txt", poisoned), "--job", "poisoned", *m],
        [_write(tmp / "lone.txt", healthy[:60]), "--job", "lone", "--model", "lone",
         "--samples", "3", "--temperature", "0.8"],
        [_write(tmp / "best.txt", healthy[:60]), "--job", "best", *m, "--temperature", "0.8",
         "--best-of", "3", "--judge", tmp / "judge.txt"],
        # No tool runner serves slow_add: the agents wait for it until cancelled.
        [tmp / "agents.jsonl", "--job", "ag", "--task", tmp / "task.txt", "--tools", "slow_add",
         "--max-turns", "2", "--model", "m", "--max-tokens", "64"],
    ):  # fmt: skip
        queued = command(env, "swarm-enqueue", *args)
        assert queued.returncode == 0, queued.stderr
    worker = fleet.worker("w", [0, 1, 2], burst=False, SWARM_BATCH_SIZE="16")

    n_batch = 300
    with gw.gateway(env, tmp) as (first, port, _log):
        client = gw.client(port)
        batch = gw.completions_batch(client, tmp, n_batch)
        assert gw.wait_answered(client, batch.id, 16).status == "in_progress"
        assert client.files.delete(batch.input_file_id).deleted
        first.send_signal(signal.SIGKILL)
        first.wait()
    wait_count("agents waiting for their tool", lambda: fleet.done("ag"), 20)
    cancel = command(env, "swarm-cancel", "ag")
    assert cancel.returncode == 0, cancel.stderr

    with gw.gateway(env, tmp) as (_, port, _log):
        client = gw.client(port)
        over = gw.wait_over(client, batch.id, stall_s=90)
        assert over.status == "completed", over
        assert (over.request_counts.completed, over.request_counts.failed) == (n_batch, 0)

    # The healthy job: every answer the simulator's, each at its first try.
    lines = _collect(env, tmp, "healthy", 0)
    assert [x["text"] for x in lines] == [completion_for(p, MAX_TOKENS)[0] for p in healthy]
    assert {x["attempts"] for x in lines} == {1} and {x["model"] for x in lines} == {"m"}
    # The poison prompts failed alone, with the server's words; the others answered.
    lines = _collect(env, tmp, "poisoned", 1)
    bad = {i for i in range(300) if i % 12 == 5}
    assert {x["index"] for x in lines if x["error"]} == bad
    assert {x["error_kind"] for x in lines if x["error"]} == {"server_error"}
    assert all(
        x["text"] == completion_for(poisoned[x["index"]], MAX_TOKENS)[0]
        for x in lines
        if x["index"] not in bad
    )
    # The lone endpoint's job ended, each prompt failed with that endpoint's error.
    lines = _collect(env, tmp, "lone", 1)
    assert len(lines) == 60 and {x["error_kind"] for x in lines} <= {"malformed", "no_choice"}
    # Best-of: every input has its line, in order.
    lines = _collect(env, tmp, "best", 0, 1)  # (1: an input whose candidates none scored)
    assert [x["index"] for x in lines] == list(range(60))
    # The cancelled agents ended, each saying so.
    lines = _collect(env, tmp, "ag", 1)
    assert [(x["index"], x.get("failure")) for x in lines] == [(i, "cancelled") for i in range(20)]
    worker.terminate()
    worker.wait(timeout=60)
    # The lone endpoint's circuit opened; no endpoint of model m ever had its opened.
    log = fleet.logs[0].read_text()
    opened = [x for x in log.splitlines() if "circuit open after" in x]
    assert opened and all(fleet.url(2) in x for x in opened), opened
