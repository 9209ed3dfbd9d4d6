"""Scenario 4's job (what the system itself costs) run by this checkout and by another revision
of it, alternately, in one session: medians and their ratio. What "no slowdown" is proven by
when a change touches the hot path (the machine is shared and noisy: only a ratio measured in
one run means anything).

    python -m bench.versus --before REV [--rounds 5] [--prompts 100000]

Each run is a process of its own whose code (producer, collector and the workers it starts)
comes from one checkout; the Redis and the instant endpoints are shared, flushed between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import INSTANT, OUT, Bench, new_fleet

__all__ = ["carried_over", "main", "publish", "with_section", "worktree"]

ROOT = Path(__file__).resolve().parent.parent

# One run, in a process whose PYTHONPATH is the checkout measured: the same bench harness
# functions exist at every revision compared (bench/ is older than what it measures).
_ONE_RUN = """
import asyncio, json, os, types
import redis
from bench.harness import redis_cost, prompt_set, run_swarm

async def main():
    url, n = os.environ["BENCH_URL"], int(os.environ["BENCH_PROMPTS"])
    fleet = types.SimpleNamespace(urls=os.environ["BENCH_ENDPOINTS"].split(","))
    env = json.loads(os.environ["BENCH_WORKER_ENV"])
    async with redis_cost(url, n) as cost:
        run = await run_swarm(url, "b-versus", fleet, [[u] for u in fleet.urls],
                              prompt_set(n), 16, worker_env=env)
    cpu = getattr(run, "worker_cpu_s", None)  # measured since bench/ had it
    print(json.dumps({"wall_s": run.wall_s, "answered": run.results - run.failed,
                      "worker_cpu_s": cpu, **cost}))

asyncio.run(main())
"""

CONFIGS = {
    "batch 32 (default)": {},
    "batch 256, 4 in flight": {"SWARM_BATCH_SIZE": "256", "SWARM_INFLIGHT": "4"},
}


def _run(
    root: Path, url: str, urls: list[str], n: int, worker_env: dict[str, str]
) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "BENCH_URL": url,
        "BENCH_ENDPOINTS": ",".join(urls),
        "BENCH_PROMPTS": str(n),
        "BENCH_WORKER_ENV": json.dumps(worker_env),
    }
    out = subprocess.run(
        [sys.executable, "-c", _ONE_RUN], env=env, cwd=root, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"run from {root} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["answered"] != n:
        raise RuntimeError(f"run from {root} answered {result['answered']} of {n}")
    return result


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A checkout of ``rev`` beside this one, for the length of a comparison."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), rev],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        try:
            yield path
        finally:
            remove = ["git", "worktree", "remove", "--force", str(path)]
            subprocess.run(remove, cwd=ROOT, check=False)


def _flush(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as r:
        r.flushdb()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, metavar="REV", help="the revision compared with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=100_000)
    args = p.parse_args(argv)
    with worktree(args.before) as before:
        figures = _compare(before, args.rounds, args.prompts)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    report = {
        "before": args.before,
        "after": rev + (" with uncommitted changes" if dirty else ""),
        "rounds": args.rounds,
        "prompts": args.prompts,
        **figures,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "versus.json").write_text(json.dumps(report, indent=2))
    table = _table(report)
    print(table)
    path = ROOT / "docs" / "BENCHMARKS.md"
    command = f"python -m bench.versus --before {args.before} --rounds {args.rounds}"
    path.write_text(with_section(path.read_text(), _section(table, command)))


TITLE = "## Before and after: what a change costs the hot path"


def _section(table: str, command: str) -> str:
    return (
        f"{TITLE}\n\n"
        "Scenario 4's job (2 instant endpoints, one worker each, enqueue and collect together), "
        "run alternately by this checkout and by an earlier revision in one session; Redis and "
        "the endpoints shared, flushed between runs. Measured with "
        f"`{command}`.\n\n{table}\n"
    )


def with_section(text: str, section: str, title: str = TITLE) -> str:
    """``text`` (docs/BENCHMARKS.md) with the section ``title`` (this comparison's by
    default) replaced, or added before the defaults note. A full ``bench.run`` carries such
    sections over (see ``carried_over``)."""
    start = text.find(title)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        return text[:start] + section + "\n" + text[end + 1 if end >= 0 else len(text) :]
    at = text.find("## Defaults, and why")
    return text[:at] + section + "\n" + text[at:] if at >= 0 else text + "\n" + section


def publish(text: str, title: str, *, docs: bool = True) -> None:
    """Print a benchmark's section and (``docs``) put it into docs/BENCHMARKS.md under
    ``title``, in place of the one measured before."""
    print(text)
    if docs:
        path = ROOT / "docs" / "BENCHMARKS.md"
        path.write_text(with_section(path.read_text(), text, title))


def carried_over(old: str, title: str = TITLE) -> str | None:
    """The section ``title`` (this comparison's by default) of an earlier report, if any."""
    start = old.find(title)
    if start < 0:
        return None
    end = old.find("\n## ", start + 1)
    return old[start : end + 1 if end >= 0 else len(old)]


def _compare(before: Path, rounds: int, n: int) -> dict[str, dict[str, dict[str, float]]]:
    sides = {"before": before, "after": ROOT}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {s: [] for s in sides} for c in CONFIGS}
    with Bench() as bench:
        fleet = new_fleet(2, INSTANT).start()
        try:
            for r in range(rounds):
                # Alternate which side goes first: a drift in the machine's load hits both.
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for config, worker_env in CONFIGS.items():
                    for side in order:
                        runs[config][side].append(
                            _run(sides[side], bench.url, fleet.urls, n, worker_env)
                        )
                        _flush(bench.url)
                print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
        finally:
            fleet.stop()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for config, by_side in runs.items():
        out[config] = {}
        for side, rs in by_side.items():
            wall = statistics.median(x["wall_s"] for x in rs)
            out[config][side] = {
                "wall_s": wall,
                "prompts_per_s": n / wall,
                "redis_us_per_prompt": statistics.median(x["Redis CPU us per prompt"] for x in rs),
                "redis_commands_per_prompt": statistics.median(
                    x["Redis commands per prompt"] for x in rs
                ),
                "worker_us_per_prompt": _median_us([x.get("worker_cpu_s") for x in rs], n),
            }
    return out


def _median_us(cpu_s: list[float | None], n: int) -> float:
    """The median worker CPU per prompt (us) of runs that measured it (NaN if none did: a
    revision whose bench harness predates the figure)."""
    got = [1e6 * c / n for c in cpu_s if c is not None]
    return statistics.median(got) if got else math.nan


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['after']} against {report['before']}, {report['prompts']:,} prompts, "
        f"medians of {report['rounds']} alternating rounds.",
        "",
        "| configuration | prompts/s before | prompts/s after | after / before | Redis CPU us "
        "per prompt before | after | Redis commands per prompt before | after | worker CPU "
        "us per prompt before | after |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for config in CONFIGS:
        b, a = report[config]["before"], report[config]["after"]
        lines.append(
            f"| {config} | {b['prompts_per_s']:,.0f} | {a['prompts_per_s']:,.0f} | "
            f"{a['prompts_per_s'] / b['prompts_per_s']:.3f} | {b['redis_us_per_prompt']:.2f} | "
            f"{a['redis_us_per_prompt']:.2f} | {b['redis_commands_per_prompt']:.2f} | "
            f"{a['redis_commands_per_prompt']:.2f} | {_us(b)} | {_us(a)} |"
        )
    return "\n".join(lines)


def _us(side: dict[str, float]) -> str:
    us = side.get("worker_us_per_prompt", math.nan)
    return "n/a" if math.isnan(us) else f"{us:.1f}"


if __name__ == "__main__":
    main()
