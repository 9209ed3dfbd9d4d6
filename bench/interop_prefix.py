"""Affinity on a real vLLM: a documents-by-questions job, shuffled, through four ``vllm serve``
processes of the tiny model (prefix caching on, vLLM's default), once with affinity and once
without (``swarm-enqueue --no-affinity``), each on documents of its own: vLLM's own
``vllm:prefix_cache_hits_total`` over ``queries_total`` for each run, and every answer equal to
vLLM's own answer to its prompt sent alone.

    python bench/interop_prefix.py

Run by bench/interop_vllm.py too (its last check); its output is in docs/INTEROP.md.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vllm_checks import WORK, Checks, alone, lines_of, prefix_cache, run, same
from bench.vllm_cpu import VLLM_VERSION, Server, build_model, install, serve
from swarm_queue.common.embedded import EmbeddedRedis, free_port

ENGINES = 4
DOCS = 16
QUESTIONS = 4
# Each engine's KV cache, in blocks of 128 tokens (the CPU build's): about four documents of
# the eleven or so each engine sees without affinity, the regime of bench/prefix.py (a cache
# holding a third of what comes), as a GPU's holds a few of a large job's documents. The CPU
# build sizes its cache in whole GiB (VLLM_CPU_KVCACHE_SPACE, at least 1: every document of
# this job many times over), so the regime is set by vLLM's own --num-gpu-blocks-override.
CACHE_BLOCKS = 48
# The words the tiny model's tokenizer was trained on (bench/vllm_cpu.py): a token or two each.
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "paper",
    "tool",
    "fetch",
    "add",
    "answer",
    "json",
    "title",
    "year",
    "the",
    "of",
    "and",
    "call",
    "result",
    "number",
    "find",
    "check",
]


def _documents(seed: int) -> list[str]:
    """Documents of 800 words of its tokenizer's, about 1,000 to 1,600 tokens of the tiny
    model (room for a question and an answer in its 2,048) and 4,400 characters (the affinity
    key's levels count characters: a key of 4,096 shared)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=800)) for _ in range(DOCS)]


def _run(
    checks: Checks, env: dict[str, str], urls: list[str], name: str, seed: int, *flags: str
) -> float:
    """The job on documents of ``seed``: every answer checked against vLLM's own; its hit
    rate."""
    asked = [f"{d}\nQuestion {q}: which word comes first?" for d in _documents(seed)
             for q in range(QUESTIONS)]  # fmt: skip
    random.Random(seed).shuffle(asked)
    src = WORK / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in asked))
    enq = run(env, "swarm-enqueue", src, "--job", name, "--max-tokens", "8",
              "--temperature", "0", *flags)  # fmt: skip
    if enq.returncode != 0:
        raise RuntimeError(f"swarm-enqueue {name}: {enq.stderr}")
    before = prefix_cache(urls)
    log = WORK / f"worker-{name}.log"
    with open(log, "wb") as fh:
        code = subprocess.run(
            [sys.executable, "-m", "swarm_queue.worker.main", "--burst"],
            env={**env, "SWARM_ENDPOINTS": ",".join(urls), "SWARM_WORKER_NAME": name,
                 "SWARM_BATCH_SIZE": "4", "SWARM_INFLIGHT": "2"},
            stdout=fh, stderr=subprocess.STDOUT, timeout=1800,
        ).returncode  # fmt: skip
    if code != 0:
        raise RuntimeError(f"worker {name} exited {code}: see {log}")
    queries, hits = (a - b for a, b in zip(prefix_cache(urls), before, strict=True))
    out = WORK / f"{name}.out.jsonl"
    got = run(env, "swarm-collect", name, "--out", out)
    if got.returncode != 0:
        raise RuntimeError(f"swarm-collect {name}: {got.stderr}")
    lines = lines_of(out)
    own = [alone(urls[0], "completions", {"prompt": p, "max_tokens": 8, "temperature": 0})
           for p in asked]  # fmt: skip
    checks.check(len(lines) == len(asked), f"{name}: {len(lines)} of {len(asked)} lines")
    same(checks, f"{name}: every answer vLLM's own", lines,
         lambda i: own[i]["choices"][0]["text"])  # fmt: skip
    return hits / queries if queries else 0.0


def prefix_affinity(checks: Checks, env: dict[str, str], python: Path, model: Path) -> None:
    """The check: hit rate with affinity at least twice the hit rate without."""
    servers: list[Server] = []
    try:
        with ThreadPoolExecutor(ENGINES) as pool:
            servers += pool.map(
                lambda _: serve(
                    python, model, free_port(), "--num-gpu-blocks-override", str(CACHE_BLOCKS)
                ),
                range(ENGINES),
            )
        urls = [s.url for s in servers]
        on = _run(checks, env, urls, "affine", 1)
        off = _run(checks, env, urls, "scattered", 2, "--no-affinity")
        checks.check(
            on >= 2 * off,
            f"affinity on {ENGINES} vLLM engines: prefix cache hit rate {on:.2f} with, "
            f"{off:.2f} without ({DOCS} documents x {QUESTIONS} questions, shuffled; "
            f"{CACHE_BLOCKS} blocks of cache an engine)",
        )
    finally:
        for s in servers:
            s.stop()


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)  # a run's outputs: each run its own Redis and jobs
    WORK.mkdir(parents=True)
    python = install()
    model = build_model(python)
    checks = Checks()
    started = time.monotonic()
    with EmbeddedRedis() as redis:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        env.update(SWARM_REDIS_URL=redis.url, SWARM_PREFIX="prefix", SWARM_POLL_MS="50")
        print(f"vLLM {VLLM_VERSION} (CPU), {ENGINES} servers of the tiny model")
        prefix_affinity(checks, env, python, model)
    print(f"{'all checks held' if not checks.failed else f'{checks.failed} checks FAILED'} "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
