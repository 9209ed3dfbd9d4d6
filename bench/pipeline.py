"""Scenario 11: a pipeline of three steps (answer, check, summarise) over 10,000 inputs on the
heterogeneous fleet, in one run, three ways:

* swarm-queue's pipeline: each answer queued for the next step the moment it is committed;
* swarm-queue, the steps as three jobs one after another (each step's prompts built from the
  last one's answers once all are in): the barrier, on the same queue;
* Aurora-Swarm as its users run it, installed unchanged from its repository:
  ``scatter_gather`` per step, each step's prompts built from the last one's answers.

Wall time, time to the first final answer (an input through all three steps), and the
fraction of fleet capacity (the minimum time for all three steps' tokens, every sequence
inside the engines at t=0, over the measured time). Reproduce with

    git clone https://github.com/brettin/Aurora-Swarm /tmp/aurora-swarm
    python -m bench.pipeline --aurora /tmp/aurora-swarm

It rewrites its own section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import (
    OUT,
    ROOT,
    Bench,
    Workers,
    ideal_makespan,
    new_fleet,
    wait_workers_ready,
)
from bench.rows import Row
from bench.versus import publish, worktree
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.pipeline.spec import fill
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import follow_output, output_for
from swarm_queue.producer.plain import PlainOutput
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.text import completion_for

TITLE = "## 11. A pipeline of three steps"
SPEEDS = [1.0, 1.0, 1.0, 0.5]
REAL = EngineConfig(max_num_seqs=256, step_base_ms=20.0, step_per_seq_ms=0.1)
MAX_TOKENS = 32
CHECK = "Check this answer and correct it if needed: {answer}\nQuestion: {prompt}"
SUMMARY = "Summarise in one line: {answer}"
TEMPLATES = ("{prompt}", CHECK, SUMMARY)


def inputs(n: int) -> list[str]:
    return [f"Question {i}: what does sample {i * 7919 % 100003} show?" for i in range(n)]


def every_step_prompt(questions: Sequence[str]) -> list[str]:
    """Every prompt the three steps send, as the simulator answers them."""
    out = []
    for q in questions:
        answer = q
        for template in TEMPLATES:
            prompt = fill(template, answer, q)
            out.append(prompt)
            answer = completion_for(prompt, MAX_TOKENS)[0]
    return out


async def _redis_s(store: JobStore) -> float:
    return await store.server_time()


# The pipeline's producer, run with the code of the side measured (a pipeline's specs are the
# producer's: a revision's workers read its own layout), ready before the clock starts: it
# queues the pipeline when told "go" and says "done".
_PRODUCE = """
import asyncio, json, os, sys
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
try:
    from swarm_queue.flows.pipeline.spec import StepOptions, build_pipeline, enqueue_pipeline
except ImportError:  # a revision before the workflows' folders
    from swarm_queue.flows.pipeline import StepOptions, build_pipeline, enqueue_pipeline
templates, max_tokens, questions = json.loads(sys.stdin.readline())
async def main():
    store = JobStore.from_settings(Settings(redis_url=os.environ["URL"], prefix="pipe"))
    steps = [StepOptions(template=t, options=JobOptions(max_tokens=max_tokens)) for t in templates]
    specs, _ = build_pipeline("p", JobOptions(max_tokens=max_tokens), steps, source="bench")
    print("ready", flush=True)
    sys.stdin.readline()
    await enqueue_pipeline(store, specs, ((q, None) for q in questions))
    await store.close()
    print(specs[-1].job, flush=True)
asyncio.run(main())
"""


def _producer(url: str, questions: list[str], code: Path | None) -> subprocess.Popen[str]:
    """The pipeline's producer process, with ``code``'s checkout (this one's by default),
    ready: write a line to it to queue the pipeline."""
    env = {**os.environ, "URL": url}
    if code is not None:
        env["PYTHONPATH"] = f"{code}:{ROOT}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRODUCE], cwd=code or ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps([list(TEMPLATES[1:]), MAX_TOKENS, questions]) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ready"
    return proc


async def swarm_pipeline(
    url: str, urls: list[str], questions: list[str], code: Path | None = None
) -> dict[str, Any]:
    """swarm-queue's pipeline over ``questions``; its producer and workers run ``code``'s
    checkout (another revision's, to compare), this one's by default."""
    store = JobStore.from_settings(Settings(redis_url=url, prefix="pipe"))
    workers = Workers(url, "pipe", [[u] for u in urls], code=code).start()
    producer = _producer(url, questions, code)
    try:
        await wait_workers_ready(store, len(urls))
        t0, r0 = time.monotonic(), await _redis_s(store)
        assert producer.stdin is not None and producer.stdout is not None
        producer.stdin.write("go\n")
        producer.stdin.flush()
        last = (await asyncio.to_thread(producer.stdout.readline)).strip()
        producer.wait(timeout=30)
        output = await output_for(store, await store.load_spec("p"))
        ok = 0
        async for chunk in follow_output(output)(store, "p", wait=True, poll_s=0.05):
            ok += sum(1 for c in chunk if output.ok(c))
        wall = time.monotonic() - t0
        first = float((await store.meta(last))[Meta.FIRST_RESULT_S]) - r0
        return {"wall_s": wall, "first_s": first, "answered": ok}
    finally:
        producer.kill()
        workers.stop()
        await store.close()


async def swarm_three_jobs(url: str, urls: list[str], questions: list[str]) -> dict[str, Any]:
    store = JobStore.from_settings(Settings(redis_url=url, prefix="jobs"))
    workers = Workers(url, "jobs", [[u] for u in urls]).start()
    try:
        await wait_workers_ready(store, len(urls))
        t0, r0 = time.monotonic(), await _redis_s(store)
        answers: list[str | None] = list(questions)
        for k, template in enumerate(TEMPLATES):
            spec, _ = build_spec(f"s{k}", JobOptions(max_tokens=MAX_TOKENS), source="bench")
            alive = [i for i, a in enumerate(answers) if a is not None]
            prompts = [(fill(template, answers[i] or "", questions[i]), str(i)) for i in alive]
            await enqueue_prompts(store, spec, prompts)
            got: list[str | None] = [None] * len(questions)
            rows = follow_output(PlainOutput([spec]))
            async for chunk in rows(store, spec.job, wait=True, poll_s=0.05):
                for r in chunk:
                    if r.ok:
                        got[int(r.custom_id or 0)] = r.text
            answers = got
        wall = time.monotonic() - t0
        first = float((await store.meta("s2"))[Meta.FIRST_RESULT_S]) - r0
        return {"wall_s": wall, "first_s": first, "answered": sum(a is not None for a in answers)}
    finally:
        workers.stop()
        await store.close()


async def aurora(urls: list[str], questions: list[str]) -> dict[str, Any]:
    """Aurora-Swarm as its README shows: a VLLMPool of the endpoints, scatter_gather per
    stage, each stage's prompts built from the last one's answers."""
    swarm = importlib.import_module("aurora_swarm")
    patterns = importlib.import_module("aurora_swarm.patterns.scatter_gather")
    hosts = [u.removeprefix("http://").rsplit(":", 1) for u in urls]
    endpoints = [swarm.AgentEndpoint(host, int(port)) for host, port in hosts]
    pool = swarm.VLLMPool(endpoints, model="swarm-sim", max_tokens=MAX_TOKENS)
    t0 = time.monotonic()
    answers: list[str | None] = list(questions)
    try:
        for template in TEMPLATES:
            prompts = [fill(template, a or "", q) for a, q in zip(answers, questions, strict=True)]
            responses = await patterns.scatter_gather(pool, prompts)
            answers = [
                r.text if r.success and a is not None else None
                for r, a in zip(responses, answers, strict=True)
            ]
        wall = time.monotonic() - t0
    finally:
        await pool.close()
    # Its answers come back together when the last step's scatter_gather returns.
    return {"wall_s": wall, "first_s": wall, "answered": sum(a is not None for a in answers)}


def install_aurora(source: Path) -> None:
    """Aurora-Swarm from its source tree, unchanged, into a directory of the bench's own."""
    target = OUT / "aurora-swarm"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
         "--target", str(target), str(source)],
        check=True,
    )  # fmt: skip
    sys.path.insert(0, str(target))


async def run(n: int) -> list[Row]:
    questions = inputs(n)
    ideal_fleet = new_fleet(len(SPEEDS), REAL, SPEEDS)
    ideal = ideal_makespan(every_step_prompt(questions), MAX_TOKENS, ideal_fleet.configs())
    systems = {
        "swarm-queue pipeline": lambda url, urls: swarm_pipeline(url, urls, questions),
        "swarm-queue, three jobs one after another": lambda url, urls: swarm_three_jobs(
            url, urls, questions
        ),
        "Aurora-Swarm, scatter_gather per step": lambda _url, urls: aurora(urls, questions),
    }
    rows = []
    with Bench() as bench:
        for name, system in systems.items():
            fleet = new_fleet(len(SPEEDS), REAL, SPEEDS).start()
            try:
                got = await system(bench.url, fleet.urls)
            finally:
                fleet.stop()
            first = {"first_s": got["first_s"]}
            rows.append(Row(name, got["wall_s"], got["answered"], n, ideal, first))
            print(f"{name}: {got}", file=sys.stderr, flush=True)
    return rows


def section(rows: list[Row], n: int, command: str) -> str:
    base = rows[0]
    lines = [
        TITLE,
        "",
        f"{n:,} inputs through three steps (answer, check, summarise; `max_tokens={MAX_TOKENS}` "
        "each) on the heterogeneous fleet (speeds 1, 1, 1, 0.5), the three systems one after "
        "another in one run, each on a fresh fleet. **Of capacity**: the minimum time for all "
        "three steps' tokens (every sequence inside the engines at t=0) over the measured time. "
        f"Measured with `{command}`.",
        "",
        "| system | wall (s) | first final answer (s) | inputs through | of capacity "
        "| wall vs pipeline |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.wall_s:.2f} | {r.extra['first_s']:.2f} | {r.answered:,}/{n:,} | "
            f"{(r.capacity_fraction or 0):.1%} | {r.wall_s / base.wall_s:.2f}x |"
        )
    lines += [
        "",
        "Aurora-Swarm hands back a step's answers when its slowest endpoint's share is done, "
        "and nothing before its last step returns: its first final answer is its wall time, "
        "and each step waits on the slow node. The same steps as three jobs on swarm-queue "
        "balance each step across the fleet but still wait at each barrier for the step's "
        "tail. The pipeline has the first input through all three steps after one pass, and "
        "keeps the engines fed across the steps' boundaries.",
    ]
    return "\n".join(lines) + "\n"


async def _pipeline_once(n: int, code: Path | None = None) -> dict[str, Any]:
    """swarm-queue's pipeline of ``n`` inputs alone on a fresh fleet: its figures, and the
    fraction of capacity (``of_capacity``)."""
    questions = inputs(n)
    fleet = new_fleet(len(SPEEDS), REAL, SPEEDS)
    ideal = ideal_makespan(every_step_prompt(questions), MAX_TOKENS, fleet.configs())
    with Bench() as bench:
        fleet.start()
        try:
            got = await swarm_pipeline(bench.url, fleet.urls, questions, code)
        finally:
            fleet.stop()
    assert got["answered"] == n, f"{got['answered']} of {n} inputs through"
    return {**got, "of_capacity": ideal / got["wall_s"]}


async def _pipeline_alone(n: int) -> None:
    """swarm-queue's pipeline of ``n`` inputs alone: wall, first final answer, of capacity."""
    got = await _pipeline_once(n)
    print(
        f"{n:,} inputs x 3 steps: wall {got['wall_s']:.2f} s, first final answer "
        f"{got['first_s']:.2f} s, {got['answered']:,} through, {got['of_capacity']:.1%} of "
        "capacity"
    )


async def _pipeline_versus(n: int, before: Path, rev: str, rounds: int) -> None:
    """The pipeline alone, this checkout's workers against ``before``'s, in alternating
    rounds (each side first in turn): each figure's median and the ratio, as a table."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for k in range(rounds):
        for side in ("before", "after") if k % 2 == 0 else ("after", "before"):
            got = await _pipeline_once(n, before if side == "before" else None)
            runs[side].append(got)
            print(
                f"round {k + 1} {side}: wall {got['wall_s']:.2f} s, first final answer "
                f"{got['first_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    print(f"| figure ({n:,} inputs x 3 steps, {rounds} rounds) | {rev} | this | this / {rev} |")
    print("| --- | ---: | ---: | ---: |")
    for key, name in (("wall_s", "wall (s)"), ("first_s", "first final answer (s)")):
        b, a = med("before", key), med("after", key)
        print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.3f} |")
    print(
        f"| of capacity | {med('before', 'of_capacity'):.3f} | "
        f"{med('after', 'of_capacity'):.3f} | |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--aurora", type=Path, help="Aurora-Swarm's source tree")
    p.add_argument("--no-docs", action="store_true", help="print the section, leave the docs")
    p.add_argument(
        "--only-pipeline",
        action="store_true",
        help="run swarm-queue's pipeline alone and print its figures (no Aurora-Swarm, no docs)",
    )
    p.add_argument(
        "--before",
        metavar="REV",
        help="with --only-pipeline: this checkout's workers against REV's, alternately",
    )
    p.add_argument("--rounds", type=int, default=5, help="with --before: rounds of each side")
    args = p.parse_args(argv)
    if args.only_pipeline and args.before:
        with worktree(args.before) as before:
            asyncio.run(_pipeline_versus(args.n, before, args.before, args.rounds))
        return
    if args.only_pipeline:
        asyncio.run(_pipeline_alone(args.n))
        return
    if args.aurora is None:
        p.error("--aurora PATH is required (or --only-pipeline)")
    install_aurora(args.aurora)
    rows = asyncio.run(run(args.n))
    command = "python -m bench.pipeline --aurora PATH"
    if args.n != 10_000:
        command += f" --n {args.n}"
    text = section(rows, args.n, command)
    publish(text, TITLE, docs=not args.no_docs)


if __name__ == "__main__":
    main()
