"""``swarm-status JOB``: a job's progress in one screen; ``--serve PORT``: every job and
endpoint in a live dashboard in the browser (:mod:`producer.dashboard`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Sequence

from swarm_queue.common.abilities import Need, needs, unmet
from swarm_queue.common.cli import Parser, add_redis_arg, open_job_store, run, settings_from_args
from swarm_queue.common.fleet import SILENT_PERIODS, EndpointInfo, EndpointStats, waiting_reason
from swarm_queue.common.keys import group_of, stage_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store import JobStatus, JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.agents.spec import agent_of, offered_tools
from swarm_queue.flows.pipeline.spec import link_of
from swarm_queue.flows.steps import over, step_statuses, tokens_of
from swarm_queue.producer.overview import (
    job_state,
    read_fleet,
    reduce_where,
    waiting_step,
    whole_state,
)

__all__ = ["format_endpoints", "format_status", "main", "tool_lines"]

# States a worker publishes once, as it stops serving the job: no later word is expected.
LAST_WORDS = ("finished", "stopped")


def circuit_now(st: EndpointStats, now: float, *, over: bool = False) -> str:
    """The circuit state as published, or ``silent`` when its worker stopped publishing; of
    a job that is ``over``, a worker gone since is no alarm: ``gone``."""
    if st.circuit not in LAST_WORDS and now - st.updated_s > SILENT_PERIODS * max(st.period_s, 1.0):
        return "gone" if over else "silent"
    return st.circuit


def serving_now(endpoints: Sequence[EndpointStats], now: float) -> bool:
    """Whether some worker still serves the job: an endpoint row neither over nor silent."""
    return any(circuit_now(st, now) not in (*LAST_WORDS, "silent") for st in endpoints)


def format_endpoints(
    endpoints: Sequence[EndpointStats], now: float, *, over: bool = False
) -> list[str]:
    """The per-endpoint table of ``swarm-status``: one row per worker and endpoint, with the
    last error of every endpoint not taking work; ``over``: the job is finished."""
    if not endpoints:
        return ["  endpoints  none reporting yet"]
    states = [circuit_now(st, now, over=over) for st in endpoints]
    summary = ", ".join(f"{n} {state}" for state, n in sorted(Counter(states).items()))
    width = max(8, *(len(st.endpoint) for st in endpoints))
    wwidth = max(6, *(len(st.worker) for st in endpoints))
    lines = [
        f"  endpoints  {summary}",
        f"    {'endpoint':{width}}  {'worker':{wwidth}}  {'circuit':8} {'done':>9} {'failed':>7} "
        f"{'errors':>7} {'rate/s':>8} {'in flight':>10} {'seen':>9}",
    ]
    for st, state in zip(endpoints, states, strict=True):
        flight = "-" if state in (*LAST_WORDS, "silent", "gone") else f"{st.in_flight}/{st.window}"
        seen = f"{max(0.0, now - st.updated_s):,.0f} s ago"
        lines.append(
            f"    {st.endpoint:{width}}  {st.worker:{wwidth}}  {state:8} {st.done:>9} "
            f"{st.failed:>7} {st.errors:>7} {st.rate_per_s:>8,.1f} {flight:>10} {seen:>9}"
        )
        if state in ("open", "broken", "waiting") and st.last_error:
            error = st.last_error if len(st.last_error) <= 160 else st.last_error[:157] + "..."
            lines.append(f"      last error: {error}")
    return lines


def format_status(
    s: JobStatus,
    stage: JobStatus | None = None,
    endpoints: Sequence[EndpointStats] | None = None,
    now: float | None = None,
    waiting: str | None = None,
    state: str | None = None,
    tokens: tuple[int, int, int, int] | None = None,
) -> str:
    """The job's progress; ``stage``: its tree-reduce level running now, if any;
    ``endpoints``: the per-endpoint figures, shown while the job runs; ``waiting``: why no
    live endpoint can serve it; ``state``: the job's as a whole, its later steps included
    (see :func:`producer.overview.whole_state`), if not the state of ``s`` alone; ``tokens``:
    the whole job's (see :func:`flows.steps.tokens_of`), if not those of ``s`` alone."""
    total = f"{s.total}" if s.total is not None else f"{s.enqueued}+ (still being enqueued)"
    state = state or job_state(s, waiting)
    kinds = ", ".join(f"{k} {n}" for k, n in s.failed_by_kind.items())
    at = time.time() if now is None else now
    rate = f"{s.rate_per_s:,.1f} prompts/s"
    if not s.finished and endpoints is not None and not serving_now(endpoints, at):
        # No ETA where nothing works on it: the average since its first answer would lie.
        rate += " (while it was served: no worker serves it now)" if s.rate_per_s else ""
    elif not s.finished and s.total is not None and s.rate_per_s > 0:
        left = s.total - s.done - s.failed
        rate += f"   eta {left / s.rate_per_s:,.0f} s"
    used = tokens or (s.prompt_tokens, s.completion_tokens, s.cached_tokens, s.reasoning_tokens)
    cached = f" ({used[2]} cached)" if used[2] else ""
    reasoning = f" ({used[3]} reasoning)" if used[3] else ""
    lines = [
        f"job {s.job}: {state}",
        *([f"  waiting    {waiting}"] if waiting and state == "waiting" else []),
        f"  total      {total}",
        f"  done       {s.done}",
        f"  failed     {s.failed}" + (f"  ({kinds})" if kinds else ""),
        f"  in flight  {s.in_flight}",
        f"  pending    {s.pending}",
        f"  rate       {rate}",
        f"  tokens     {used[0]} prompt{cached}, {used[1]} completion{reasoning}"
        + (" (every step)" if tokens is not None else ""),
        *(
            [f"  cached     {s.cache_hits} answered from the response cache"]
            if s.cache_hits
            else []
        ),
    ]
    if s.reduce is not None:
        lines.append(f"  reduce     {s.reduce}, {reduce_where(s, stage)}")
    if endpoints is not None:
        lines.extend(format_endpoints(endpoints, at, over=s.finished))
    return "\n".join(lines)


async def lacking_workers(
    store: JobStore, spec: JobSpec, fleet: Sequence[EndpointInfo], now: float
) -> str | None:
    """Why work of ``spec``'s job still to do waits for a worker that has what it needs (a
    function its settings allow, numpy) when no live worker has it; None when one has."""
    pending = []
    link = link_of(spec)
    # A step's keep function, run by its flow until the step it feeds is sealed.
    if link is not None and link.keep_fn and Meta.TOTAL not in await store.meta(link.job):
        pending.append(Need("keep", link.keep_fn))
    for need in needs(spec):
        if need.kind == "reduce":
            todo = await store.read_final(spec.job) is None
        else:
            todo = not (await store.status(spec.job, rate=False)).finished
        if todo:
            pending.append(need)
    why = unmet(pending, fleet, now)
    return f"{spec.job}: {why}" if why is not None else None


async def _show(store: JobStore, job: str) -> tuple[bool, bool]:
    """Print ``job``'s status, its later steps' (a pipeline's, an agent job's turns) with it;
    returns whether the job as a whole is (finished, cancelled): not before its last step."""
    status = await store.status(job)
    stage = await store.status(stage_name(job, status.stage)) if status.stage else None
    # While a tree level runs, the endpoints are busy with it rather than with the job itself.
    endpoints = await store.read_endpoints(stage_name(job, status.stage))
    now = await store.server_time()
    spec = await store.load_spec(job)
    steps = await step_statuses(store, spec)
    finished, cancelled = over(status, steps)
    waiting = None
    fleet, note = await read_fleet(store)
    if note:
        print(f"swarm-status: warning: {note}", file=sys.stderr)
    elif not (finished or cancelled):
        waiting = waiting_step(spec, status, steps, fleet or [], now)
    state = whole_state(finished, cancelled, waiting)
    print(
        format_status(
            status,
            stage,
            endpoints,
            now=now,
            waiting=waiting,
            state=state,
            tokens=tokens_of(status, steps) if steps else None,
        ),
        flush=True,
    )
    if agent_of(spec) is not None and not group_of(job)[1]:  # an agent job, not its turns
        print(await agent_lines(store, spec), flush=True)
    if fleet is not None and (why := await lacking_workers(store, spec, fleet, now)):
        print(f"  waiting: {why}", flush=True)
    for k, (step_spec, step) in enumerate(steps, 1):
        of = str(step.total) if step.total is not None else f"{step.enqueued} so far"
        ended = "cancelled" if step.cancelled else "finished" if step.finished else None
        unserved = waiting_reason(step_spec.model, fleet or [], now) if fleet else None
        where = ended or (f"waiting: {unserved}" if unserved else "running")
        print(
            f"  step {k} {step_spec.job}: {step.done} done, {step.failed} failed of {of} ({where})",
            flush=True,
        )
        if fleet is not None and (why := await lacking_workers(store, step_spec, fleet, now)):
            print(f"  waiting: {why}", flush=True)
    for bad in await store.bad_keys(job):
        print(
            f"swarm-status: warning: job {job} is skipped by every worker: its key {bad} "
            "(another tool or a person wrote it); delete it (redis-cli DEL KEY) and the "
            "workers take the job up again",
            file=sys.stderr,
            flush=True,
        )
    if (mixed := mixed_models(job, endpoints)) is not None:
        print(f"swarm-status: warning: {mixed}", file=sys.stderr, flush=True)
    reduced = status.reduce is None or status.reduced
    if steps:  # a pipeline's reduce runs over its last step
        last = steps[-1][1]
        reduced = last.reduce is None or last.reduced
    return finished and reduced, cancelled


async def agent_lines(store: JobStore, spec: JobSpec) -> str:
    """An agent job's agents by state, and the tool calls of this Redis."""
    a = await store.outcome_counts(spec.job)
    tools = await store.tool_stats()
    lines = [
        f"  agents: {a.done} done, {a.parked} waiting for a tool, "
        f"{a.active} thinking (of {a.done + a.parked + a.active})",
        f"  tool calls (all jobs): {tools.get('runs', 0)} run, "
        f"{tools.get('shared', 0)} answered by a run already made or under way",
    ]
    lines += await tool_lines(store, offered_tools(spec))
    return "\n".join(lines)


async def tool_lines(store: JobStore, tools: Sequence[str]) -> list[str]:
    """A line per tool: how many live runners serve it, how many calls wait in its queue;
    a tool no runner serves is named as such (its calls wait, then fail by SWARM_TOOL_WAIT_S)."""
    runners = await store.tool_runners(tools)
    queued = await store.tool_queued(tools)
    out = []
    for t in tools:
        waiting = f", {queued[t]} calls queued" if queued[t] else ""
        if runners[t]:
            out.append(f"  tool {t}: {runners[t]} runner(s){waiting}")
        else:
            out.append(f"  tool {t}: no runner serves it (SWARM_TOOLS of swarm-tools){waiting}")
    return out


def mixed_models(job: str, endpoints: Sequence[EndpointStats]) -> str | None:
    """Why ``job``'s answers are not all of one model, when its endpoints ask for several (a
    job without --model takes whatever each endpoint serves); None when they are."""
    by_model: dict[str, list[str]] = {}
    for e in endpoints:
        if e.model and e.endpoint not in by_model.setdefault(e.model, []):
            by_model[e.model].append(e.endpoint)
    if len(by_model) < 2:
        return None
    which = "; ".join(
        f"{model} ({', '.join(map(mask_url, urls))})" for model, urls in sorted(by_model.items())
    )
    return (
        f"job {job} is being answered by {len(by_model)} models: {which}. Its answers mix "
        "them (each output line names its model); queue it with --model NAME to pin one"
    )


async def _main(args: argparse.Namespace) -> int:
    async with open_job_store(args, patient=args.watch is not None) as (job, store):
        if args.watch is None:
            await _show(store, job)
            return 0
        while True:  # a live view: redrawn in place until the job (and its reduce) is over
            if sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            finished, cancelled = await _show(store, job)
            if finished or cancelled:
                return 0
            await asyncio.sleep(args.watch)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1-65535)")
    return port


async def _serve(args: argparse.Namespace) -> int:
    from swarm_queue.producer.dashboard import serve  # aiohttp's server: only for --serve

    settings = settings_from_args(args)
    store = JobStore.from_settings(settings, patient=True)
    try:
        await serve(store, settings.redis_url, args.bind, args.serve, args.every)
    finally:
        await store.close()
    print("swarm-status: interrupted", file=sys.stderr)
    return 130  # stopped by a signal, as any command interrupted says


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(prog="swarm-status", description=__doc__)
    p.add_argument("job", nargs="?", help="the job to show (not with --serve: it shows them all)")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="S",
        help="redraw every S seconds (default 2) until the job and its reduce are over",
    )
    p.add_argument(
        "--serve",
        type=_port,
        metavar="PORT",
        help="serve a live dashboard of every job and endpoint at http://127.0.0.1:PORT/",
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="with --serve: the address to listen on (default 127.0.0.1, this host only; "
        "the page has no login)",
    )
    p.add_argument(
        "--every",
        type=float,
        default=2.0,
        metavar="S",
        help="with --serve: read Redis every S seconds (default 2)",
    )
    add_redis_arg(p)
    args = p.parse_args(argv)
    if args.serve is not None:
        if args.job is not None or args.watch is not None:
            p.error("--serve shows every job: give no JOB and no --watch")
        if args.every <= 0:
            p.error("--every must be a positive number of seconds")
        raise SystemExit(run("swarm-status", _serve(args)))
    if args.job is None:
        p.error("give a JOB (swarm-jobs lists them), or --serve PORT for every job")
    raise SystemExit(run("swarm-status", _main(args)))
