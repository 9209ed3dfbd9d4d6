"""Issue 34's agent scenario: agents against the fleet's capacity, and where the time goes.

``N`` agents of ``T`` turns (each turn but the last one call of a 200 ms tool, 100 distinct
arguments among them) on a heterogeneous fleet of 4 swarm-sim engines (speeds 1, 1, 1, 0.5;
64 sequences each, a step 22.6 ms + 0.1 ms a sequence: some 550-650 sequences/s for the
fleet at these answers' lengths, as the section says), warm workers (one per endpoint, started
and ready before the job) and one tool runner. Measured:

* **of capacity**: the fleet's least time for the run's decoded-and-kept tokens at full
  batches, plus the tool's 200 ms for each turn that waits on it, over the wall time;
* **wasted decode**: tokens the engines decoded beyond those of the answers kept (sequences
  aborted when a batch was preempted or a tail copy lost), as a share of those kept;
* **worker CPU** per turn (the worker processes' user + system time during the run);
* **the timeline**: each engine's running sequences, each turn's answers, the agents parked on
  a tool, sampled every 100 ms and shown per 0.5 s.

    python -m bench.agent_speed                    # 1,000 agents x 2 turns
    python -m bench.agent_speed --agents 10000 --turns 3

It rewrites its own section of docs/BENCHMARKS.md (one per agents x turns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import (
    OUT,
    ROOT,
    TOOL_RUNNER,
    Bench,
    Periodic,
    Workers,
    cpu_s,
    metrics,
    new_fleet,
    token_capacity,
    wait_workers_ready,
)
from bench.versus import with_section, worktree
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import decode_result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.output import follow_output, output_for
from swarm_queue.sim.engine import EngineConfig

TITLE = "## 14. Agents against the fleet's capacity"
SPEEDS = [1.0, 1.0, 1.0, 0.5]
ENGINE = EngineConfig(max_num_seqs=64, step_base_ms=22.6, step_per_seq_ms=0.1)
TOOL_PARSER = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
TOOL_S = 0.2
KEYS = 100
SAMPLE_S = 0.1
SHOWN_S = 0.5
LOG = OUT / "agent-speed-tools.log"


def task(turns: int) -> str:
    """The agents' task: a tool call in every turn but the last."""
    calls = " then ".join(f'CALL lookup({{{{"key": "{{key}}-{k}"}}}})' for k in range(turns - 1))
    return f"Question {{n}}: find it out. {calls}"


def inputs(n: int) -> list[dict[str, Any]]:
    return [{"n": i, "key": f"k{i % KEYS}"} for i in range(n)]


# (t, each engine's running sequences, each engine's waiting ones, each turn's answers and
# prompts queued, agents parked)
Sample = tuple[float, list[float], list[float], list[tuple[int, int]], int]


@dataclass
class Timeline(Periodic):
    """Every ``SAMPLE_S``: each engine's running sequences, each turn's answers, agents
    parked on a tool."""

    urls: list[str]
    store: JobStore
    turns: list[str]
    t0: float = field(default_factory=time.monotonic)
    rows: list[Sample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as client:
            while True:
                ms = await asyncio.gather(*(metrics(client, u) for u in self.urls))
                running = [m.get("vllm:num_requests_running", 0.0) for m in ms]
                waiting = [m.get("vllm:num_requests_waiting", 0.0) for m in ms]
                done: list[tuple[int, int]] = []
                for job in self.turns:
                    try:
                        s = await self.store.status(job, rate=False)
                        done.append((s.done + s.failed, s.enqueued))
                    except Exception:  # a turn's job not made yet
                        done.append((0, 0))
                parked = (await self.store.outcome_counts(self.turns[0])).parked
                self.rows.append((time.monotonic() - self.t0, running, waiting, done, parked))
                await asyncio.sleep(SAMPLE_S)

    def table(self) -> list[str]:
        """Per ``SHOWN_S`` (or a multiple of it: about 24 rows at most), each engine's mean
        running sequences (of its 64) and, after a +, those waiting in it, each turn's answers so
        far, agents parked on a tool."""
        end = self.rows[-1][0] if self.rows else 0.0
        step = SHOWN_S * max(1, math.ceil(end / SHOWN_S / 24))
        turns = " | ".join(f"turn {k + 1} answered of queued" for k in range(len(self.turns)))
        engines = " | ".join(f"engine {i} ({s:g}) running" for i, s in enumerate(SPEEDS))
        out = [f"| t (s) | {engines} | {turns} | parked on the tool |"]
        out.append("| " + " | ".join(["---:"] * (2 + len(SPEEDS) + len(self.turns))) + " |")
        bucket: list[Sample] = []
        edge = step
        for row in [*self.rows, (float("inf"), [], [], [], 0)]:
            if row[0] >= edge and bucket:
                run = [sum(r[1][i] for r in bucket) / len(bucket) for i in range(len(SPEEDS))]
                wait = [sum(r[2][i] for r in bucket) / len(bucket) for i in range(len(SPEEDS))]
                last = bucket[-1]
                cells = [f"{edge:.1f}"]
                cells += [
                    f"{r:.0f}" + (f" +{w:.0f}" if w >= 0.5 else "")
                    for r, w in zip(run, wait, strict=True)
                ]
                cells += [f"{d:,} of {q:,}" for d, q in last[3]] + [f"{last[4]:,}"]
                out.append("| " + " | ".join(cells) + " |")
                bucket = []
                while row[0] >= edge and row[0] != float("inf"):
                    edge += step
            bucket.append(row)
        return out


async def _kept_tokens(store: JobStore, turns: list[str]) -> tuple[int, int]:
    """Tokens of the answers kept (the results of every turn) and how many answers."""
    tokens = answers = 0
    for job in turns:
        status = await store.status(job, rate=False)
        for raw in await store.results_at(job, range(status.enqueued)):
            if raw is None:
                continue
            r = decode_result(raw)
            answers += 1
            tokens += r.usage.completion_tokens if r.usage is not None else 0
    return tokens, answers


# The agents' producer, run with the code of the side measured (an agent job's specs are
# built by the producer: a change to them must count on its side, not on both), ready
# before the clock starts: it queues the agents when told "go" and says "done".
_PRODUCE = """
import asyncio, json, os, sys
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
try:
    from swarm_queue.flows.agents.spec import (
        AgentSpec, agent_prompts, build_agents, enqueue_agents, tool_definition,
    )
except ImportError:  # a revision before the workflows' folders
    from swarm_queue.flows.agents import (
        AgentSpec, agent_prompts, build_agents, enqueue_agents, tool_definition,
    )
n, turns, task = json.loads(sys.argv[1])
async def main():
    url = os.environ["SWARM_REDIS_URL"]
    store = JobStore.from_settings(Settings(redis_url=url, prefix="speed"))
    specs, _ = build_agents(
        "ag", JobOptions(max_tokens=64), AgentSpec(max_turns=turns),
        [tool_definition("lookup")], source="bench",
    )
    inputs = [{"n": i, "key": f"k{i % KEYS}"} for i in range(n)]
    print("ready", flush=True)
    sys.stdin.readline()
    await enqueue_agents(store, specs, agent_prompts(task, inputs))
    await store.close()
    print("done", flush=True)
asyncio.run(main())
"""


class _Producer:
    """The agents' producer process of one side, started and ready."""

    def __init__(self, env: dict[str, str], code: Path | None, n: int, turns: int) -> None:
        source = _PRODUCE.replace("KEYS", str(KEYS))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source, json.dumps([n, turns, task(turns)])],
            cwd=code or ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env if code is None else {**env, "PYTHONPATH": f"{code}:{ROOT}"},
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    async def go(self) -> None:
        """Queue the agents; returns once they are queued."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        said = await asyncio.to_thread(self.proc.stdout.readline)
        assert said.strip() == "done", f"the producer said {said!r}"
        self.proc.wait(timeout=30)


async def run(n: int, turns: int, code: Path | None = None) -> dict[str, Any]:
    with Bench() as bench:
        fleet = new_fleet(len(SPEEDS), ENGINE, SPEEDS).start(*TOOL_PARSER)
        settings = Settings(redis_url=bench.url, prefix="speed")
        store = JobStore.from_settings(settings)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SWARM_")},
            "SWARM_REDIS_URL": bench.url,
            "SWARM_PREFIX": "speed",
            "SWARM_TOOLS": "bench.agent_tools:lookup",
            "SWARM_TOOL_CONCURRENCY": "2048",
            "BENCH_TOOL_LOG": str(LOG),
        }
        LOG.unlink(missing_ok=True)
        with open(OUT / "agent-speed-runner.log", "wb") as out:
            runner = subprocess.Popen(
                [sys.executable, "-c", TOOL_RUNNER],
                cwd=code or ROOT, stdout=out, stderr=subprocess.STDOUT,
                env=env if code is None else {**env, "PYTHONPATH": f"{code}:{ROOT}"},
            )  # fmt: skip
        worker_env = {"SWARM_POLL_MS": "20"}
        # Settings of the workers to try (SWARM_* in the bench's own environment are not
        # passed on): BENCH_WORKER_ENV='{"SWARM_LANE_WAIT_MS": "250"}'.
        worker_env |= json.loads(os.environ.get("BENCH_WORKER_ENV", "{}"))
        workers = Workers(bench.url, "speed", [[u] for u in fleet.urls], worker_env, code=code)
        workers.start()
        names = [step_name("ag", k) for k in range(turns)]
        try:
            await wait_workers_ready(store, len(fleet.urls))
            others = {"swarm-sim": fleet.proc, "tool runner": runner, "Redis": bench.redis.proc}
            pids = {k: v.pid for k, v in others.items() if v is not None}
            cpu0 = sum(cpu_s(p.pid) for p in workers.procs)
            other0 = {k: cpu_s(pid) for k, pid in pids.items()}
            producer = _Producer(env, code, n, turns)
            timeline = Timeline(fleet.urls, store, names)
            t0 = time.monotonic()
            timeline.start()
            await producer.go()
            ok = 0
            rows = follow_output(await output_for(store, await store.load_spec("ag")))
            async for chunk in rows(store, "ag", wait=True, poll_s=0.02):
                ok += sum(1 for r in chunk if r.ok)
            wall = time.monotonic() - t0
            await timeline.stop()
            cpu = sum(cpu_s(p.pid) for p in workers.procs) - cpu0
            other = {k: cpu_s(pid) - other0[k] for k, pid in pids.items()}
            async with aiohttp.ClientSession() as client:
                ms = await asyncio.gather(*(metrics(client, u) for u in fleet.urls))
            kept, answers = await _kept_tokens(store, names)
        finally:
            workers.stop()
            runner.terminate()
            runner.wait(timeout=30)
            await store.close()
            fleet.stop()
    decoded = sum(m.get("vllm:generation_tokens_total", 0.0) for m in ms)
    capacity = sum(token_capacity(c) for c in fleet.configs())
    ideal = kept / capacity + TOOL_S * (turns - 1)
    return {
        "wall_s": wall,
        "ok": ok,
        "answers": answers,
        "kept_tokens": kept,
        "decoded_tokens": int(decoded),
        "aborted": int(sum(m.get("swarm_sim:aborted_seqs_total", 0.0) for m in ms)),
        "requests": int(sum(m.get("swarm_sim:http_requests_total", 0.0) for m in ms)),
        "seqs_per_s": capacity / (kept / answers) if answers else 0.0,
        "ideal_s": ideal,
        "worker_cpu_s": cpu,
        "other_cpu_s": other,
        "tools": len(LOG.read_text().split()) if LOG.exists() else 0,
        "timeline": timeline.table(),
    }


def section(got: dict[str, Any], n: int, turns: int, command: str) -> str:
    title = f"{TITLE}: {n:,} agents x {turns} turns"
    wasted = (got["decoded_tokens"] - got["kept_tokens"]) / max(1, got["kept_tokens"])
    lines = [
        title,
        "",
        f"{n:,} agents of {turns} turns, a 200 ms tool call in each turn but the last ({KEYS} "
        "distinct arguments), on 4 swarm-sim engines of speeds 1, 1, 1, 0.5 (64 sequences "
        "each, 22.6 ms + 0.1 ms per sequence a step; "
        f"{got['seqs_per_s']:.1f} sequences/s for the fleet at these answers' mean length), "
        "warm workers (one per endpoint) and one tool runner. **Of capacity**: the fleet's "
        "least time for the kept answers' tokens at full batches, plus 200 ms per tool turn, "
        f"over the wall time. Measured with `{command}`.",
        "",
        "| wall (s) | ideal (s) | of capacity | agents answered | chat requests | answers kept | "
        "tokens decoded / kept | wasted decode | sequences aborted | worker CPU per turn | "
        "tool runs |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {got['wall_s']:.2f} | {got['ideal_s']:.2f} | {got['ideal_s'] / got['wall_s']:.2f} | "
        f"{got['ok']:,}/{n:,} | {got['requests']:,} | {got['answers']:,} | "
        f"{got['decoded_tokens']:,} / {got['kept_tokens']:,} | {wasted:.1%} | "
        f"{got['aborted']:,} | {1000 * got['worker_cpu_s'] / max(1, got['answers']):.1f} ms | "
        f"{got['tools']:,} |",
        "",
        f"CPU over the run's {got['wall_s']:.1f} s on this machine's 2 cores: the 4 workers "
        f"{got['worker_cpu_s']:.1f} s, "
        + ", ".join(f"{k} {v:.1f} s" for k, v in got["other_cpu_s"].items())
        + ".",
        "",
        "Where the time goes (each engine's running sequences and, after a +, those waiting "
        "in it, means over each interval; each "
        "turn's answers and the agents parked on the tool at its end):",
        "",
        *got["timeline"],
    ]
    return "\n".join(lines) + "\n"


async def versus(n: int, turns: int, before: Path, rounds: int) -> list[str]:
    """This checkout's workers and tool runner against ``before``'s, alternately (the
    producer and collector this checkout's): each figure's median and the ratio."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for k in range(rounds):
        for side in ("before", "after") if k % 2 == 0 else ("after", "before"):
            got = await run(n, turns, before if side == "before" else None)
            assert got["ok"] == n, f"{side}: {got['ok']} of {n} agents answered"
            runs[side].append(got)
            print(f"round {k + 1} {side}: {got['wall_s']:.2f} s", file=sys.stderr, flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(
            r[key]
            if key != "wasted"
            else (r["decoded_tokens"] - r["kept_tokens"]) / r["kept_tokens"]
            for r in runs[side]
        )

    def cpu(side: str) -> float:
        return statistics.median(r["worker_cpu_s"] / r["answers"] for r in runs[side])

    b, a = runs["before"][0], runs["after"][0]
    rows = [
        "| figure | before | after | after / before |",
        "| --- | ---: | ---: | ---: |",
        f"| wall (s) | {med('before', 'wall_s'):.2f} | {med('after', 'wall_s'):.2f} | "
        f"{med('after', 'wall_s') / med('before', 'wall_s'):.3f} |",
        f"| of capacity | {b['ideal_s'] / med('before', 'wall_s'):.2f} | "
        f"{a['ideal_s'] / med('after', 'wall_s'):.2f} | |",
        f"| wasted decode | {med('before', 'wasted'):.1%} | {med('after', 'wasted'):.1%} | |",
        f"| sequences aborted | {med('before', 'aborted'):.0f} | {med('after', 'aborted'):.0f} | |",
        f"| worker CPU per turn (ms) | {1000 * cpu('before'):.2f} | {1000 * cpu('after'):.2f} | "
        f"{cpu('after') / cpu('before'):.3f} |",
    ]
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.agent_speed", description=__doc__)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--before", metavar="REV", help="also run REV's workers, alternately")
    p.add_argument("--rounds", type=int, default=5, help="with --before: rounds of each")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.agent_speed"
    if os.environ.get("BENCH_WORKER_ENV"):  # the workers' settings tried: part of the command
        command = f"BENCH_WORKER_ENV='{os.environ['BENCH_WORKER_ENV']}' {command}"
    if (args.agents, args.turns) != (1000, 2):
        command += f" --agents {args.agents} --turns {args.turns}"
    compared: list[str] = []
    if args.before:
        with worktree(args.before) as before:
            compared = asyncio.run(versus(args.agents, args.turns, before, args.rounds))
        command += f" --before {args.before} --rounds {args.rounds}"
    got = asyncio.run(run(args.agents, args.turns))
    text = section(got, args.agents, args.turns, command)
    if compared:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        text += (
            f"\n{rev} against {args.before}, the producer, workers and tool runner of each run "
            f"alternately (medians of {args.rounds} rounds each; the table and timeline above "
            "are one more run of this checkout's):\n\n" + "\n".join(compared) + "\n"
        )
    print(text)
    if not args.no_docs:
        path = ROOT / "docs" / "BENCHMARKS.md"
        title = f"{TITLE}: {args.agents:,} agents x {args.turns} turns"
        path.write_text(with_section(path.read_text(), text, title))


if __name__ == "__main__":
    main()
