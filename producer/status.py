"""``swarm-status JOB``: a job's progress in one screen."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.cli import add_redis_arg, open_job_store, run
from common.keys import stage_name
from common.store import JobStatus

__all__ = ["format_status", "main"]


def format_status(s: JobStatus, stage: JobStatus | None = None) -> str:
    """The job's progress; ``stage``: its tree-reduce level running now, if any."""
    total = f"{s.total}" if s.total is not None else f"{s.enqueued}+ (still being enqueued)"
    state = "cancelled" if s.cancelled else "finished" if s.finished else "running"
    kinds = ", ".join(f"{k} {n}" for k, n in s.failed_by_kind.items())
    eta = ""
    if not s.finished and s.total is not None and s.rate_per_s > 0:
        left = s.total - s.done - s.failed
        eta = f"   eta {left / s.rate_per_s:,.0f} s"
    lines = [
        f"job {s.job}: {state}",
        f"  total      {total}",
        f"  done       {s.done}",
        f"  failed     {s.failed}" + (f"  ({kinds})" if kinds else ""),
        f"  in flight  {s.in_flight}",
        f"  pending    {s.pending}",
        f"  rate       {s.rate_per_s:,.1f} prompts/s{eta}",
        f"  tokens     {s.prompt_tokens} prompt, {s.completion_tokens} completion",
    ]
    if s.reduce is not None:
        if s.reduced:
            where = "finished: swarm-collect JOB --final"
        elif s.cancelled:
            where = "cancelled"
        elif stage is not None:
            where = (
                f"level {s.stage}: {stage.done + stage.failed} of {stage.total or '?'} "
                f"supervisor prompts answered"
            )
        else:
            where = "waiting for every prompt to be answered"
        lines.append(f"  reduce     {s.reduce}, {where}")
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> int:
    async with open_job_store(args, patient=False) as (job, store):
        status = await store.status(job)
        stage = await store.status(stage_name(job, status.stage)) if status.stage else None
        print(format_status(status, stage))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="swarm-status", description=__doc__)
    p.add_argument("job")
    add_redis_arg(p)
    args = p.parse_args(argv)
    raise SystemExit(run("swarm-status", _main(args)))
