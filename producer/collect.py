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
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import BinaryIO

import msgspec
from tqdm import tqdm

from common.backoff import backoff_s
from common.cli import add_redis_arg, open_job_store, run
from common.errors import ConfigError, JobNotFoundError, StoreUnavailable
from common.models import OutputLine, decode_result, encode_json_line
from common.store import JobStore

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "CollectReport",
    "Cursor",
    "CursorFile",
    "collect",
    "collect_to_file",
    "main",
]

EXIT_FAILED = 1
EXIT_INCOMPLETE = 3
CHUNK = 2000


class CollectReport(msgspec.Struct, frozen=True):
    """What one run wrote: ``written`` lines from index ``start`` on (``ok``/``failed`` count
    this run's lines only)."""

    job: str
    written: int
    ok: int
    failed: int
    total: int | None
    start: int = 0

    @property
    def complete(self) -> bool:
        return self.total is not None and self.start + self.written >= self.total


class Cursor(msgspec.Struct, frozen=True):
    """How far an output file is known to be complete: ``index`` lines, ``offset`` bytes."""

    job: str
    index: int
    offset: int


_cursor_decoder = msgspec.json.Decoder(Cursor)


class CursorFile:
    """The durable cursor of an output file, kept beside it as ``FILE.cursor``.

    It is replaced atomically after the lines it counts are fsynced, so after a crash at any
    point the output can be cut back to the last committed line and continued: a rerun writes
    a file byte-identical to an uninterrupted run.
    """

    def __init__(self, out_path: str) -> None:
        self.path = out_path + ".cursor"

    def load(self, job: str) -> Cursor | None:
        try:
            with open(self.path, "rb") as fh:
                cursor = _cursor_decoder.decode(fh.read())
        except FileNotFoundError:
            return None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{self.path} is corrupt ({exc}); delete it to start over") from None
        if cursor.job != job:
            raise ConfigError(
                f"{self.path} belongs to job {cursor.job!r}, not {job!r}; "
                "choose another --out or delete the cursor file"
            )
        return cursor

    def save(self, cursor: Cursor) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(msgspec.json.encode(cursor))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


async def _wait_for_job(store: JobStore, job: str, wait: bool, poll_s: float) -> None:
    """Raise JobNotFoundError for an unknown job, unless following it (``--wait``): then the
    collector may start before the producer, and says what it waits for."""
    told = False
    while True:
        try:
            await store.load_spec(job)
            return
        except JobNotFoundError:
            if not wait:
                raise
            if not told:
                print(f"swarm-collect: waiting for job {job!r} to be enqueued", file=sys.stderr)
                told = True
        except StoreUnavailable as exc:
            if not wait:
                raise
            print(f"swarm-collect: {exc}; retrying", file=sys.stderr)
        await asyncio.sleep(max(poll_s, 0.5))


async def collect(
    store: JobStore,
    job: str,
    out: BinaryIO,
    *,
    wait: bool = False,
    poll_s: float = 0.2,
    progress: bool = False,
    start: int = 0,
    on_commit: Callable[[int], Awaitable[None]] | None = None,
) -> CollectReport:
    """Write results of ``job`` to ``out`` from index ``start`` on, in order; see module doc.

    ``on_commit(index)`` is called after each chunk is written and flushed, with the number of
    lines now complete: the collector's durable cursor hangs off it.
    """
    await _wait_for_job(store, job, wait, poll_s)
    cursor = start
    ok = failed = 0
    total: int | None = None
    failures = 0
    bar = tqdm(
        desc=job,
        unit=" prompts",
        file=sys.stderr,
        disable=None if progress else True,
        dynamic_ncols=True,
    )
    try:
        while True:
            try:
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
                    if on_commit is not None:
                        await on_commit(cursor)
                if len(lines) == CHUNK:
                    continue
                status = await store.status(job)
                failures = 0
            except StoreUnavailable as exc:
                if not wait:
                    raise
                failures += 1  # Redis restarting: keep following the job, slower
                print(f"swarm-collect: {exc}; retrying", file=sys.stderr)
                await asyncio.sleep(backoff_s(failures, base_s=0.5, cap_s=10.0))
                continue
            total = status.total
            if bar.total != (total or status.enqueued):
                bar.total = total or status.enqueued
            bar.n = status.done + status.failed
            bar.set_postfix(written=cursor, failed=status.failed, refresh=False)
            bar.refresh()
            if total is not None and cursor >= total:
                return CollectReport(job, cursor - start, ok, failed, total, start)
            if not wait:
                return CollectReport(job, cursor - start, ok, failed, total, start)
            await asyncio.sleep(poll_s)
    finally:
        bar.close()


async def collect_to_file(
    store: JobStore, job: str, path: str, *, wait: bool, progress: bool, evict: bool = False
) -> CollectReport:
    """Collect into ``path``, resuming from its durable cursor after an interrupted run.

    ``evict`` deletes each result from Redis once its line is fsynced in ``path``: the file
    becomes the only copy, and Redis memory stays bounded on a huge job.
    """
    cursors = CursorFile(path)
    cursor = cursors.load(job)
    fh: BinaryIO
    if cursor is None:
        fh = open(path, "wb")  # noqa: SIM115, ASYNC230 - closed below; a CLI, nothing else runs
        start, offset = 0, 0
    else:
        try:
            fh = open(path, "r+b")  # noqa: SIM115, ASYNC230 - closed below
        except FileNotFoundError:
            raise ConfigError(
                f"{cursors.path} exists but {path} does not; delete the cursor file to start over"
            ) from None
        fh.seek(0, os.SEEK_END)
        if fh.tell() < cursor.offset:
            fh.close()
            raise ConfigError(
                f"{path} is shorter than its cursor says; delete {cursors.path} to start over"
            )
        start, offset = cursor.index, cursor.offset
        fh.truncate(offset)  # drop lines written after the last committed cursor
        fh.seek(offset)

    evicted = 0

    async def commit(index: int) -> None:
        nonlocal evicted
        os.fsync(fh.fileno())
        cursors.save(Cursor(job, index, fh.tell()))
        if evict:  # only lines already durable in the file leave Redis
            await store.evict_results(job, evicted, index)
            evicted = index

    with fh:
        if cursor is None:
            cursors.save(Cursor(job, 0, 0))
        elif evict:
            await store.evict_results(job, 0, start)  # a crash may have come between the two
            evicted = start
        report = await collect(
            store, job, fh, wait=wait, progress=progress, start=start, on_commit=commit
        )
    if report.complete:
        cursors.remove()
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarm-collect", description="Write a job's results as JSON Lines in input order."
    )
    p.add_argument("job")
    p.add_argument("--out", required=True, help="output file, or - for stdout")
    p.add_argument("--wait", action="store_true", help="follow the job until every prompt is done")
    p.add_argument(
        "--evict",
        action="store_true",
        help="delete results from Redis once written to FILE (bounds Redis memory; "
        "the file becomes the only copy)",
    )
    add_redis_arg(p)
    return p


async def _main(args: argparse.Namespace) -> int:
    async with open_job_store(args) as (job, store):
        if args.out == "-":
            if args.evict:
                raise ConfigError(
                    "--evict needs --out FILE: results leave Redis only once a "
                    "file holds them durably"
                )
            report = await collect(store, job, sys.stdout.buffer, wait=args.wait)
        else:
            try:
                report = await collect_to_file(
                    store, job, args.out, wait=args.wait, progress=args.wait, evict=args.evict
                )
            except OSError as exc:
                raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
        status = await store.status(job)
    total = "?" if report.total is None else str(report.total)
    resumed = f", resumed at {report.start}" if report.start else ""
    print(
        f"job {job}: wrote {report.start + report.written} of {total} results "
        f"({status.done} ok, {status.failed} failed{resumed})",
        file=sys.stderr,
    )
    if not report.complete:
        print(f"job {job}: not finished; run again (or with --wait) for the rest", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FAILED if status.failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    raise SystemExit(run("swarm-collect", _main(args)))
