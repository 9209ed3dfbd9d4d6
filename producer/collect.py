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
import fcntl
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from functools import partial
from typing import BinaryIO

import msgspec
from tqdm import tqdm

from common.backoff import backoff_s
from common.cli import add_redis_arg, open_job_store, run
from common.errors import ConfigError, JobNotFoundError, StoreUnavailable
from common.models import (
    OutputLine,
    ReduceOutput,
    Result,
    encode_final,
    encode_json_line,
    result_or_failure,
)
from common.store import JobStatus, JobStore
from producer.openai_batch import openai_line

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "CollectReport",
    "Cursor",
    "CursorFile",
    "collect",
    "collect_to_file",
    "follow",
    "main",
    "wait_final",
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


async def follow(
    store: JobStore,
    job: str,
    *,
    start: int = 0,
    wait: bool = False,
    poll_s: float = 0.2,
    on_status: Callable[[JobStatus, int], None] | None = None,
) -> AsyncIterator[list[Result]]:
    """The results of ``job`` from index ``start`` on, in order, a chunk at a time as they
    arrive. Ends when every prompt has its result or, without ``wait``, when the next one is
    not in yet. With ``wait``, a Redis outage is waited out. ``on_status(status, next_index)``
    sees the job's status between chunks."""
    await _wait_for_job(store, job, wait, poll_s)
    cursor = start
    failures = 0
    while True:
        try:
            blobs = await store.fetch_results(job, cursor, CHUNK)
            chunk = []
            for i, blob in enumerate(blobs, cursor):
                if blob is None:
                    break
                chunk.append(result_or_failure(i, blob))
            if chunk:
                cursor += len(chunk)
                yield chunk
            if len(chunk) == CHUNK:
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
        if on_status is not None:
            on_status(status, cursor)
        if (status.total is not None and cursor >= status.total) or not wait:
            return
        await asyncio.sleep(poll_s)


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
    line: Callable[[Result], bytes] | None = None,
) -> CollectReport:
    """Write results of ``job`` to ``out`` from index ``start`` on, in order; see module doc.

    ``on_commit(index)`` is called after each chunk is written and flushed, with the number of
    lines now complete: the collector's durable cursor hangs off it. ``line`` formats a
    result as one output line (default: swarm-queue's own JSON line).
    """
    fmt = line or _own_line
    cursor = start
    ok = failed = 0
    total: int | None = None
    bar = tqdm(
        desc=job,
        unit=" prompts",
        file=sys.stderr,
        disable=None if progress else True,
        dynamic_ncols=True,
    )

    def show(status: JobStatus, written: int) -> None:
        nonlocal total
        total = status.total
        if bar.total != (total or status.enqueued):
            bar.total = total or status.enqueued
        bar.n = status.done + status.failed
        bar.set_postfix(written=written, failed=status.failed, refresh=False)
        bar.refresh()

    try:
        async for chunk in follow(
            store, job, start=start, wait=wait, poll_s=poll_s, on_status=show
        ):
            n_ok = sum(1 for r in chunk if r.ok)
            ok += n_ok
            failed += len(chunk) - n_ok
            out.write(b"".join(fmt(r) for r in chunk))
            out.flush()
            cursor += len(chunk)
            if on_commit is not None:
                await on_commit(cursor)
    finally:
        bar.close()
    return CollectReport(job, cursor - start, ok, failed, total, start)


def _own_line(r: Result) -> bytes:
    return encode_json_line(OutputLine.of(r))


async def line_format(store: JobStore, job: str, name: str) -> Callable[[Result], bytes]:
    """The line formatter for ``--format name`` (``jsonl`` or ``openai``) for ``job``."""
    if name == "openai":
        chat = (await store.load_spec(job)).chat
        return partial(openai_line, job, chat=chat)
    return _own_line


async def collect_to_file(
    store: JobStore,
    job: str,
    path: str,
    *,
    wait: bool,
    progress: bool,
    evict: bool = False,
    line: Callable[[Result], bytes] | None = None,
) -> CollectReport:
    """Collect into ``path``, resuming from its durable cursor after an interrupted run.

    ``evict`` deletes each result from Redis once its line is fsynced in ``path``: the file
    becomes the only copy, and Redis memory stays bounded on a huge job.
    """
    with _output_lock(path):
        return await _collect_locked(store, job, path, wait, progress, evict, line)


@contextlib.contextmanager
def _output_lock(path: str) -> Iterator[None]:
    """Hold ``FILE.lock`` while writing ``FILE``: a second collector on the same output is
    refused, naming the first, instead of the two overwriting each other's lines."""
    lock_path = path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{path} is being written by another swarm-collect ({holder}); wait for it to "
                "finish, or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode(), 0)
        yield
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
    finally:
        os.close(fd)


async def _collect_locked(
    store: JobStore,
    job: str,
    path: str,
    wait: bool,
    progress: bool,
    evict: bool,
    line: Callable[[Result], bytes] | None,
) -> CollectReport:
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
            store, job, fh, wait=wait, progress=progress, start=start, on_commit=commit, line=line
        )
    if report.complete:
        cursors.remove()
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarm-collect", description="Write a job's results as JSON Lines in input order."
    )
    p.add_argument("job")
    p.add_argument("--out", help="output file, or - for stdout (required, but for --final: stdout)")
    p.add_argument("--wait", action="store_true", help="follow the job until every prompt is done")
    p.add_argument(
        "--format",
        choices=["jsonl", "openai"],
        default="jsonl",
        help="jsonl: one swarm-queue line per prompt (default); openai: OpenAI Batch API "
        "output lines",
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
    add_redis_arg(p)
    return p


async def wait_final(
    store: JobStore, job: str, *, wait: bool, poll_s: float = 0.5
) -> ReduceOutput | None:
    """The job's reduce output; with ``wait``, waits for it. ConfigError if it has no reduce."""
    await _wait_for_job(store, job, wait, poll_s)
    spec = await store.load_spec(job)
    if spec.reduce is None:
        raise ConfigError(
            f"job {job!r} has no reduce stage (swarm-enqueue --reduce); collect its results "
            "without --final"
        )
    while True:
        final = await store.read_final(job)
        if final is not None or not wait:
            return final
        await asyncio.sleep(poll_s)


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
        if args.evict:
            status = await store.status(job)
            if status.reduce is not None and not status.reduced:
                raise ConfigError(
                    f"job {job!r} has a {status.reduce} reduce still to run, which reads the "
                    "results from Redis: --evict once 'swarm-collect --final' has its output"
                )
        if args.out == "-":
            if args.evict:
                raise ConfigError(
                    "--evict needs --out FILE: results leave Redis only once a "
                    "file holds them durably"
                )
            fmt = await line_format(store, job, args.format)
            report = await collect(store, job, sys.stdout.buffer, wait=args.wait, line=fmt)
        else:
            try:
                report = await collect_to_file(
                    store,
                    job,
                    args.out,
                    wait=args.wait,
                    progress=args.wait,
                    evict=args.evict,
                    line=await line_format(store, job, args.format),
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
