"""Interop check of ``swarm-node`` with vLLM's CPU build as its engine command: two engines
started, waited for and drained by the node's worker, every answer equal to vLLM's own sent
alone, and the node ended by ``--burst`` with no engine left running. Run by
bench/interop_vllm.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench.vllm_checks import BIN, WORK, Checks, alone, lines_of, run
from bench.vllm_cpu import _ENGINE

__all__ = ["node_on_vllm"]


def node_on_vllm(checks: Checks, env: dict[str, str], python: Path, model: Path, url: str) -> None:
    """A job drained by swarm-node's own vLLM engines; ``url``: a server of the same model,
    for its own answers."""
    prompts = [f"Count the sources of claim {i}." for i in range(40)]
    src = WORK / "node.txt"
    src.write_text("".join(p + "\n" for p in prompts))
    enq = run(env, "swarm-enqueue", src, "--job", "node", "--max-tokens", "16",
              "--temperature", "0")  # fmt: skip
    if enq.returncode != 0:
        raise RuntimeError(f"swarm-enqueue node: {enq.stderr}")
    vllm = python.parent / "vllm"
    engine = " ".join([str(vllm), "serve", str(model), "--host", "127.0.0.1", "--port", "{port}",
                       *_ENGINE])  # fmt: skip
    logs = WORK / "node-logs"
    node_env = {**env, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    started = time.monotonic()
    with open(WORK / "node.log", "wb") as log:
        node = subprocess.run(
            [BIN / "swarm-node", "--engines", "2", "--engine", engine, "--log-dir", logs,
             "--burst"],
            env=node_env, stdout=log, stderr=subprocess.STDOUT, timeout=1800,
        )  # fmt: skip
    said = (WORK / "node.log").read_text()
    out = WORK / "node.out.jsonl"
    run(env, "swarm-collect", "node", "--out", out)
    lines = lines_of(out)
    own = [alone(url, "completions", {"prompt": p, "max_tokens": 16, "temperature": 0})
           for p in prompts]  # fmt: skip
    bad = [x["index"] for x in lines if x.get("text") != own[x["index"]]["choices"][0]["text"]]
    engines = [int(p) for p in _pids(said)]
    left = [p for p in engines if _alive(p)]
    checks.check(
        node.returncode == 0
        and len(lines) == len(prompts)
        and not bad
        and not left
        and said.count("healthy after") == 2,
        f"swarm-node --engines 2 on vLLM's CPU build: {len(lines) - len(bad)}/{len(prompts)} "
        f"answers equal to vLLM's own, ended by --burst in {time.monotonic() - started:.0f} s "
        "with no engine left",
        f"exit {node.returncode}; differ at {bad[:5]}; engines left {left}; see {WORK}/node.log",
    )


def _pids(said: str) -> list[str]:
    starts = [x for x in said.splitlines() if x.startswith("swarm-node: engine") and "(pid " in x]
    return [line.split("(pid ")[1].split(",")[0] for line in starts]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":  # against a running server: python -m bench.interop_node URL
    import sys

    from bench.vllm_cpu import build_model, install
    from swarm_queue.common.embedded import EmbeddedRedis

    WORK.mkdir(parents=True, exist_ok=True)
    python = install()
    with EmbeddedRedis() as redis:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        env.update(SWARM_REDIS_URL=redis.url, SWARM_PREFIX="interop", SWARM_POLL_MS="50")
        found = Checks()
        node_on_vllm(found, env, python, build_model(python), sys.argv[1])
    raise SystemExit(1 if found.failed else 0)
