"""A prefix-heavy job on 4 engines that charge prefill as vLLM does: documents of about 1,500
tokens, 16 questions each, the input shuffled (and, with ``--sorted``, in document order).

    python -m bench.prefix [--docs 500] [--questions 16] [--rounds 3] [--sorted]

Four systems in alternating rounds, each on a freshly started swarm-sim fleet (empty prefix
caches): swarm-queue with affinity (its default) and without, one worker per endpoint; and
vllm-router (installed into ``bench/out/router-venv`` on first use) with its ``cache_aware``
and its ``round_robin`` policy, behind a naive client of 256 requests in flight, one prompt a
request. Reported: wall time (medians, and each system's ratio to swarm-queue within each
round), the share of the fleet's decode capacity used, and the prompt tokens the engines
prefilled (their ``prefix_cache_queries`` less ``hits``) against the ideal: each document's
whole blocks once in the fleet, each prompt's own tail every time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.baselines import naive_gather
from bench.harness import OUT, Bench, SimFleetProc, free_ports, new_fleet, run_swarm
from bench.vllm_checks import prefix_cache
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.prefix import BLOCK_CHARS
from swarm_queue.sim.text import count_tokens

# vLLM's default engine (256 sequences, 2,048 tokens a step) at a GPU's decode pace; prefill
# at the real CPU build's shape: a token prefilled costs 0.0035 of a step's base time
# (docs/INTEROP.md: 7.5 ms + 0.0265 ms a token), so 1,000 tokens cost 3.5 steps.
ENGINE = EngineConfig(
    max_num_seqs=256, step_base_ms=20.0, step_per_seq_ms=0.1, max_model_len=4096, ignore_eos=True
)
PREFILL_MS_PER_TOKEN = 0.07
MAX_TOKENS = 32
DOC_CHARS = 6000  # about 1,500 tokens
ROUTER_VENV = OUT / "router-venv"
SYSTEMS = (
    "swarm-queue",
    "swarm-queue without affinity",
    "vllm-router cache_aware",
    "vllm-router round_robin",
)


def job(docs: int, questions: int, *, shuffled: bool) -> tuple[list[str], int]:
    """The prompts, and the tokens the fleet must prefill at the least."""
    rng = random.Random(11)
    texts = [
        "".join(rng.choice("abcdefghijklmnop ") for _ in range(DOC_CHARS)) for _ in range(docs)
    ]
    prompts = [f"{t}\nQuestion {q}: what does the text say about {q}?" for t in texts
               for q in range(questions)]  # fmt: skip
    shared = DOC_CHARS // BLOCK_CHARS * BLOCK_CHARS // 4  # a document's whole blocks, tokens
    ideal = sum(count_tokens(p) for p in prompts) - shared * docs * (questions - 1)
    if shuffled:
        rng.shuffle(prompts)
    return prompts, ideal


def _router() -> Path:
    exe = ROUTER_VENV / "bin" / "vllm-router"
    if not exe.exists():
        print("installing vllm-router into", ROUTER_VENV, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(ROUTER_VENV)], check=True)
        pip = ROUTER_VENV / "bin" / "pip"
        subprocess.run([str(pip), "install", "-q", "vllm-router"], check=True)
    return exe


async def _via_router(fleet: SimFleetProc, prompts: list[str], policy: str) -> float:
    port, metrics_port = free_ports(2)
    log = open(OUT / f"router-{policy}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(_router()), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
         "--prometheus-port", str(metrics_port), "--worker-urls", *fleet.urls],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"vllm-router did not start: see {log.name}") from None
                await asyncio.sleep(0.2)
        wall, answered = await naive_gather([url], prompts, MAX_TOKENS, concurrency=256)
        if answered != len(prompts):
            raise RuntimeError(f"vllm-router {policy}: {answered} of {len(prompts)} answered")
        return wall
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _runner(
    name: str, redis_url: str, prompts: list[str], round_: int
) -> Callable[[SimFleetProc], Awaitable[float]]:
    async def swarm(fleet: SimFleetProc, affinity: bool) -> float:
        run = await run_swarm(
            redis_url,
            f"prefix-{round_}-{int(affinity)}",
            fleet,
            [[u] for u in fleet.urls],
            prompts,
            MAX_TOKENS,
            enqueue={"affinity": affinity},
        )
        if run.results != len(prompts) or run.failed:
            raise RuntimeError(f"{name}: {run.results} lines, {run.failed} failed")
        return run.wall_s

    runners: dict[str, Callable[[SimFleetProc], Awaitable[float]]] = {
        SYSTEMS[0]: lambda f: swarm(f, True),
        SYSTEMS[1]: lambda f: swarm(f, False),
        SYSTEMS[2]: lambda f: _via_router(f, prompts, "cache_aware"),
        SYSTEMS[3]: lambda f: _via_router(f, prompts, "round_robin"),
    }
    return runners[name]


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=500)
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sorted", action="store_true", help="the input in document order")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="which, comma-separated")
    args = p.parse_args()
    systems = [s.strip() for s in args.systems.split(",")]
    prompts, ideal = job(args.docs, args.questions, shuffled=not args.sorted)
    capacity = 4 * ENGINE.max_num_seqs / ENGINE.step_s(ENGINE.max_num_seqs)  # tokens/s
    walls: dict[str, list[float]] = {s: [] for s in systems}
    prefilled: dict[str, list[float]] = {s: [] for s in systems}
    ratios: dict[str, list[float]] = {s: [] for s in systems}
    with Bench() as bench:
        for r in range(args.rounds):
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            this: dict[str, float] = {}
            for name in order:
                fleet = new_fleet(4, ENGINE).start(
                    "--prefill-ms-per-token", str(PREFILL_MS_PER_TOKEN), "--max-model-len", "4096"
                )
                try:
                    wall = await _runner(name, bench.url, prompts, r)(fleet)
                    queries, hits = prefix_cache(fleet.urls)
                finally:
                    fleet.stop()
                done = queries - hits
                this[name] = wall
                walls[name].append(wall)
                prefilled[name].append(done)
                said = f"{wall:.1f} s, prefilled {done / ideal:.2f}x the ideal"
                print(f"round {r + 1} {name}: {said}", flush=True)
            base = this.get(SYSTEMS[0])
            for name in systems:
                if base:
                    ratios[name].append(this[name] / base)
    kind = "sorted" if args.sorted else "shuffled"
    print(f"\n{args.docs} documents x {args.questions} questions ({len(prompts)} prompts, {kind}), "
          f"{MAX_TOKENS} tokens each, 4 swarm-sim engines, prefill {PREFILL_MS_PER_TOKEN} ms a "
          f"token; medians of {args.rounds} alternating rounds")  # fmt: skip
    print("| system | wall (s) | wall / swarm-queue's | of capacity | prefilled / ideal |")
    print("| --- | ---: | ---: | ---: | ---: |")
    tokens = len(prompts) * MAX_TOKENS
    for name in systems:
        wall = statistics.median(walls[name])
        ratio = f"{statistics.median(ratios[name]):.2f}" if ratios[name] else "-"
        share = tokens / wall / capacity
        pre = statistics.median(prefilled[name]) / ideal
        print(f"| {name} | {wall:.1f} | {ratio} | {share:.0%} | {pre:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
