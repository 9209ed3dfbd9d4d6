"""A batch's input read in a process of its own: checking every line and queuing it are the
heaviest work a gateway does (a line's JSON parsed twice, its rules, its queuing), and in the
gateway's process they would hold its one core and its event loop, so that the API answered
late and the collector fell behind. A small pool of helper processes (started on first use,
by spawning: the gateway's threads and loop are not forked) does it beside them, as
``swarm-enqueue`` does beside ``swarm-collect``.

What crosses the process boundary is msgspec Structs and plain values: a helper's outcome is
a value, never an exception object to unpickle.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Literal

from swarm_queue.common.errors import (
    JobCancelledError,
    JobGoneError,
    ProducerBusyError,
    SwarmError,
)
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.producer.enqueue import enqueue
from swarm_queue.producer.gateway.validate import (
    Checked,
    check_ids,
    check_rules,
    combine,
    needs_again,
    split_points,
)

__all__ = ["Helpers", "Queued"]

# Helper processes: batches checked or queued at once by one gateway process.
HELPERS = 2
# An input of at least this many bytes has its rules checked in two ranges at once, the first
# this fraction of it: the helper with the second range first reads every custom_id, which
# takes about a fifth of the rules' time.
SPLIT_BYTES = 1 << 20
SPLIT_AT = 0.6
# How often a helper checks that its gateway is still alive.
PARENT_CHECK_S = 1.0

Queued = tuple[Literal["queued", "busy", "cancelled", "gone", "error"], int, str]


def _queue(settings: Settings, spec: JobSpec, path: str) -> Queued:
    """Queue the batch file at ``path`` as ``spec``'s job (in a helper process): ``queued``
    and how many requests, ``busy`` (another producer holds the job's lock: a driver of the
    batch that died, until its lock's TTL), ``cancelled`` (cancelled while being queued),
    ``gone`` (the job deleted while being queued), or ``error`` and what went wrong."""

    async def run() -> Queued:
        try:
            with open(path, "rb") as fh:  # noqa: ASYNC230 - this process's only work
                report = await enqueue(
                    settings, spec, Path(path).name, fh, fmt="jsonl", checked=True
                )
        except ProducerBusyError:
            return "busy", 0, ""
        except JobCancelledError:
            return "cancelled", 0, ""
        except JobGoneError:
            return "gone", 0, ""
        except SwarmError as exc:
            return "error", 0, str(exc)
        return "queued", report.total, ""

    return asyncio.run(run())


def _ranges(path: Path) -> list[tuple[int, int]]:
    """The byte ranges whose rules are checked at once (one for a small file)."""
    size = path.stat().st_size
    cuts = split_points(path, [SPLIT_AT]) if size >= SPLIT_BYTES else [0, size]
    return list(itertools.pairwise(cuts))


def _follow(parent: int) -> None:
    """Run in each helper as it starts: end it once its gateway is gone, however the gateway
    ended (a SIGKILL runs no shutdown, and a helper left waiting on its queue for ever
    would hold its memory and, through the resource tracker, a third process)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="follow-gateway", daemon=True).start()


def _ready() -> None:
    """Nothing: run once in each helper as the gateway starts, so that its spawning and its
    imports (a second of CPU) are paid before the first batch, not by it."""


class Helpers:
    """The helper processes of one gateway process."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                HELPERS,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_follow,
                initargs=(os.getpid(),),
            )
        return self._pool

    def warm(self) -> None:
        """Start every helper now (in the background)."""
        for _ in range(HELPERS):
            self._executor().submit(_ready)

    async def check(self, path: Path, endpoint: str, spec: JobSpec, max_bytes: int) -> Checked:
        """Check the input at ``path`` (see :mod:`.validate`): its custom_ids and the rules
        over its ranges, all at once in the helpers."""
        loop = asyncio.get_running_loop()
        pool = self._executor()
        ranges = await asyncio.to_thread(_ranges, path)
        # Submitted in this order, the pool's two helpers take the first range and the ids,
        # and the one that ends first (the ids') the second range.
        rules = [
            loop.run_in_executor(pool, check_rules, path, *ranges[0], endpoint, spec, max_bytes)
        ]
        ids = loop.run_in_executor(pool, check_ids, path)
        rules += [
            loop.run_in_executor(pool, check_rules, path, a, b, endpoint, spec, max_bytes)
            for a, b in ranges[1:]
        ]
        parts = list(await asyncio.gather(*rules))
        while (k := needs_again(parts)) is not None:
            known = combine(parts[:k], []).spec
            a, b = ranges[k]
            parts[k] = await loop.run_in_executor(
                pool, check_rules, path, a, b, endpoint, known, max_bytes
            )
        return combine(parts, await ids)

    async def queue(self, settings: Settings, spec: JobSpec, path: Path) -> Queued:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), _queue, settings, spec, str(path))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
