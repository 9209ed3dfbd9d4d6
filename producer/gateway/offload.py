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
import multiprocessing
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
from swarm_queue.producer.gateway.validate import Checked, check_input

__all__ = ["Helpers", "Queued"]

# Helper processes: batches checked or queued at once by one gateway process.
HELPERS = 2

Queued = tuple[Literal["queued", "busy", "cancelled", "gone", "error"], int, str]


def _queue(settings: Settings, spec: JobSpec, path: str) -> Queued:
    """Queue the batch file at ``path`` as ``spec``'s job (in a helper process): ``queued``
    and how many requests, ``busy`` (another producer holds the job's lock: a driver of the
    batch that died, until its lock's TTL), ``cancelled`` (cancelled while being queued),
    ``gone`` (the job deleted while being queued), or ``error`` and what went wrong."""

    async def run() -> Queued:
        try:
            with open(path, "rb") as fh:  # noqa: ASYNC230 - this process's only work
                report = await enqueue(settings, spec, Path(path).name, fh, fmt="jsonl")
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


class Helpers:
    """The helper processes of one gateway process."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                HELPERS, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    async def check(self, path: Path, endpoint: str, spec: JobSpec, max_bytes: int) -> Checked:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor(), check_input, path, endpoint, spec, max_bytes
        )

    async def queue(self, settings: Settings, spec: JobSpec, path: Path) -> Queued:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), _queue, settings, spec, str(path))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
