"""Speed on a real vLLM: the same job through swarm-queue, a naive ``AsyncOpenAI`` client (64 and
256 requests in flight) and ``vllm run-batch``, alternating, on one server of the tiny model
(see :mod:`bench.vllm_cpu`; ``--max-num-seqs 64``).

    python bench/vllm_speed.py [--sizes 400,4000] [--rounds 3] [--run-batch]

Every system is timed as a user runs it, from the first command started to the last answer
on disk: swarm-queue as ``swarm-enqueue``, a burst worker and ``swarm-collect`` (three
processes, one after the other, as a user types them), and as ``swarm-enqueue`` and
``swarm-collect --wait`` with a worker already running (as on a compute node); the naive
client as one Python process that sends one ``completions.create`` per prompt and writes the
answers; ``vllm run-batch`` as its own process (it loads its own engine: chat lines, since
0.32 refuses completions lines).
Each round runs every system once, the order rotated; the table gives each system's median
and its ratio to swarm-queue within each round (median of the rounds). Greedy answers are
compared: every system must give vLLM's same text for every prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from bench.vllm_cpu import OUT, VLLM_VERSION, build_model, install, run_batch, serve
from swarm_queue.common.embedded import EmbeddedRedis, free_port

BIN = Path(sys.executable).parent
WORK = OUT / "vllm-speed"
REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 16


def prompts(n: int) -> list[str]:
    return [f"Find the paper number {i} and check its year." for i in range(n)]


async def _naive(url: str, n: int, concurrency: int, out: Path) -> None:
    """The naive client: one request per prompt, ``concurrency`` in flight, answers in order."""
    import openai  # imported here, as a user's script pays for it

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0,
                                timeout=3600)  # fmt: skip
    sem = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> str:
        async with sem:
            r = await client.completions.create(model="tiny-llama", prompt=prompt,
                                                max_tokens=MAX_TOKENS, temperature=0)  # fmt: skip
            return r.choices[0].text

    texts = await asyncio.gather(*(one(p) for p in prompts(n)))
    await client.close()
    out.write_text("".join(json.dumps({"index": i, "text": t}) + "\n" for i, t in enumerate(texts)))


def _texts(path: Path, key: str = "text") -> dict[int, str]:
    got: dict[int, str] = {}
    for line in path.read_bytes().splitlines():
        x = msgspec.json.decode(line)
        got[x["index"]] = x.get(key) or ""
    return got


class Systems:
    """One server, one Redis: each system's run of an ``n``-prompt job, timed as a user runs it."""

    def __init__(self, python: Path, model: Path, url: str, redis_url: str) -> None:
        self.python, self.model, self.url = python, model, url
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        self.env.update(SWARM_REDIS_URL=redis_url, SWARM_PREFIX="speed")
        self.runs = 0

    def swarm(self, n: int) -> tuple[float, dict[int, str], dict[str, float]]:
        self.runs += 1
        job = f"speed-{self.runs}"
        src = WORK / f"prompts-{n}.txt"
        out = WORK / f"{job}.jsonl"
        env = {**self.env, "SWARM_ENDPOINTS": self.url, "SWARM_WORKER_NAME": job}
        phases: dict[str, float] = {}
        t0 = time.monotonic()
        for phase, cmd in (
            ("enqueue", [str(BIN / "swarm-enqueue"), str(src), "--job", job, "--max-tokens",
                         str(MAX_TOKENS), "--temperature", "0"]),
            ("worker", [sys.executable, "-m", "swarm_queue.worker.main", "--burst"]),
            ("collect", [str(BIN / "swarm-collect"), job, "--out", str(out)]),
        ):  # fmt: skip
            start = time.monotonic()
            with open(WORK / f"{job}-{phase}.log", "wb") as log:
                subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               check=True, timeout=3600)  # fmt: skip
            phases[phase] = time.monotonic() - start
        wall = time.monotonic() - t0
        subprocess.run([str(BIN / "swarm-jobs"), "--delete", job], env=env, capture_output=True)
        return wall, _texts(out), phases

    def swarm_up(self, n: int) -> tuple[float, dict[int, str]]:
        """The job on a worker already running (``swarm-worker`` on a compute node, as a long
        job runs): ``swarm-enqueue`` then ``swarm-collect --wait``. The worker is started
        before the clock, and stopped after (no other system's job meets it)."""
        self.runs += 1
        job = f"speed-{self.runs}"
        out = WORK / f"{job}.jsonl"
        log = WORK / f"{job}-worker.log"
        env = {**self.env, "SWARM_ENDPOINTS": self.url, "SWARM_WORKER_NAME": job}
        with open(log, "wb") as fh:
            worker = subprocess.Popen(
                [sys.executable, "-m", "swarm_queue.worker.main"],
                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            while f"worker {job}: 1 endpoint(s)" not in log.read_text():
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited {worker.returncode}: see {log}")
                time.sleep(0.05)
            t0 = time.monotonic()
            for cmd in (
                [str(BIN / "swarm-enqueue"), str(WORK / f"prompts-{n}.txt"), "--job", job,
                 "--max-tokens", str(MAX_TOKENS), "--temperature", "0"],
                [str(BIN / "swarm-collect"), job, "--out", str(out), "--wait"],
            ):  # fmt: skip
                subprocess.run(cmd, env=self.env, capture_output=True, check=True, timeout=3600)
            wall = time.monotonic() - t0
        finally:
            worker.terminate()
            worker.wait(timeout=60)
        subprocess.run([str(BIN / "swarm-jobs"), "--delete", job], env=self.env,
                       capture_output=True)  # fmt: skip
        return wall, _texts(out)

    def naive(self, n: int, concurrency: int) -> tuple[float, dict[int, str]]:
        out = WORK / f"naive-{concurrency}.jsonl"
        t0 = time.monotonic()
        subprocess.run([sys.executable, __file__, "--naive", self.url, str(n), str(concurrency),
                        str(out)], check=True, timeout=3600)  # fmt: skip
        return time.monotonic() - t0, _texts(out)

    def run_batch(self, n: int) -> tuple[float, dict[int, str]]:
        src = WORK / f"batch-{n}.jsonl"
        src.write_text("".join(
            json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "tiny-llama", "max_tokens": MAX_TOKENS,
                                 "temperature": 0,
                                 "messages": [{"role": "user", "content": p}]}}) + "\n"
            for i, p in enumerate(prompts(n))
        ))  # fmt: skip
        out = WORK / "run-batch.out.jsonl"
        t0 = time.monotonic()
        run_batch(self.python, self.model, src, out, WORK / "run-batch.log")
        wall = time.monotonic() - t0
        got = {}
        for line in out.read_bytes().splitlines():
            x = msgspec.json.decode(line)
            body = (x.get("response") or {}).get("body") or {}
            got[int(x["custom_id"])] = (
                body.get("choices", [{}])[0].get("message", {}).get("content", "")
            )
        return wall, got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="400,4000")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--run-batch",
        action="store_true",
        help="also time `vllm run-batch` (loads its own engine each round)",
    )
    p.add_argument("--naive", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.naive:
        url, n, conc, out = args.naive
        asyncio.run(_naive(url, int(n), int(conc), Path(out)))
        return 0
    shutil.rmtree(WORK, ignore_errors=True)  # a run's outputs: each run its own Redis and jobs
    WORK.mkdir(parents=True)
    python = install()
    model = build_model(python)
    sizes = [int(x) for x in args.sizes.split(",")]
    for n in sizes:
        (WORK / f"prompts-{n}.txt").write_text("".join(x + "\n" for x in prompts(n)))
    server = serve(python, model, free_port())
    results: dict[str, Any] = {"vllm": VLLM_VERSION, "sizes": {}}
    try:
        with EmbeddedRedis() as redis:
            systems = Systems(python, model, server.url, redis.url)
            systems.naive(64, 64)  # the engine's first requests compile kernels: not timed
            for n in sizes:
                results["sizes"][n] = _size(systems, n, args.rounds, args.run_batch)
    finally:
        server.stop()
    _print(results)
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    return 0


def _size(systems: Systems, n: int, rounds: int, with_run_batch: bool) -> dict[str, Any]:
    names = ["swarm-queue", "swarm-queue, worker up", "naive 64", "naive 256"] + (
        ["vllm run-batch"] if with_run_batch else []
    )
    walls: dict[str, list[float]] = {x: [] for x in names}
    phases: list[dict[str, float]] = []
    reference: dict[int, str] | None = None
    differ: dict[str, int] = {x: 0 for x in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if name == "swarm-queue":
                wall, got, ph = systems.swarm(n)
                phases.append(ph)
            elif name == "swarm-queue, worker up":
                wall, got = systems.swarm_up(n)
            elif name == "vllm run-batch":
                wall, got = systems.run_batch(n)
            else:
                wall, got = systems.naive(n, int(name.split()[1]))
            walls[name].append(wall)
            if name == "vllm run-batch":
                continue  # chat answers, not the completions the others get
            if reference is None:
                reference = got
            differ[name] += sum(1 for i in range(n) if got.get(i) != reference.get(i))
            print(f"  {n} prompts, round {r + 1}: {name} {wall:.2f} s", flush=True)
    ratios = {
        x: statistics.median(walls[x][i] / walls["swarm-queue"][i] for i in range(rounds))
        for x in names
    }
    return {
        "median_s": {x: statistics.median(walls[x]) for x in names},
        "ratio_to_swarm": ratios,
        "walls": walls,
        "differ": differ,
        "swarm_phases_median_s": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
    }


def _print(results: dict[str, Any]) -> None:
    print(f"\nvLLM {results['vllm']} (CPU), tiny-llama, --max-num-seqs 64, max_tokens "
          f"{MAX_TOKENS}, greedy")  # fmt: skip
    print("| prompts | system | median s | time / swarm-queue's (per round, median) | "
          "answers differing |")  # fmt: skip
    print("|---|---|---|---|---|")
    for n, r in results["sizes"].items():
        for name, med in r["median_s"].items():
            print(f"| {n} | {name} | {med:.2f} | {r['ratio_to_swarm'][name]:.2f} | "
                  f"{r['differ'][name] if name != 'vllm run-batch' else '-'} |")  # fmt: skip
        ph = r["swarm_phases_median_s"]
        print(f"|  | (swarm-queue: enqueue {ph['enqueue']:.2f} s, worker {ph['worker']:.2f} s, "
              f"collect {ph['collect']:.2f} s) | | | |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
