"""Pipelines with real processes: ``swarm-enqueue --then``, worker processes (one SIGKILLed
mid-pipeline), ``swarm-collect``: every input ends with every step answered once, or the
step where it stopped and why (an over-long prompt made by a step's template fails alone, a
filtered answer says so)."""

from __future__ import annotations

import csv
import re
import signal
from collections.abc import Iterator

import msgspec
import pyarrow.parquet as pq
import pytest
import redis

from swarm_queue.common.keys import step_name
from swarm_queue.common.perprompt import vote
from swarm_queue.common.vectors import pack_vector, unpack_vector
from swarm_queue.flows.pipeline.spec import fill
from swarm_queue.sim.text import completion_for, embedding_for, sample_for
from tests.harness import (
    MAX_TOKENS,
    OVER_CONTEXT,
    FleetFactory,
    collect,
    command,
    fleet_prompt,
    wrong_key_endpoint,
)
from tests.helpers import wait_count

pytestmark = pytest.mark.slow

CHECK = "{prompt}\n{prompt}\nIs this right? {answer}"
SUMMARY = "In one line: {answer}"
KEEP = r"^ <[0-7]"  # the simulator's answers open with <crc32>: about half pass


def _input(i: int) -> str:
    # Every 50th input is long: within the context at step 0, over it once step 1's template
    # writes it out twice.
    return "q" * 1800 + f" #{i}" if i % 50 == 7 else fleet_prompt(i, set())


def _expected(i: int) -> tuple[list[str | None], int | None, str]:
    """Each step's text for input ``i``, the step it stops at (None: none), and why."""
    prompt = _input(i)
    t0 = completion_for(prompt, MAX_TOKENS)[0]
    if i % 50 == 7:
        return [t0, None], 1, f"step 1 failed: {OVER_CONTEXT}"
    t1 = completion_for(fill(CHECK, t0, prompt), 8)[0]
    if re.search(KEEP, t1) is None:
        return [t0, t1], 2, "not sent to step 2: the answer does not match keep-if"
    return [t0, t1, completion_for(fill(SUMMARY, t1, prompt), 6)[0]], None, ""


def test_a_pipeline_through_a_killed_worker_answers_every_input_once(
    fleet_factory: FleetFactory,
) -> None:
    n = 1500
    fleet = fleet_factory(3)
    (fleet.tmp / "check.txt").write_text(CHECK)
    (fleet.tmp / "summary.txt").write_text(SUMMARY)
    src = fleet.tmp / "in.txt"
    src.write_text("".join(_input(i) + "\n" for i in range(n)))
    env = {**fleet.env, "SWARM_CLAIM_IDLE_MS": "2000"}
    args = [
        src, "--job", "p", "--max-tokens", MAX_TOKENS,
        "--then", fleet.tmp / "check.txt", "--max-tokens", "8",
        "--then", fleet.tmp / "summary.txt", "--max-tokens", "6", "--keep-if", KEEP,
    ]  # fmt: skip
    enq = command(env, "swarm-enqueue", *args)
    assert enq.returncode == 0, enq.stderr
    doomed = fleet.worker("a", [0, 1], env=env)
    fleet.worker("b", [2], env=env)
    wait_count("step 1 under way", lambda: fleet.done(step_name("p", 1)), 101)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    fleet.worker("a2", [0, 1], env=env)
    # The producer run again (after a crash, say): nothing queued twice, no step changed.
    again = command(env, "swarm-enqueue", *args)
    assert again.returncode == 0, again.stderr
    assert f"{n} prompts queued (0 new, {n} already queued)" in again.stdout
    # A collector that stops half-way (as if killed), then runs to the end: resumed.
    out = fleet.tmp / "p.jsonl"
    early = command(env, "swarm-collect", "p", "--out", out)
    # Not finished yet, as a rule; on a loaded machine the pipeline may have finished (and
    # the run below then finds the output complete: seen under --cpu-stress 2).
    assert early.returncode in (3, 1), early.stderr
    collected = collect(env, "p", out)
    assert collected.returncode == 1, collected.stderr  # some inputs stopped on the way
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    stopped = {1: 0, 2: 0}
    for x in lines:
        texts, at, why = _expected(x["index"])
        assert [s.get("text") for s in x["steps"]] == texts, x["index"]
        assert [s["step"] for s in x["steps"]] == list(range(len(texts)))
        if at is None:
            assert x["error"] is None and x["text"] == texts[-1]
            assert "stopped_at" not in x
        else:
            stopped[at] += 1
            assert x["stopped_at"] == at and x["text"] is None
            assert x["error"].startswith(why), x
    assert stopped[1] == n // 50 and stopped[2] > n // 5
    # Each step was sent every input that reached it, once, and answered or failed each once.
    client = redis.Redis.from_url(fleet.redis_url)
    through = n - stopped[1] - stopped[2]
    for k, total, failed in ((1, n, stopped[1]), (2, through, 0)):
        meta = client.hgetall(f"{fleet.prefix}:{{p}}:s{k}:meta")
        assert int(meta[b"total"]) == int(meta[b"enqueued"]) == total
        assert (int(meta[b"done"]), int(meta.get(b"failed", 0))) == (total - failed, failed)
    client.close()
    assert (
        f"({through} through every step, {stopped[1] + stopped[2]} stopped on the way: "
        f"{stopped[1]} failed, {stopped[2]} kept out by a filter)"
    ) in early.stderr + collected.stderr
    # The same chains as columns, one row per input (seen: --format parquet refused).
    table, parts = fleet.tmp / "p.csv", fleet.tmp / "p.parquet"
    for path, fmt in ((table, "csv"), (parts, "parquet")):
        got = command(env, "swarm-collect", "p", "--out", path, "--format", fmt)
        assert got.returncode == 1, got.stderr
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    frame = pq.read_table(parts).to_pylist()
    assert len(rows) == len(frame) == n
    for x, row, rec in zip(lines, rows, frame, strict=True):
        texts = [s.get("text") for s in x["steps"]]
        for k in range(3):
            want = texts[k] if k < len(texts) else None
            assert rec[f"s{k}_text"] == want and row[f"s{k}_text"] == (want or "")
        assert rec["index"] == int(row["index"]) == x["index"]
        assert rec["stopped_at"] == x.get("stopped_at") and rec["error"] == x["error"]
        assert rec["text"] == x["text"] and rec["s0_model"] == "swarm-sim"
    # A step is no job to collect alone: its rows are not the inputs'.
    alone = command(env, "swarm-collect", "p:s1", "--out", fleet.tmp / "s1.jsonl")
    assert alone.returncode == 2
    assert "p:s1 is step 1 of pipeline p: its results are numbered in the order" in alone.stderr
    # The operator's commands reach a step by its name.
    status = command(env, "swarm-status", "p")
    assert status.returncode == 0, status.stderr
    assert f"step 1 p:s1: {n - stopped[1]} done, {stopped[1]} failed of {n} (finished)" in (
        status.stdout
    )
    assert f"step 2 p:s2: {through} done, 0 failed of {through} (finished)" in status.stdout
    # A retry of the pipeline reaches its steps: step 1's failures are asked again there.
    retried = command(env, "swarm-retry", "p", "--kind", "rejected")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.splitlines() == [
        "job p: no failed prompts of kind rejected to retry",
        f"job p:s1: {stopped[1]} failed prompts queued again (rejected {stopped[1]})",
    ]
    by_name = command(env, "swarm-retry", "p:s1", "--kind", "rejected")
    assert by_name.stdout.strip() == "job p:s1: no failed prompts of kind rejected to retry"


@pytest.fixture
def locked() -> Iterator[str]:
    """An endpoint that refuses every request with 401: a wrong API key."""
    with wrong_key_endpoint() as url:
        yield url


def test_a_pipeline_an_embeddings_job_and_another_models_job_share_the_fleet(
    fleet_factory: FleetFactory, locked: str
) -> None:
    """The shared case: one fleet of two models and an embedder, four kinds of work at once
    (a pipeline, embeddings, a plain job, a sampled job voted per prompt), a worker with a
    wrong-key endpoint beside its good one, a second pipeline deleted mid-run and queued again
    under its name with new input, a worker SIGKILLed mid-pipeline; each job's every index
    answered once or failed alone, the requeued pipeline's with its new input's answers only."""
    n_pipe, n_embed, n_plain = 1000, 600, 400
    fleet = fleet_factory(4, "--model", "writer,writer,embedder,judge")
    (fleet.tmp / "check.txt").write_text(CHECK)
    (fleet.tmp / "summary.txt").write_text(SUMMARY)
    pipe_in, embed_in, plain_in = (fleet.tmp / f"{x}.txt" for x in ("pipe", "embed", "plain"))
    pipe_in.write_text("".join(_input(i) + "\n" for i in range(n_pipe)))
    texts = [f"finding {i}: the sample was {'warm' if i % 3 else 'cold'}" for i in range(n_embed)]
    texts[77] = "word " * 600  # 750 tokens: over the embedder's 600
    embed_in.write_text("".join(t + "\n" for t in texts))
    plain_in.write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(n_plain)))
    env = {**fleet.env, "SWARM_CLAIM_IDLE_MS": "2000"}
    (fleet.tmp / "step.txt").write_text("Check: {answer}")
    old_q, new_q = ([f"{w} question {i}" for i in range(400)] for w in ("old", "new"))
    requeued = ["--job", "q", "--model", "writer", "--max-tokens", "12",
                "--then", fleet.tmp / "step.txt", "--max-tokens", "8"]  # fmt: skip
    (fleet.tmp / "q-old.txt").write_text("".join(t + "\n" for t in old_q))
    (fleet.tmp / "q-new.txt").write_text("".join(t + "\n" for t in new_q))
    for args in (
        [fleet.tmp / "q-old.txt", *requeued],
        [pipe_in, "--job", "p", "--model", "writer", "--max-tokens", MAX_TOKENS,
         "--then", fleet.tmp / "check.txt", "--max-tokens", "8",
         "--then", fleet.tmp / "summary.txt", "--max-tokens", "6", "--model", "judge",
         "--keep-if", KEEP],
        [embed_in, "--job", "e", "--embed", "--model", "embedder"],
        [plain_in, "--job", "j", "--model", "judge", "--max-tokens", MAX_TOKENS],
        [plain_in, "--job", "v", "--model", "writer", "--max-tokens", MAX_TOKENS,
         "--samples", "5", "--temperature", "0.7", "--per-prompt", "vote"],
    ):  # fmt: skip
        enq = command(env, "swarm-enqueue", *args)
        assert enq.returncode == 0, enq.stderr
    doomed = fleet.worker("a", [0, 1, 2], env=env)
    fleet.worker("b", [3], env=env, SWARM_ENDPOINTS=f"{fleet.url(3)},{locked}")
    wait_count("step 1 under way", lambda: fleet.done(step_name("p", 1)), 51)
    # Pipeline q is deleted with work in flight and queued again under its name.
    wait_count("q's second step under way", lambda: fleet.done(step_name("q", 1)), 11)
    fleet.sim.send_signal(signal.SIGSTOP)
    try:
        gone = command(env, "swarm-jobs", "--delete", "q", "--force")
        assert gone.returncode == 0, gone.stderr
        again = command(env, "swarm-enqueue", fleet.tmp / "q-new.txt", *requeued)
        assert again.returncode == 0, again.stderr
    finally:
        fleet.sim.send_signal(signal.SIGCONT)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    fleet.worker("a2", [0, 1, 2], env=env)

    out = fleet.tmp / "p.jsonl"
    collected = collect(env, "p", out)
    assert collected.returncode == 1, collected.stderr
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n_pipe))
    for x in lines:
        texts_, at, why = _expected(x["index"])
        assert [s.get("text") for s in x["steps"]] == texts_, x["index"]
        assert [s["model"] for s in x["steps"] if "text" in s] == ["writer", "writer", "judge"][
            : len([t for t in texts_ if t is not None])
        ]
        assert (x.get("stopped_at"), (x["error"] or "")[: len(why)]) == (at, why)

    got = command(env, "swarm-collect", "e", "--out", fleet.tmp / "e.jsonl", "--wait")
    assert got.returncode == 1, got.stderr  # the over-long text failed, alone
    vectors = [msgspec.json.decode(x) for x in (fleet.tmp / "e.jsonl").read_bytes().splitlines()]
    assert [v["index"] for v in vectors if v["error"]] == [77]
    for v in vectors:
        if v["index"] != 77:
            assert v["embedding"] == unpack_vector(pack_vector(embedding_for(texts[v["index"]])))
            assert v["model"] == "embedder"

    got = command(env, "swarm-collect", "j", "--out", fleet.tmp / "j.jsonl", "--wait")
    assert got.returncode == 0, got.stderr
    plain = [msgspec.json.decode(x) for x in (fleet.tmp / "j.jsonl").read_bytes().splitlines()]
    assert [x["text"] for x in plain] == [
        completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0] for i in range(n_plain)
    ]
    assert {x["model"] for x in plain} == {"judge"}

    got = command(env, "swarm-collect", "q", "--out", fleet.tmp / "q.jsonl", "--wait")
    assert got.returncode == 0, got.stderr
    chains = [msgspec.json.decode(x) for x in (fleet.tmp / "q.jsonl").read_bytes().splitlines()]
    assert [c["index"] for c in chains] == list(range(400))
    for c, prompt in zip(chains, new_q, strict=True):  # the new input's, none of the old's
        first = completion_for(prompt, 12)[0]
        assert [s["text"] for s in c["steps"]] == [
            first,
            completion_for(fill("Check: {answer}", first, prompt), 8)[0],
        ]

    got = command(env, "swarm-collect", "v", "--out", fleet.tmp / "v.jsonl", "--wait")
    assert got.returncode == 0, got.stderr
    voted = [msgspec.json.decode(x) for x in (fleet.tmp / "v.jsonl").read_bytes().splitlines()]
    for x in voted:
        samples = [sample_for(fleet_prompt(x["index"], set()), MAX_TOKENS, j)[0] for j in range(5)]
        assert x["samples"] == samples and x["value"] == vote(samples), x["index"]
        assert x["text"] == vote(samples)["answer"]
