"""Cold start against warm workers (issue 34): the strict heterogeneous fleet's 10,000-prompt
job, once with workers already running (warm: timed from the first enqueue) and once with
``swarm-worker --burst`` processes started together with the job (cold: timed from their
start), alternately, medians and their ratio.

    python -m bench.cold [--rounds 5] [--prompts 10000]

It rewrites its own section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

from bench.harness import Bench, new_fleet, prompt_set, run_swarm
from bench.strict import MAX_TOKENS, STRICT, ideal_s
from bench.versus import publish

__all__ = ["TITLE", "cold_versus_warm"]

TITLE = "## 10. Start-up: --burst workers started with the job against warm workers"
SPEEDS = [1.0, 1.0, 1.0, 0.5]
TARGET = 1.1  # issue 34: cold within 1.1x of warm


async def cold_versus_warm(n: int, rounds: int) -> dict[str, list[float]]:
    """Each round runs the job warm and cold (which first alternates), each on a fresh fleet:
    the walls and the first results of each."""
    walls: dict[str, list[float]] = {"warm": [], "cold": []}
    firsts: dict[str, list[float]] = {"warm": [], "cold": []}
    ideal = 0.0
    prompts = prompt_set(n)
    with Bench() as bench:
        for r in range(rounds):
            for side in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
                fleet = new_fleet(len(SPEEDS), STRICT, SPEEDS).start()
                try:
                    ideal = ideal_s(n, fleet)
                    groups = [[u] for u in fleet.urls]
                    run = await run_swarm(
                        bench.url, f"cold-{r}-{side}", fleet, groups, prompts, MAX_TOKENS,
                        burst=side == "cold",
                    )  # fmt: skip
                finally:
                    fleet.stop()
                assert run.results - run.failed == n, f"{side}: {run.results} of {n}"
                walls[side].append(run.wall_s)
                firsts[side].append(run.first_result_s)
                print(f"round {r + 1} {side}: {run.wall_s:.2f} s", file=sys.stderr, flush=True)
    return {"ideal": [ideal], **{f"{k} wall": v for k, v in walls.items()}} | {
        f"{k} first": v for k, v in firsts.items()
    }


def section(got: dict[str, list[float]], n: int, rounds: int, command: str) -> str:
    med = {k: statistics.median(v) for k, v in got.items()}
    pairs = zip(got["cold wall"], got["warm wall"], strict=True)
    ratio = statistics.median(c / w for c, w in pairs)
    ideal = med["ideal"]
    rows = [
        "| workers | wall (s), median | every round (s) | of capacity | first result (s) |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for side in ("warm", "cold"):
        rows.append(
            f"| {side} | {med[f'{side} wall']:.2f} | "
            + ", ".join(f"{w:.2f}" for w in got[f"{side} wall"])
            + f" | {ideal / med[f'{side} wall']:.1%} | {med[f'{side} first']:.2f} |"
        )
    met = "met" if ratio <= TARGET else "**not met**"
    return "\n".join(
        [
            TITLE,
            "",
            "The strict configuration's heterogeneous fleet (section 8: 64 sequences, speeds "
            f"1, 1, 1, 0.5, every output 32 tokens), {n:,} prompts, one worker per endpoint. "
            "*Warm*: long-running workers, ready before the job, timed from the first enqueue; "
            "*cold*: "
            "`swarm-worker --burst` processes started with the job, timed from their start "
            f"(their imports, Redis check, first look at the endpoints included). {rounds} "
            f"alternating rounds, each run on a fresh fleet. Measured with `{command}`.",
            "",
            *rows,
            "",
            f"- {met}: cold within {TARGET}x of warm (median of the rounds' ratios: {ratio:.3f})",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cold", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=10_000)
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args(argv)
    got = asyncio.run(cold_versus_warm(args.prompts, args.rounds))
    command = "python -m bench.cold" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")
    text = section(got, args.prompts, args.rounds, command)
    publish(text, TITLE, docs=not args.no_docs)


if __name__ == "__main__":
    main()
