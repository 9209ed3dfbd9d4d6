"""Scenario 8: the strict configuration (issue 13). Engines like a small real one: at most 64
sequences, every output exactly 32 tokens (vLLM's ignore_eos), and the ideal with no allowance
for a tail: prompts over the fleet's summed capacity. Each case runs swarm-queue and, beside
it, static round-robin (what the user ran before) on a fresh fleet."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bench.baselines import static_round_robin
from bench.harness import (
    Bench,
    SimFleetProc,
    from_exit_lines,
    kill_at_share,
    new_fleet,
    prompt_set,
    run_swarm,
)
from bench.rows import Row, Scenario
from swarm_queue.common.store import JobStore
from swarm_queue.sim.engine import EngineConfig

__all__ = ["STRICT", "strict_scenario"]

# 10 ms + 0.1 ms per running sequence: 16.4 ms a step at a full batch of 64.
STRICT = EngineConfig(max_num_seqs=64, step_base_ms=10.0, step_per_seq_ms=0.1, ignore_eos=True)
MAX_TOKENS = 32
BATCH = 32  # the workers' batch size (SWARM_BATCH_SIZE's default)


@dataclass(frozen=True)
class Case:
    label: str
    n: int
    speeds: tuple[float, ...]
    burst: bool = False  # --burst workers started with the job, else workers already running
    kill_at: float | None = None  # the last endpoint dies once this share is answered
    target: float = 0.0  # of capacity (or, with kill_at, 1 / the allowed ratio)


CASES = (
    Case("homogeneous", 20_000, (1.0,) * 4, target=0.98),
    Case("homogeneous", 10_000, (1.0,) * 4, target=0.96),
    Case("heterogeneous 1, 1, 1, 0.5", 20_000, (1.0, 1.0, 1.0, 0.5), target=0.97),
    Case(
        "heterogeneous, --burst workers started with the job",
        10_000,
        (1.0, 1.0, 1.0, 0.5),
        burst=True,
        target=0.93,
    ),
    Case(
        "one of 4 dies a third of the way",
        20_000,
        (1.0,) * 4,
        kill_at=1 / 3,
        target=1 / 1.05,
    ),
)


def ideal_s(n: int, fleet: SimFleetProc, alive: list[bool] | None = None) -> float:
    """``n`` prompts over the summed capacity of the (live) engines: no tail allowed for."""
    return n / sum(c.capacity_seqs_per_s(MAX_TOKENS) for c in fleet.configs(alive))


# "More than a moment": a queue of over one batch at an endpoint is shed within a second
# (two batches' service time at full speed, four samples).
MOMENT_S = 1.0


def over_one_batch(
    series: list[tuple[float, list[float], list[float], int]],
) -> tuple[float, float]:
    """Per endpoint, the samples with more than one batch waiting beyond its running slots: the
    largest share of samples at one endpoint, and the longest stretch at one endpoint (from its
    first such sample to the next sample without)."""
    samples = [(t, w) for t, _, w, _ in series if w]
    if not samples:
        return 0.0, 0.0
    share = longest = 0.0
    for e in range(len(samples[0][1])):
        over = [(t, w[e] > BATCH) for t, w in samples]
        share = max(share, sum(o for _, o in over) / len(over))
        start: float | None = None
        for t, o in over:
            if o and start is None:
                start = t
            elif not o and start is not None:
                longest, start = max(longest, t - start), None
        if start is not None:
            longest = max(longest, over[-1][0] - start)
    return share, longest


async def _case(bench: Bench, case: Case, n: int) -> list[Row]:
    prompts = prompt_set(n)
    label = f"{case.label}, {n:,} prompts"
    fleet = new_fleet(len(case.speeds), STRICT, list(case.speeds)).start()
    killed: dict[str, float] = {}

    async def killer(store: JobStore, t0: float) -> None:
        if case.kill_at is not None:
            killed.update(await kill_at_share(fleet, store, "bench", int(case.kill_at * n), t0))

    try:
        ideal = ideal_s(n, fleet)
        groups = [[u] for u in fleet.urls]
        prefix = f"s-{CASES.index(case)}"
        run = await run_swarm(
            bench.url, prefix, fleet, groups, prompts, MAX_TOKENS, during=killer, burst=case.burst
        )
        if case.kill_at is not None:
            alive = [True] * (len(case.speeds) - 1) + [False]
            ideal = killed["t"] + ideal_s(n - int(killed["done"]), fleet, alive)
    finally:
        fleet.stop()
    share, longest = over_one_batch(run.series)
    copied, won = from_exit_lines(prefix, r"(\d+) copied at a job's tail \((\d+) first\)")
    swarm = Row(
        f"swarm-queue: {label}",
        run.wall_s,
        run.results - run.failed,
        n,
        ideal,
        {
            "first_result_s": run.first_result_s,
            "over_one_batch_waiting_worst_endpoint": share,
            "longest_over_one_batch_s": longest,
            "prompts copied": copied,
            "copies first": won,
            "target": case.target,
        },
    )
    fleet = new_fleet(len(case.speeds), STRICT, list(case.speeds)).start()
    try:
        task = asyncio.create_task(static_round_robin(fleet.urls, prompts, MAX_TOKENS))
        if case.kill_at is not None:
            await asyncio.sleep(killed["t"])
            fleet.kill_endpoint(len(case.speeds) - 1)
        wall, answered = await task
    finally:
        fleet.stop()
    return [swarm, Row(f"static round-robin: {label}", wall, answered, n, ideal)]


async def strict_scenario(bench: Bench, scale: float) -> Scenario:
    sc = Scenario(
        "strict",
        "8. Strict configuration",
        "Engines like a small real one: at most 64 sequences, a step of 10 ms + 0.1 ms per "
        "running sequence, every output exactly 32 tokens (vLLM's `ignore_eos`). *Of capacity* "
        "is prompts over the fleet's summed capacity, with no allowance for the tail (for the "
        "dead endpoint: the time of death, plus the rest over the remaining capacity). Workers "
        "already running unless the case says `--burst`.",
    )
    for case in CASES:
        rows = await _case(bench, case, max(BATCH * 8, int(case.n * scale)))
        sc.rows += rows
        frac = rows[0].capacity_fraction or 0.0
        what = rows[0].system.removeprefix("swarm-queue: ")
        sc.checks[f"{what}: >= {case.target:.0%} of capacity"] = frac >= case.target
    longest = max(float(r.extra.get("longest_over_one_batch_s", 0.0)) for r in sc.rows)
    sc.checks[f"no endpoint with more than one batch waiting for over {MOMENT_S:g} s"] = (
        longest <= MOMENT_S
    )
    return sc
