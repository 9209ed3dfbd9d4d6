"""What the real-vLLM checks share (:mod:`bench.interop_vllm`, :mod:`bench.interop_agents`):
a job through the real commands and a burst worker process, vLLM's own answer to one request
sent alone, and the checks' lines."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.vllm_cpu import OUT

__all__ = [
    "BIN", "REPO", "WORK", "Checks", "alone", "job", "lines_of", "run", "same", "same_usage",
    "worker",
]  # fmt: skip

BIN = Path(sys.executable).parent
WORK = OUT / "interop-vllm"
REPO = Path(__file__).resolve().parents[1]


class Checks:
    """The checks' lines, and whether all held."""

    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        print(
            f"  {'ok  ' if ok else 'FAIL'} {what}" + (f" ({detail})" if detail and not ok else "")
        )
        self.failed += not ok


def run(
    env: dict[str, str], *args: str | Path, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / str(args[0])), *map(str, args[1:])],
        env=env, input=stdin, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip


def worker(env: dict[str, str], url: str, name: str) -> int:
    """A burst worker process on ``url`` until no work is left; its exit status."""
    log = WORK / f"worker-{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "swarm_queue.worker.main", "--burst"],
            cwd=REPO, env={**env, "SWARM_ENDPOINTS": url, "SWARM_WORKER_NAME": name},
            stdout=fh, stderr=subprocess.STDOUT, timeout=1800,
        )  # fmt: skip
    return proc.returncode


def prefix_cache(urls: Sequence[str]) -> tuple[float, float]:
    """The prompt tokens the servers at ``urls`` looked up in their prefix caches, and found
    (vLLM's ``vllm:prefix_cache_queries_total`` and ``hits_total``, swarm-sim's alike)."""
    got = {"queries": 0.0, "hits": 0.0}
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                for name in got:
                    if line.startswith(f"vllm:prefix_cache_{name}_total"):
                        got[name] += float(line.rsplit(" ", 1)[1])
    return got["queries"], got["hits"]


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def alone(url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own answer to one request sent alone."""
    req = urllib.request.Request(
        f"{url}/v1/{route}",
        data=json.dumps({"model": "tiny-llama", **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def job(
    env: dict[str, str], url: str, name: str, inputs: Path, *flags: str
) -> list[dict[str, Any]]:
    """Queue, drain with one burst worker, collect: the output lines."""
    enq = run(env, "swarm-enqueue", inputs, "--job", name, *flags)
    if enq.returncode != 0:
        raise RuntimeError(f"swarm-enqueue {name}: {enq.stderr}")
    if (status := worker(env, url, name)) != 0:
        raise RuntimeError(f"worker for {name} exited {status}: see {WORK}/worker-{name}.log")
    out = WORK / f"{name}.out.jsonl"
    got = run(env, "swarm-collect", name, "--out", out)
    if got.returncode not in (0, 1):
        raise RuntimeError(f"swarm-collect {name}: {got.stderr}")
    return lines_of(out)


def same_usage(
    checks: Checks, what: str, lines: list[dict[str, Any]], own: list[dict[str, Any]]
) -> None:
    """Each line's usage equal to vLLM's for its request sent alone (``own``, by index)."""

    def theirs(i: int) -> dict[str, int]:
        u = own[i]["usage"]
        return {
            "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u.get("completion_tokens") or 0,
        }

    bad = [x["index"] for x in lines if x.get("usage") != theirs(x["index"])]
    checks.check(not bad, f"{what}: {len(lines) - len(bad)}/{len(lines)} lines' usage equal to "
                 "vLLM's for the prompt alone", f"differ at {bad[:5]}")  # fmt: skip


def same(
    checks: Checks, what: str, lines: list[dict[str, Any]], expect: Callable[[int], str]
) -> None:
    bad = [x["index"] for x in lines if x.get("error") or x["text"] != expect(x["index"])]
    checks.check(not bad, f"{what}: {len(lines) - len(bad)}/{len(lines)} equal to vLLM's own",
                 f"differ at {bad[:5]}")  # fmt: skip
