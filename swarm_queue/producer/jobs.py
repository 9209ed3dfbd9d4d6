"""``swarm-jobs``: the jobs in Redis with their state and age, the response cache's size and
the projects' caps; deleting finished jobs (a job goes with its steps and stages); clearing
the cache; capping a project's lines in flight."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from swarm_queue.common.cli import Parser, add_redis_arg, run, settings_from_args
from swarm_queue.common.errors import (
    BadRecordError,
    ConfigError,
    JobConflictError,
    JobNotFoundError,
    SwarmError,
)
from swarm_queue.common.hostfile import normalize_url
from swarm_queue.common.keys import parse_stage, validate_job_name
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store import JobStore
from swarm_queue.flows.steps import over, step_statuses
from swarm_queue.producer.overview import job_list, read_fleet, read_jobs

__all__ = ["main"]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


async def _delete(store: JobStore, args: argparse.Namespace) -> None:
    """``swarm-jobs --delete JOB...`` or ``--delete-finished``: a job goes with its steps and
    stages; a running one only with ``--force``."""
    targets = list(args.delete or []) or (await job_list(store))[0]
    for name in targets:
        if ":" in name or "#" in name:
            base, part = parse_stage(name)[0], "shard" if "#" in name else "step or stage"
            raise ConfigError(
                f"{name} is a {part} of job {base}: delete {base} (its steps, stages and "
                "shards go with it)"
            )
        job = validate_job_name(name)
        try:
            status = await store.status(job)
        except JobNotFoundError:
            # Steps left without their job (a refused enqueue, its meta deleted by hand):
            # nothing runs them, so they go.
            listed = await store.list_jobs()
            if not any(":" in m and parse_stage(m)[0] == job for m in listed):
                raise
            n = await store.delete_job(job)
            print(f"job {job}: deleted its steps left without it ({n} keys)")
            continue
        # Over as a whole: a pipeline whose first step finished may still be running.
        steps = await step_statuses(store, await store.load_spec(job))
        if not any(over(status, steps)):
            if args.delete_finished:
                continue
            if not args.force:
                raise JobConflictError(
                    f"job {job!r} is still running; swarm-cancel it first, or --force"
                )
        n = await store.delete_job(job)
        print(f"job {job}: deleted ({n} keys)")


async def _jobs(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    store = JobStore.from_settings(settings, patient=False)
    try:
        if args.clear_cache:
            if args.endpoint is None and args.since is None and args.until is None:
                n = await store.cache_clear()
                print(f"response cache: cleared ({n} answers)")
                return 0
            now = await store.server_time()
            since = None if args.since is None else args.since(now)
            until = None if args.until is None else args.until(now)
            endpoint = None if args.endpoint is None else mask_url(normalize_url(args.endpoint))
            n = await store.cache_purge(endpoint=endpoint, since=since, until=until)
            which = " ".join(
                part
                for part in (
                    f"from {endpoint}" if endpoint else "",
                    f"kept since {_when(since)}" if since is not None else "",
                    f"before {_when(until)}" if until is not None else "",
                )
                if part
            )
            print(f"response cache: {n} answers {which} deleted")
            return 0
        if args.endpoint or args.since or args.until:
            raise ConfigError("--endpoint, --since and --until go with --clear-cache")
        if args.delete or args.delete_finished:
            await _delete(store, args)
            return 0
        if args.cap:
            for project, lines in args.cap:
                await store.set_project_cap(project, lines)
                said = f"at most {lines} lines in flight" if lines else "no cap"
                print(f"project {project}: {said}")
            return 0
        fleet, note = await read_fleet(store)
        rows, bad = await read_jobs(store, fleet, await store.server_time())
        print(
            f"{'job':32} {'state':10} {'done':>10} {'failed':>8} {'total':>10} {'age':>7}  reduce"
        )
        for row in rows:
            if row.error is not None:  # one bad job spoils no listing
                print(f"{row.job:32} {'unreadable':10} {row.error}")
                continue
            reduce = ""
            if row.reduce is not None:
                reduce = f"{row.reduce}: " + ("done" if row.reduced else f"level {row.stage}")
            total = "?" if row.total is None else str(row.total)
            age = "?" if row.age_s is None else _age(row.age_s)
            print(
                f"{row.job:32} {row.state:10} {row.done:>10} {row.failed:>8} {total:>10} "
                f"{age:>7}  {reduce}"
            )
        try:
            size = await store.cache_size()
            print(
                f"response cache: {size.answers} answers, {size.bytes / 2**20:,.1f} MiB "
                f"(each kept {_age(settings.cache_ttl_s)} after its last use, at most "
                f"{settings.cache_max_answers} answers: the least recently used go first)"
            )
        except BadRecordError as exc:
            print(f"response cache: unreadable: {exc}")
        for project, cap in sorted((await store.project_caps()).items()):
            print(f"project {project}: at most {cap} lines in flight")
        for name in bad:
            print(f"ignored in {store.keys.jobs}: {name!r} is not a job name", file=sys.stderr)
        if note:
            print(f"swarm-jobs: warning: {note}", file=sys.stderr)
        return 0
    finally:
        await store.close()


def _moment(text: str) -> Callable[[float], float]:
    """argparse's type for --since/--until: an ISO 8601 time (UTC unless it says otherwise),
    or a duration before now (``90m``, ``6h``, ``2d``); a function of now (Redis's clock)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        ago = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return lambda now: now - ago
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a time (2026-11-20T14:00, UTC unless it says otherwise) nor "
            "a duration before now (90m, 6h, 2d)"
        ) from None
    at = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return lambda now: at


def _cap(text: str) -> tuple[str, int | None]:
    """argparse's type for --cap: ``PROJECT=LINES``, LINES a positive count or ``none``."""
    project, sep, lines = text.partition("=")
    if sep and (lines.strip() == "none" or lines.strip().isdigit()):
        n = None if lines.strip() == "none" else int(lines)
        try:
            validate_job_name(project)
        except SwarmError as exc:
            raise argparse.ArgumentTypeError(f"project {project!r}: {exc}") from None
        return project, n
    raise argparse.ArgumentTypeError(
        f"{text!r} is not PROJECT=LINES (a count of lines in flight, or none to lift the cap)"
    )


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(
        prog="swarm-jobs",
        description="List the jobs in Redis with their state and age, the response "
        "cache's size and the projects' caps; delete finished jobs; clear the cache; cap a "
        "project's lines in flight.",
    )
    p.add_argument("--delete", nargs="+", metavar="JOB", help="delete these finished jobs")
    p.add_argument(
        "--delete-finished", action="store_true", help="delete every finished or cancelled job"
    )
    p.add_argument("--force", action="store_true", help="with --delete: running jobs too")
    p.add_argument(
        "--cap",
        nargs="+",
        type=_cap,
        metavar="PROJECT=LINES",
        help="cap a project's lines in flight across the fleet (its jobs' prompts taken and "
        "not yet answered); PROJECT=none lifts the cap. Kept by each worker from the fleet's "
        "count: exact in one worker process",
    )
    p.add_argument(
        "--clear-cache",
        action="store_true",
        help="delete the answers of the response cache (swarm-enqueue --cache): all of "
        "them, or those --endpoint, --since and --until select",
    )
    p.add_argument(
        "--endpoint",
        metavar="URL",
        help="with --clear-cache: only the answers this endpoint gave",
    )
    p.add_argument(
        "--since",
        type=_moment,
        metavar="T",
        help="with --clear-cache: only answers kept at T or later: a time "
        "(2026-11-20T14:00, UTC unless it says otherwise) or a duration before now (6h, 2d)",
    )
    p.add_argument(
        "--until", type=_moment, metavar="T", help="with --clear-cache: only answers kept before T"
    )
    add_redis_arg(p)
    raise SystemExit(run("swarm-jobs", _jobs(p.parse_args(argv))))
