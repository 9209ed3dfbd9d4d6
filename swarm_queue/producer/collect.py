"""``swarm-collect``: write a job's output as JSON Lines (or another format), in input order.

Any kind of job (a plain job, a pipeline, an agent job, a best-of job) is written the same way
(:mod:`producer.output`): its rows followed in input order as they arrive, into an output that
survives a crash (:mod:`producer.outfile`), in a format of :mod:`producer.formats`, or stdout;
with ``--wait`` it follows the job to its last input with a progress bar on stderr;
``--final`` writes the reduce output.

Exit status: 0 every input succeeded; 1 some failed (each line says why); 3 the job has not
finished (without ``--wait``); 2 bad usage or unknown job.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from swarm_queue.common.cli import Parser, add_redis_arg, open_job_store, run
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.final import encode_final
from swarm_queue.common.keys import group_of
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import JobOutput
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents.spec import agent_of
from swarm_queue.producer.formats import FORMATS, format_for
from swarm_queue.producer.output import collect_output, output_for, write_output
from swarm_queue.producer.stream import JOB_APPEAR_S, wait_final, wait_for_spec

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "main"]

EXIT_FAILED = 1
EXIT_INCOMPLETE = 3


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="swarm-collect", description="Write a job's results as JSON Lines in input order."
    )
    p.add_argument("job")
    p.add_argument("--out", help="output file, or - for stdout (required, but for --final: stdout)")
    p.add_argument("--wait", action="store_true", help="follow the job until every prompt is done")
    p.add_argument(
        "--appear-timeout",
        type=float,
        default=JOB_APPEAR_S,
        metavar="S",
        help="with --wait: how long to wait for a job not queued yet before taking its name "
        f"for a mistake (default {JOB_APPEAR_S:g} s)",
    )
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        default="jsonl",
        help="; ".join(f"{name}: {fmt.help}" for name, fmt in FORMATS.items()),
    )
    p.add_argument(
        "--final",
        action="store_true",
        help="write the job's reduce output (JSON) instead of its per-prompt results",
    )
    p.add_argument(
        "--evict",
        action="store_true",
        help="delete results from Redis once written to FILE (bounds Redis memory; "
        "the file becomes the only copy)",
    )
    p.add_argument(
        "--as-finished",
        action="store_true",
        help="an agent job: each agent's line as it finishes, not in input order, following "
        "the job to its end (run again, it writes them all again)",
    )
    add_redis_arg(p)
    return p


async def _final(args: argparse.Namespace) -> int:
    if args.evict:
        raise ConfigError("--evict is for per-prompt results, not --final")
    async with open_job_store(args) as (job, store):
        final = await wait_final(store, job, wait=args.wait)
        status = await store.status(job)
    if final is None:
        print(
            f"job {job}: the {status.reduce} reduce has not finished (stage {status.stage}); "
            "run again, or with --wait",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    text = msgspec.json.format(encode_final(final), indent=2) + b"\n"
    if args.out in (None, "-"):
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
    else:
        try:
            with open(args.out, "wb") as fh:  # noqa: ASYNC230 - a CLI, nothing else runs
                fh.write(text)
        except OSError as exc:
            raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
    if final.error is not None:
        print(f"job {job}: the reduce failed: {final.error}", file=sys.stderr)
        return EXIT_FAILED
    if final.failed:
        print(
            f"job {job}: reduce output written; {len(final.failed)} prompts could not be used "
            "(listed under 'failed')",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0


async def _main(args: argparse.Namespace) -> int:
    if args.final:
        return await _final(args)
    if args.out is None:
        raise ConfigError("--out FILE (or - for stdout) is required")
    async with open_job_store(args) as (job, store):
        spec = await wait_for_spec(store, job, wait=args.wait, appear_s=args.appear_timeout)
        _refuse_a_step(job, spec)
        output = await output_for(store, spec)
        if args.as_finished:
            return await _in_finish_order(args, job, store, output)
        format_for(args.format, output)  # refused before anything is written
        if args.evict:
            await _evictable(args, job, store)
        if args.out == "-":
            report = await write_output(store, job, sys.stdout.buffer, args.format, wait=args.wait)
        else:
            try:
                report = await collect_output(
                    store, job, args.out, args.format, wait=args.wait, progress=args.wait,
                    evict=args.evict,
                )  # fmt: skip
            except OSError as exc:
                raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
        if len(report.models) > 1:  # a job without --model on a fleet of several models
            counts = ", ".join(f"{m} {n}" for m, n in sorted(report.models.items()))
            print(f"job {job}: answered by {len(report.models)} models: {counts}", file=sys.stderr)
        said, failed = await output.tally(store, report)
    total = "?" if report.total is None else str(report.total)
    if not report.untouched:
        print(
            f"{output.what} {job}: wrote {report.start + report.written} of {total} "
            f"{output.rows_are} ({said})",
            file=sys.stderr,
        )
    if not report.complete:
        print(
            f"{output.what} {job}: not finished; run again (or with --wait) for the rest",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return EXIT_FAILED if failed else 0


async def _evictable(args: argparse.Namespace, job: str, store: JobStore) -> None:
    """Refuse ``--evict`` where the results must stay in Redis: written to stdout (nothing
    durable holds them), or read by a reduce still to run."""
    if args.out == "-":
        raise ConfigError(
            "--evict needs --out FILE: results leave Redis only once a file holds them durably"
        )
    status = await store.status(job)
    if status.reduce is not None and not status.reduced:
        raise ConfigError(
            f"job {job!r} has a {status.reduce} reduce still to run, which reads the results "
            "from Redis: --evict once 'swarm-collect --final' has its output"
        )


def _refuse_a_step(job: str, spec: JobSpec) -> None:
    """A workflow's later step is no job to collect alone: a pipeline step's rows are numbered
    as it was fed, not by input (seen: a step collected as if its rows were the inputs'). An
    agent job's later turns (job:s1...) are collected as the jobs they are."""
    base, step = group_of(spec.job)
    if step and agent_of(spec) is None:
        raise ConfigError(
            f"{job} is step {step} of pipeline {base}: its results are numbered in the "
            f"order the step was fed, not by input. Collect {base}: one row per input with "
            "every step's answer (--format csv or parquet: a column each)"
        )


async def _in_finish_order(
    args: argparse.Namespace, job: str, store: JobStore, output: JobOutput[Any]
) -> int:
    """Every input's line in the order they finish, to ``--out`` (a file, or - for stdout),
    until the last has: for who acts on each result at once. Nothing is kept in Redis about
    what was written, so nothing is evicted; a rerun writes every line again."""
    rows = output.in_finish_order(store)
    if rows is None:
        raise ConfigError(f"--as-finished is for agent jobs; {job!r} is not one")
    if args.format != "jsonl" or args.evict:
        raise ConfigError("--as-finished writes JSON Lines, and evicts nothing")
    line = FORMATS["jsonl"].line
    assert line is not None
    encode = line(output)
    ok = failed = 0
    with contextlib.ExitStack() as stack:
        out = (
            sys.stdout.buffer if args.out == "-" else stack.enter_context(open(args.out, "wb"))  # noqa: ASYNC230 - a CLI's one file
        )
        async for chunk in rows:
            for r in chunk:
                out.write(encode(r))
                ok, failed = (ok + 1, failed) if output.ok(r) else (ok, failed + 1)
            out.flush()
    print(
        f"{output.what} {job}: wrote {ok + failed} as they finished ({failed} failed)",
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    raise SystemExit(run("swarm-collect", _main(args)))
