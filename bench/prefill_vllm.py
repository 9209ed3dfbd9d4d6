"""The shape of prefill on a real vLLM, for swarm-sim's model of it (docs/INTEROP.md): time to
first token against prompt length, each prompt new (every token computed) and sent again (its
blocks in the prefix cache), with vLLM's own prefix-cache counters.

    python bench/prefill_vllm.py [--lengths 64,256,512,1024,1536,1900] [--repeats 5]

One server of the tiny model (see :mod:`bench.vllm_cpu`; prefix caching on, vLLM's default),
requests one at a time, ``max_tokens`` 1: the time of a request is its prefill and one step.
Prompts are made of random words and measured in the model's tokens (``/tokenize``). The fit
is least squares of the new prompts' times on their tokens: the step's base time and the
time a token prefilled adds, the two numbers swarm-sim takes (``--step-ms``,
``--prefill-ms-per-token``); a cached prompt should cost about the base alone.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vllm_checks import prefix_cache
from bench.vllm_cpu import VLLM_VERSION, build_model, install, serve
from swarm_queue.common.embedded import free_port

WORDS = [f"w{n}" for n in range(500)]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None


def _count(base: str, text: str) -> int:
    return len(_post(f"{base}/tokenize", {"model": "tiny-llama", "prompt": text})["tokens"])


def _prompt(base: str, rng: random.Random, tokens: int) -> tuple[str, int]:
    """A prompt of random words of at most ``tokens`` of the model's tokens (the most words
    that fit, found by bisection), and its count."""
    words = rng.choices(WORDS, k=tokens)  # each word is a token at least
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _count(base, " ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    return text, _count(base, text)


def _time(base: str, prompt: str) -> float:
    t0 = time.perf_counter()
    _post(f"{base}/v1/completions", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1})
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="64,256,512,1024,1536,1900")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    python = install()
    model = build_model(python)
    server = serve(python, model, free_port())
    rng = random.Random(7)
    rows = []
    try:
        base = server.url
        for _ in range(3):  # warm-up: the first requests compile
            _time(base, _prompt(base, rng, 64)[0])
        for length in lengths:
            cold, warm, sizes = [], [], []
            for _ in range(args.repeats):
                prompt, n = _prompt(base, rng, length)
                _, h0 = prefix_cache([base])
                cold.append(_time(base, prompt))
                q1, h1 = prefix_cache([base])
                warm.append(_time(base, prompt))
                q2, h2 = prefix_cache([base])
                sizes.append((n, h1 - h0, h2 - h1, q2 - q1))
            n = round(statistics.median(s[0] for s in sizes))
            rows.append((n, statistics.median(cold), statistics.median(warm), sizes[-1]))
    finally:
        server.stop()
    xs, ys = [r[0] for r in rows], [r[1] for r in rows]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    base_s = my - slope * mx
    print(f"vLLM {VLLM_VERSION} (CPU), tiny-llama, one request at a time, max_tokens 1")
    print("| prompt tokens | new prompt (ms) | sent again (ms) | hit tokens again / looked up |")
    print("| ---: | ---: | ---: | ---: |")
    for n, c, w, (_, _, hit, looked) in rows:
        print(f"| {n} | {1000 * c:.1f} | {1000 * w:.1f} | {hit:.0f} / {looked:.0f} |")
    print(
        f"fit of the new prompts: {1000 * base_s:.1f} ms + {1000 * slope:.4f} ms a token "
        f"({1000 * slope * 1000:.1f} ms per 1,000 tokens)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
