"""``swarm-collect``: write a job's results as JSON Lines, in input order.

Results land in Redis in whatever order the endpoints finish; the collector streams the longest
contiguous prefix of finished indices, so output starts long before the job ends, and with
``--wait`` it follows the job to its last prompt with a progress bar on stderr.

Exit status: 0 every prompt succeeded; 1 some prompts failed (each has ``"error"``); 3 the job
has not finished (without ``--wait``); 2 bad usage or unknown job.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import BinaryIO

import msgspec
from tqdm import tqdm

from common.cli import add_redis_arg, run, settings_from_args
from common.errors import ConfigError
from common.keys import validate_job_name
from common.models import OutputLine, decode_result, encode_json_line
from common.store import JobStore, connect

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "CollectReport", "collect", "main"]

EXIT_FAILED = 1
EXIT_INCOMPLETE = 3
CHUNK = 2000


class CollectReport(msgspec.Struct, frozen=True):
    job: str
    written: int
    ok: int
    failed: int
    total: int | None

    @property
    def complete(self) -> bool:
        return self.total is not None and self.written >= self.total


async def collect(
    store: JobStore,
    job: str,
    out: BinaryIO,
    *,
    wait: bool = False,
    poll_s: float = 0.2,
    progress: bool = False,
) -> CollectReport:
    """Write results of ``job`` to ``out`` from index 0 on, in order; see module doc."""
    await store.load_spec(job)  # raises JobNotFoundError for an unknown job
    cursor = ok = failed = 0
    total: int | None = None
    bar = tqdm(
        desc=job,
        unit=" prompts",
        file=sys.stderr,
        disable=None if progress else True,
        dynamic_ncols=True,
    )
    try:
        while True:
            blobs = await store.fetch_results(job, cursor, CHUNK)
            lines = []
            for blob in blobs:
                if blob is None:
                    break
                result = decode_result(blob)
                if result.ok:
                    ok += 1
                else:
                    failed += 1
                lines.append(encode_json_line(OutputLine.of(result)))
            if lines:
                out.write(b"".join(lines))
                out.flush()
                cursor += len(lines)
            if len(lines) == CHUNK:
                continue
            status = await store.status(job)
            total = status.total
            if bar.total != (total or status.enqueued):
                bar.total = total or status.enqueued
            bar.n = status.done + status.failed
            bar.set_postfix(written=cursor, failed=status.failed, refresh=False)
            bar.refresh()
            if total is not None and cursor >= total:
                return CollectReport(job, cursor, ok, failed, total)
            if not wait:
                return CollectReport(job, cursor, ok, failed, total)
            await asyncio.sleep(poll_s)
    finally:
        bar.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarm-collect", description="Write a job's results as JSON Lines in input order."
    )
    p.add_argument("job")
    p.add_argument("--out", required=True, help="output file, or - for stdout")
    p.add_argument("--wait", action="store_true", help="follow the job until every prompt is done")
    add_redis_arg(p)
    return p


async def _main(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    job = validate_job_name(args.job)
    store = JobStore(connect(settings.redis_url), settings.keys, settings.redis_url)
    try:
        if args.out == "-":
            report = await collect(store, job, sys.stdout.buffer, wait=args.wait)
        else:
            try:
                fh = open(args.out, "wb")  # noqa: SIM115, ASYNC230 - closed below; a CLI, nothing else runs
            except OSError as exc:
                raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
            with fh:
                report = await collect(store, job, fh, wait=args.wait, progress=args.wait)
    finally:
        await store.close()
    total = "?" if report.total is None else str(report.total)
    print(
        f"job {job}: wrote {report.written} of {total} results "
        f"({report.ok} ok, {report.failed} failed)",
        file=sys.stderr,
    )
    if not report.complete:
        print(f"job {job}: not finished; run again (or with --wait) for the rest", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FAILED if report.failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    raise SystemExit(run("swarm-collect", _main(args)))
