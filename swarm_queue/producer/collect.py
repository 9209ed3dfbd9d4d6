"""``swarm-collect``: write a job's results as JSON Lines (or another format), in input order.

It streams a job's results in input order as they arrive (:mod:`producer.stream`) into an
output that survives a crash (:mod:`producer.outfile`), in a format of
:mod:`producer.formats`, or stdout, and with ``--wait`` follows the job
to its last prompt with a progress bar on stderr; ``--final`` writes the reduce output.

Exit status: 0 every prompt succeeded; 1 some prompts failed (each has ``"error"``); 3 the job
has not finished (without ``--wait``); 2 bad usage or unknown job.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgspec

from swarm_queue.common.cli import Parser, add_redis_arg, open_job_store, run
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec, Result, encode_final
from swarm_queue.common.store import JobStore
from swarm_queue.flows.agents import agent_of
from swarm_queue.flows.output import FlowOutput
from swarm_queue.flows.pipeline import link_of
from swarm_queue.flows.registry import output_of
from swarm_queue.producer.agentcols import agent_csv_sink, agent_parquet_sink
from swarm_queue.producer.agentout import agent_line, agents_as_finished, collect_agents
from swarm_queue.producer.chaincols import chain_csv_sink, chain_parquet_sink
from swarm_queue.producer.chains import (
    ChainLine,
    chain_line,
    collect_chains,
    follow_chains,
    steps_of,
)
from swarm_queue.producer.flowout import collect_lines, follow_lines, json_line, output_for
from swarm_queue.producer.formats import FORMATS, format_named
from swarm_queue.producer.outfile import Mark, Sink, collect_durably
from swarm_queue.producer.stream import (
    JOB_APPEAR_S,
    collect,
    collect_into,
    wait_final,
    wait_for_spec,
)

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
        written = await _workflow(args, job, store, spec)
        if written is not None:
            return written
        if args.evict:
            status = await store.status(job)
            if status.reduce is not None and not status.reduced:
                raise ConfigError(
                    f"job {job!r} has a {status.reduce} reduce still to run, which reads the "
                    "results from Redis: --evict once 'swarm-collect --final' has its output"
                )
        fmt = format_named(args.format)
        models: Counter[str] = Counter()
        if args.out == "-":
            if fmt.line is None:
                kind = "directory" if fmt.what == "DIR" else "file"
                raise ConfigError(
                    f"--format {args.format} writes a {kind}: give --out {fmt.what}, not -"
                )
            if args.evict:
                raise ConfigError(
                    "--evict needs --out FILE: results leave Redis only once a "
                    "file holds them durably"
                )
            line = fmt.line(await store.load_spec(job))
            report = await collect(store, job, sys.stdout.buffer, wait=args.wait, line=line)
        else:
            try:
                report = await collect_durably(
                    store,
                    job,
                    args.out,
                    lambda path, spec: cast(Sink, _ByModel(fmt.sink(path, spec), models)),
                    wait=args.wait,
                    progress=args.wait,
                    evict=args.evict,
                )
            except OSError as exc:
                raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
            if len(models) > 1:  # a job without --model on a fleet of several models
                counts = ", ".join(f"{m} {n}" for m, n in sorted(models.items()))
                print(f"job {job}: answered by {len(models)} models: {counts}", file=sys.stderr)
        status = await store.status(job)
    total = "?" if report.total is None else str(report.total)
    resumed = f", resumed at {report.start}" if report.start else ""
    if not report.untouched:
        print(
            f"job {job}: wrote {report.start + report.written} of {total} results "
            f"({status.done} ok, {status.failed} failed{resumed})",
            file=sys.stderr,
        )
    if not report.complete:
        print(f"job {job}: not finished; run again (or with --wait) for the rest", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FAILED if status.failed else 0


async def _workflow(
    args: argparse.Namespace, job: str, store: JobStore, spec: JobSpec
) -> int | None:
    """Collect a workflow's job as its lines (an exit status); None for a plain job."""
    # An agent job's later turns (job:s1...) are collected as the jobs they are.
    agents = agent_of(spec) is not None and spec.step == 0
    if args.as_finished and not agents:
        raise ConfigError(f"--as-finished is for agent jobs; {job!r} is not one")
    _refuse_a_step(job, spec)
    if link_of(spec) is not None:
        return await _pipeline(args, job, store)
    if agents:
        return await _agents(args, job, store)
    if (kind := output_of(spec)) is not None:
        return await _lines(args, job, store, await output_for(store, spec, kind))
    return None


def _refuse_a_step(job: str, spec: JobSpec) -> None:
    """A pipeline's later step is no job to collect alone: its rows are numbered as it was
    fed, not by input (seen: a step collected as if its rows were the inputs')."""
    if spec.step and agent_of(spec) is None:
        base = spec.parent
        raise ConfigError(
            f"{job} is step {spec.step} of pipeline {base}: its results are numbered in the "
            f"order the step was fed, not by input. Collect {base}: one row per input with "
            "every step's answer (--format csv or parquet: a column each)"
        )


def _following(args: argparse.Namespace) -> dict[str, Any]:
    """How a durable collection runs, from the flags: following the job (with a progress
    display) under --wait, evicting under --evict."""
    return {"wait": args.wait, "progress": args.wait, "evict": args.evict}


def _with_pyarrow(make: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """``make``, saying what to install when pyarrow is missing."""

    def made(path: str, of: Any) -> Any:
        try:
            return make(path, of)
        except ImportError:
            raise ConfigError(
                "--format parquet needs pyarrow: pip install 'swarm-queue[parquet]'"
            ) from None

    return made


# How a pipeline's chains are written, by --format (None: JSON Lines).
_CHAIN_SINKS: dict[str, Callable[[str, list[JobSpec]], Any] | None] = {
    "jsonl": None,
    "csv": chain_csv_sink,
    "parquet": _with_pyarrow(chain_parquet_sink),
}


# How an agent job's results are written, by --format (None: JSON Lines).
_AGENT_SINKS: dict[str, Callable[[str, dict[str, Any] | None], Any] | None] = {
    "jsonl": None,
    "csv": agent_csv_sink,
    "parquet": _with_pyarrow(agent_parquet_sink),
}


class _ByModel:
    """A sink that counts, by model, the answers it is given (what a job without --model on
    a fleet of several models mixed), and is otherwise the sink it wraps."""

    def __init__(self, sink: Sink, counts: Counter[str]) -> None:
        self._sink = sink
        self._counts = counts

    def put(self, rows: list[Result], index: int) -> Mark | None:
        self._counts.update(r.model for r in rows if r.ok and r.model)
        return self._sink.put(rows, index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


async def _pipeline(args: argparse.Namespace, job: str, store: JobStore) -> int:
    """Collect a pipeline: one line (or row) per input with every step (see
    producer/chains.py and, for CSV and Parquet, producer/chaincols.py)."""
    if args.format not in _CHAIN_SINKS:
        raise ConfigError(
            f"a pipeline is collected as {', '.join(_CHAIN_SINKS)} (one chain per input)"
        )
    if args.out == "-":
        if args.format != "jsonl":
            raise ConfigError(f"--format {args.format} writes to --out PATH, not -")
        steps = len(await steps_of(store, job))
        out = sys.stdout.buffer

        async def put(rows: list[ChainLine], _index: int) -> None:
            out.write(b"".join(chain_line(r) for r in rows))
            out.flush()

        report = await collect_into(store, job, put, rows=follow_chains(steps), wait=args.wait)
    else:
        sink = _CHAIN_SINKS[args.format]
        report = await collect_chains(store, job, args.out, sink=sink, **_following(args))
    total = "?" if report.total is None else str(report.total)
    if not report.complete:
        print(
            f"pipeline {job}: wrote {report.start + report.written} of {total} inputs; not "
            "finished, run again (or with --wait)",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    # The whole pipeline's figures: an input is through when its last step answered it; one
    # that stopped failed at a step (each at most once), or was kept out by a step's filter,
    # which is what the filter is for: no failure.
    statuses = [await store.status(step.job) for step in await steps_of(store, job)]
    through = statuses[-1].done
    stopped = (report.total or 0) - through
    failed = sum(s.failed for s in statuses)
    if not report.untouched:
        print(
            f"pipeline {job}: wrote {report.start + report.written} of {total} inputs "
            f"({through} through every step, {stopped} stopped on the way: {failed} failed, "
            f"{stopped - failed} kept out by a filter)",
            file=sys.stderr,
        )
    return EXIT_FAILED if failed else 0


async def _lines(
    args: argparse.Namespace, job: str, store: JobStore, output: FlowOutput[Any]
) -> int:
    """Collect a workflow job whose flow writes its own lines (see :mod:`flows.output`): one
    line per input, in input order."""
    if args.out == "-":
        if args.format != "jsonl":
            raise ConfigError(f"--format {args.format} writes to --out PATH, not -")
        out = sys.stdout.buffer

        async def put(rows: list[Any], _index: int) -> None:
            out.write(b"".join(json_line(r) for r in rows))
            out.flush()

        report = await collect_into(store, job, put, rows=follow_lines(output), wait=args.wait)
    else:
        report = await collect_lines(
            store, job, args.out, output, fmt=args.format, **_following(args)
        )
    total = "?" if report.total is None else str(report.total)
    if not report.untouched:
        print(
            f"{output.what} {job}: wrote {report.start + report.written} of {total} inputs "
            f"({report.ok} answered, {report.failed} failed in this run)",
            file=sys.stderr,
        )
    if not report.complete:
        print(f"{output.what} {job}: not finished; run again (or with --wait)", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FAILED if report.failed else 0


async def _agents(args: argparse.Namespace, job: str, store: JobStore) -> int:
    """Collect an agent job: one line per agent (see producer/agentout.py)."""
    if args.as_finished:
        return await _agents_as_finished(args, job, store)
    if args.format not in _AGENT_SINKS or args.out in (None, "-"):
        raise ConfigError(f"an agent job is collected as {', '.join(_AGENT_SINKS)} into --out PATH")
    sink = _AGENT_SINKS[args.format]
    report = await collect_agents(store, job, args.out, sink=sink, **_following(args))
    total = "?" if report.total is None else str(report.total)
    print(
        f"agents {job}: wrote {report.start + report.written} of {total} "
        f"({report.ok} answered, {report.failed} failed in this run)",
        file=sys.stderr,
    )
    if not report.complete:
        return EXIT_INCOMPLETE
    return EXIT_FAILED if report.failed else 0


async def _agents_as_finished(args: argparse.Namespace, job: str, store: JobStore) -> int:
    """Every agent's line in the order they finish, to ``--out`` (a file, or - for stdout),
    until the last has: for who acts on each result at once. Nothing is kept in Redis about
    what was written, so nothing is evicted; a rerun writes every line again."""
    if args.format != "jsonl" or args.evict:
        raise ConfigError("--as-finished writes JSON Lines, and evicts nothing")
    ok = failed = 0
    with contextlib.ExitStack() as stack:
        out = (
            sys.stdout.buffer if args.out == "-" else stack.enter_context(open(args.out, "wb"))  # noqa: ASYNC230 - a CLI's one file
        )
        async for chunk in agents_as_finished(store, job):
            for r in chunk:
                out.write(agent_line(r))
                ok, failed = (ok + 1, failed) if r.ok else (ok, failed + 1)
            out.flush()
    print(f"agents {job}: wrote {ok + failed} as they finished ({failed} failed)", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    raise SystemExit(run("swarm-collect", _main(args)))
