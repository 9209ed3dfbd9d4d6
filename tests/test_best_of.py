"""Best-of-N with a judge (swarm_queue/flows/bestof/flow.py): each prompt sampled N times, every
candidate judged, the best kept. Its settings refused where they cannot work, its score rule,
and the workflow end to end with real processes on one fleet beside a pipeline and an agent
job, a worker SIGKILLed mid-judging: every candidate judged exactly once, every line the
simulator's answers say it must be."""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
import redis

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import group_of, step_name
from swarm_queue.flows.bestof.flow import best_of_of, build_best_of, score_of
from swarm_queue.flows.pipeline.spec import fill
from swarm_queue.producer.api import Swarm
from swarm_queue.sim.text import completion_for, sample_for
from tests.harness import (
    MAX_TOKENS,
    TOOL_PARSER_ARGS,
    FleetFactory,
    collect,
    command,
    fleet_prompt,
    tool_runner,
)
from tests.helpers import wait_count

JUDGE = "{prompt}\n{prompt}\nScore this answer from 0 to 9: {answer}"


def test_a_score_is_the_last_bracketed_number_else_the_first() -> None:
    assert score_of("Rating: [[7]]") == 7.0
    assert score_of("Step 1: fine. Step 2: wrong. Verdict [[ 3.5 ]]") == 3.5
    assert score_of("8/10, a clear answer") == 8.0
    assert score_of("-2 for the typo") == -2.0
    assert score_of("no number here") is None
    # A judge quoting the candidate, whose own [[10]] came first (55 of 55 inputs won so).
    assert score_of("You wrote: 'Great answer. [[10]]'. Rating: [[0]]") == 0.0
    # No score: not a plain number, or more digits than a judge's score has.
    assert score_of("Rating: [[1e308]]") is None
    assert score_of("Rating: [[inf]]") is None
    assert score_of(f"Rating: [[{'9' * 400}]]") is None
    assert score_of(f"{'9' * 400} out of 10") is None


@pytest.mark.parametrize(
    ("n", "judge", "options", "error"),
    [
        (1, "{answer}", {}, "--best-of takes 2 to 64 candidates, got 1"),
        (65, "{answer}", {}, "--best-of takes 2 to 64 candidates, got 65"),
        (4, "Score it", {}, "the judge's template has no {answer}"),
        (4, "{answer} {question}", {}, "names {question}: only {answer}"),
        (4, "{answer}", {"samples": 3}, "--best-of 4 samples 4 candidates: drop --samples 3"),
        (4, "{answer}", {"embed": True}, "not with --per-prompt, --embed or --reduce"),
        # vLLM refuses n > 1 with greedy decoding: said before anything is queued.
        (4, "{answer}", {"temperature": 0.0}, "--samples 4 with --temperature 0"),
    ],
)
def test_settings_that_cannot_work_are_refused(
    n: int, judge: str, options: dict[str, object], error: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        build_best_of("b", JobOptions(**options), n, judge, source="t")


def test_the_judge_step_answers_greedily_with_its_own_model() -> None:
    specs, _ = build_best_of(
        "b", JobOptions(model="writer", temperature=0.8), 3, "{answer}", judge_model="critic",
        source="t",
    )  # fmt: skip
    first, judge = specs
    settings = best_of_of(first)
    assert settings is not None and (settings.n, settings.judge) == (3, "b:s1")
    assert (first.model, first.params.n) == ("writer", 3)
    assert (judge.job, judge.model, judge.params.temperature) == ("b:s1", "critic", 0)
    assert (group_of(judge.job), judge.flow) == (("b", 1), None)


def _input(i: int) -> str:
    # Every 40th input is long: answered at the first step, over the context once the
    # judge's template writes it out twice, so its candidates' judgements fail.
    return "q" * 1400 + f" #{i}" if i % 40 == 9 else fleet_prompt(i, set())


_FIRST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _expected(i: int, n: int) -> tuple[list[str], list[float | None], int | None]:
    """Input ``i``'s candidates, their scores (None: the judge failed or gave no number) and
    the best one's number (None: none scored), as the simulator answers."""
    prompt = _input(i)
    texts = [sample_for(prompt, MAX_TOKENS, j)[0] for j in range(n)]
    scores: list[float | None] = []
    for text in texts:
        if i % 40 == 9:
            scores.append(None)
            continue
        found = _FIRST_NUMBER.search(completion_for(fill(JUDGE, text, prompt), MAX_TOKENS)[0])
        scores.append(float(found.group(0)) if found else None)
    ranked = [(s, -k) for k, s in enumerate(scores) if s is not None]
    return texts, scores, (-max(ranked)[1] if ranked else None)


@pytest.mark.slow
def test_best_of_beside_a_pipeline_and_agents_through_a_killed_worker(
    fleet_factory: FleetFactory,
) -> None:
    n, n_best = 400, 4
    fleet = fleet_factory(3, *TOOL_PARSER_ARGS)
    tmp = fleet.tmp
    (tmp / "judge.txt").write_text(JUDGE)
    (tmp / "in.txt").write_text("".join(_input(i) + "\n" for i in range(n)))
    (tmp / "step.txt").write_text("Check: {answer}")
    (tmp / "plain.txt").write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(200)))
    (tmp / "task.txt").write_text('Find paper {n}. CALL slow_add({{"a": 1, "b": 2}})')
    (tmp / "agents.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(100)))
    env = {**fleet.env, "SWARM_CLAIM_IDLE_MS": "2000"}
    best = [tmp / "in.txt", "--job", "b", "--max-tokens", MAX_TOKENS, "--temperature", "0.8",
            "--best-of", n_best, "--judge", tmp / "judge.txt"]  # fmt: skip
    for args in (
        best,
        [tmp / "plain.txt", "--job", "p", "--max-tokens", "12",
         "--then", tmp / "step.txt", "--max-tokens", "8"],
        [tmp / "agents.jsonl", "--job", "ag", "--task", tmp / "task.txt", "--tools", "slow_add",
         "--max-turns", "2", "--max-tokens", "64"],
    ):  # fmt: skip
        enq = command(env, "swarm-enqueue", *args)
        assert enq.returncode == 0, enq.stderr
    log = tmp / "runs.log"
    log.touch()
    runner = tool_runner(env, log, tmp / "runner.log")
    doomed = fleet.worker("a", [0, 1], env=env)
    fleet.worker("c", [2], env=env)
    try:
        wait_count("judging under way", lambda: fleet.done(step_name("b", 1)), 101)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        # The producer run again (yesterday's command): nothing queued twice.
        again = command(env, "swarm-enqueue", *best)
        assert again.returncode == 0, again.stderr
        assert f"{n} prompts queued (0 new, {n} already queued)" in again.stdout
        fleet.worker("a2", [0, 1], env=env)

        out = tmp / "b.jsonl"
        got = collect(env, "b", out)
        assert got.returncode == 1, got.stderr  # the long inputs' lines failed, alone
        lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
        assert [x["index"] for x in lines] == list(range(n))
        unscored = 0
        for x in lines:
            texts, scores, k = _expected(x["index"], n_best)
            assert [c["text"] for c in x["candidates"]] == texts, x["index"]
            assert [c.get("score") for c in x["candidates"]] == scores, x["index"]
            if k is None:
                unscored += 1
                assert x["text"] is None and x["error"].startswith("no candidate was scored")
                continue
            assert (x["best"], x["text"], x["score"]) == (k, texts[k], scores[k]), x
            assert x["error"] is None and x["model"] == "swarm-sim"
        assert unscored >= n // 40
        assert f"best-of b: wrote {n} of {n} inputs ({n - unscored} answered" in got.stderr
        # Every candidate was judged exactly once, through the kill.
        client = redis.Redis.from_url(fleet.redis_url)
        meta = client.hgetall(f"{fleet.prefix}:{{b}}:s1:meta")
        client.close()
        assert int(meta[b"total"]) == int(meta[b"enqueued"]) == n * n_best
        assert int(meta[b"done"]) + int(meta.get(b"failed", 0)) == n * n_best
        # The same lines as columns.
        table, parts = tmp / "b.csv", tmp / "b.parquet"
        for path, fmt in ((table, "csv"), (parts, "parquet")):
            written = command(env, "swarm-collect", "b", "--out", path, "--format", fmt)
            assert written.returncode == 1, written.stderr
        with open(table, newline="") as fh:
            rows = list(csv.DictReader(fh))
        frame = pq.read_table(parts).to_pylist()
        assert len(rows) == len(frame) == n
        for x, row, rec in zip(lines, rows, frame, strict=True):
            assert rec["text"] == x["text"] and row["text"] == (x["text"] or "")
            assert rec["best"] == x.get("best") and rec["c3_text"] == x["candidates"][3]["text"]
            assert rec["c0_score"] == x["candidates"][0].get("score")
        # The operator's commands see the judge step as the job's.
        status = command(env, "swarm-status", "b")
        assert status.returncode == 0, status.stderr
        assert "step 1 b:s1: " in status.stdout and "(finished)" in status.stdout

        chains = [msgspec.json.decode(x) for x in _lines(env, tmp, "p")]
        assert len(chains) == 200 and all(len(c["steps"]) == 2 and c["text"] for c in chains)
        agents = [msgspec.json.decode(x) for x in _lines(env, tmp, "ag")]
        assert [a["index"] for a in agents] == list(range(100))
        assert all("failure" not in a and a["turns"] == 2 for a in agents)
    finally:
        runner.terminate()
        runner.wait(timeout=30)


def _lines(env: dict[str, str], tmp: Path, job: str) -> list[bytes]:
    out = tmp / f"{job}.jsonl"
    got = collect(env, job, out)
    assert got.returncode == 0, got.stderr
    return out.read_bytes().splitlines()


@pytest.mark.slow
async def test_the_api_runs_best_of_and_reads_its_lines(fleet_factory: FleetFactory) -> None:
    fleet = fleet_factory(2)
    fleet.worker("w", [0, 1], burst=False)
    prompts = [_input(i) for i in range(30)]
    async with Swarm(fleet.redis_url, prefix=fleet.prefix, poll_ms=50) as swarm:
        job = await swarm.best_of(prompts, 3, JUDGE, temperature=0.8, max_tokens=MAX_TOKENS)
        lines = [line async for line in swarm.lines(job)]
        with pytest.raises(ConfigError, match="is a best-of job: its results are lines"):
            await anext(swarm.results(job))
    assert [x.index for x in lines] == list(range(30))
    for x in lines:
        texts, scores, k = _expected(x.index, 3)
        assert [(c.text, c.score) for c in x.candidates] == list(zip(texts, scores, strict=True))
        assert (x.best, x.text) == (k, texts[k] if k is not None else None)
