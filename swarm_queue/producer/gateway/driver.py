"""A batch's life, driven by one gateway process at a time: its input checked (``validating``),
queued as a swarm-queue job under its project's prefix (``in_progress``: drained by the
workers already running), its results collected into a work file in input order as they come
(OpenAI's output lines), then split into the output and error files (``finalizing``), and the
batch ``completed`` (or ``cancelled``, ``expired``, or ``failed`` with its input's errors).

Every gateway process runs a :class:`Driver`; each batch not over is driven by the one holding
its lease in Redis, renewed while it works. A process killed mid-batch lets the lease lapse
and another (or its restart) carries on: queuing is idempotent (a rerun resumes the input), the
collector resumes from its durable cursor, and the output files' ids and bytes are a function
of the batch, so finalizing again writes the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from swarm_queue.common.batchapi import (
    BatchError,
    BatchErrors,
    BatchObject,
    BatchStatus,
    FileObject,
    epoch_s,
)
from swarm_queue.common.errors import JobGoneError, JobNotFoundError, SwarmError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.gateway import workfile
from swarm_queue.producer.gateway.asjob import batch_spec, counts_of, usage_of
from swarm_queue.producer.gateway.files import FileStore
from swarm_queue.producer.gateway.offload import Helpers
from swarm_queue.producer.inputs import DEFAULT_MAX_PROMPT_BYTES
from swarm_queue.producer.outfile import CursorFile
from swarm_queue.producer.output import collect_output

__all__ = ["LEASE_MS", "Driver"]

log = logging.getLogger("swarm.gateway")

# A batch's lease: renewed every third of it while its driver lives; a dead driver's batch is
# taken up by another gateway process this long after its last renewal.
LEASE_MS = 15_000
# How often each process looks for batches to drive, and a driver for a cancel or expiry.
LOOK_S = 1.0
# Whatever goes wrong with a batch's driving (Redis away, a disk full), it is tried again so
# much later, by whichever process then takes its lease.
RETRY_S = 5.0


class Driver:
    """Drives every batch not over yet whose lease this process holds."""

    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        files: FileStore,
        jobs_of: Callable[[str], JobStore],
    ) -> None:
        self.store = store  # the gateway's own prefix: where the batches' records are
        self.settings = settings
        self.files = files
        self.jobs_of = jobs_of  # a project's prefix -> the store its jobs are queued in
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._later: dict[str, float] = {}  # batch -> when to try it again after a fault
        self._woken = asyncio.Event()
        self.helpers = Helpers()

    def wake(self) -> None:
        """Look now: a batch was created by this process (another's are found within
        ``LOOK_S``)."""
        self._woken.set()

    async def run(self) -> None:
        """Look for batches to drive, every ``LOOK_S`` or when woken, until cancelled."""
        self.helpers.warm()
        try:
            while True:
                with contextlib.suppress(SwarmError):
                    await self.step()
                    await self.expire()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), LOOK_S)
                self._woken.clear()
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self.helpers.close()

    async def step(self) -> bool:
        """Take up each batch not over whose lease is free; returns whether any was taken."""
        took = False
        for project, batch_id in await self.store.active_batches():
            if batch_id in self._tasks or time.monotonic() < self._later.get(batch_id, 0.0):
                continue
            if await self.store.hold_lease(batch_id, self.token, LEASE_MS):
                self._tasks[batch_id] = asyncio.create_task(self._hold(project, batch_id))
                took = True
        return took

    async def expire(self) -> None:
        """Delete every file whose expiry has passed: its record, then its bytes (whichever
        gateway process comes first; the others find nothing left)."""
        for project, file_id in await self.store.expired(epoch_s()):
            await self.store.delete_file(project, file_id)
            self.files.remove(project, file_id)
            log.info("file %s: expired and deleted (project %s)", file_id, project)

    async def _hold(self, project: str, batch_id: str) -> None:
        """Drive the batch while its lease is ours (renewed every third of it)."""
        drive = asyncio.create_task(self.drive(project, batch_id))
        try:
            while True:
                done, _ = await asyncio.wait({drive}, timeout=LEASE_MS / 3000)
                if done:
                    break
                try:
                    ours = await self.store.hold_lease(batch_id, self.token, LEASE_MS)
                except SwarmError:
                    continue  # Redis away: the driver's own calls wait it out too
                if not ours:
                    log.warning("batch %s: its lease went to another gateway; leaving it", batch_id)
                    drive.cancel()
                    break
            await drive
        except asyncio.CancelledError:
            drive.cancel()
            raise
        except Exception as exc:  # said, and tried again later by any process
            log.error("batch %s: %s (tried again in %.0f s)", batch_id, exc, RETRY_S)
            self._later[batch_id] = time.monotonic() + RETRY_S
        finally:
            self._tasks.pop(batch_id, None)
            with contextlib.suppress(SwarmError):
                await self.store.drop_lease(batch_id, self.token)

    async def drive(self, project: str, batch_id: str) -> None:
        """Take the batch from where it stands to its end."""
        stored = await self.store.batch(project, batch_id)
        if stored is None:
            return
        batch, jobs = stored.batch, self.jobs_of(stored.prefix)
        if batch.status == BatchStatus.VALIDATING and stored.cancel_at is not None:
            now = epoch_s()  # cancelled before anything was queued: nothing to run or keep
            batch = msgspec.structs.replace(
                batch, status=BatchStatus.CANCELLED, cancelling_at=stored.cancel_at,
                cancelled_at=now,
            )  # fmt: skip
            await self.store.save_batch(project, batch)
        if batch.status == BatchStatus.VALIDATING:
            batch = await self._check(project, batch)
            await self.store.save_batch(project, batch)
        if batch.status == BatchStatus.IN_PROGRESS:
            batch = await self._run(project, batch, stored.prefix, jobs)
            await self.store.save_batch(project, batch)
        if batch.status == BatchStatus.FINALIZING:
            batch = await self._finish(project, batch, jobs)
            await self.store.save_batch(project, batch)

    async def _check(self, project: str, batch: BatchObject) -> BatchObject:
        """Check the input: the batch fails with its errors, or goes in progress."""
        path = self.files.path(project, batch.input_file_id)
        if not path.exists():
            error = BatchError(code="file_not_found", message="The input file was deleted.")
            return msgspec.structs.replace(
                batch, status=BatchStatus.FAILED, failed_at=epoch_s(), errors=BatchErrors([error])
            )
        checked = await self.helpers.check(
            path, batch.endpoint, batch_spec(batch), DEFAULT_MAX_PROMPT_BYTES
        )
        if checked.errors:
            log.info("batch %s: its input failed validation", batch.id)
            return msgspec.structs.replace(
                batch,
                status=BatchStatus.FAILED,
                failed_at=epoch_s(),
                errors=BatchErrors(checked.errors),
            )
        return msgspec.structs.replace(
            batch,
            status=BatchStatus.IN_PROGRESS,
            in_progress_at=epoch_s(),
            model=checked.spec.model,
            request_counts=counts_of(0, 0, checked.requests),
        )

    async def _run(
        self, project: str, batch: BatchObject, prefix: str, jobs: JobStore
    ) -> BatchObject:
        """Queue the input and collect the answers at once: the workers start on the first
        requests while the rest are queued, and the collector follows them."""
        if await self._job_deleted(project, batch, jobs):
            return await self._deleted(project, batch)
        queue = asyncio.create_task(self._queue(project, batch, prefix, jobs))
        try:
            batch = await self._collect(project, batch, jobs, queue)
        except (JobGoneError, JobNotFoundError):
            return await self._deleted(project, batch)
        except _InputGone:
            error = BatchError(code="file_not_found", message="The input file was deleted.")
            return msgspec.structs.replace(
                batch, status=BatchStatus.FAILED, failed_at=epoch_s(), errors=BatchErrors([error])
            )
        finally:
            queue.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await queue
        return batch

    async def _job_deleted(self, project: str, batch: BatchObject, jobs: JobStore) -> bool:
        """Whether the batch's job was deleted (or deleted and queued again) since its
        collection began: its work file's cursor names another generation than the job's."""
        cursor = CursorFile(str(self._work_path(project, batch.id))).load(batch.id)
        if cursor is None:
            return False  # never collected: queuing (again) is how it starts
        try:
            return (await jobs.load_spec(batch.id)).generation != cursor.generation
        except JobNotFoundError:
            return True

    async def _deleted(self, project: str, batch: BatchObject) -> BatchObject:
        """The batch's job was deleted while it ran (``swarm-jobs --delete``, a Redis restarted
        empty): the batch fails, saying so, with the lines collected before in its files; it
        is never queued again behind its user's back."""
        log.error("batch %s: its job was deleted from Redis while it ran; it fails", batch.id)
        done = await self._split_files(project, batch)
        error = BatchError(
            code="job_deleted",
            message="The batch's job was deleted from Redis while it ran (swarm-jobs --delete, "
            "or a Redis restarted empty); the requests collected before are in its output file.",
        )
        return msgspec.structs.replace(
            done, status=BatchStatus.FAILED, failed_at=epoch_s(), errors=BatchErrors([error])
        )

    async def _queue(self, project: str, batch: BatchObject, prefix: str, jobs: JobStore) -> None:
        """Queue the batch's lines as its job (a rerun resumes where the last one stopped).
        A job queued whole needs its input no more: OpenAI lets a running batch's input be
        deleted, and the batch completes from what it holds. An input deleted before it was
        all queued ends the job with what was (none queued: the batch fails)."""
        path = self.files.path(project, batch.input_file_id)
        # Its project shares the fleet with the others; its window's end is its deadline.
        spec = msgspec.structs.replace(
            batch_spec(batch), model=batch.model, project=project, deadline_s=batch.expires_at
        )
        settings = msgspec.structs.replace(self.settings, prefix=prefix)
        while True:
            if await _queued_whole(jobs, batch.id):
                return
            if not path.exists():
                await _input_gone(jobs, batch.id)
                return
            outcome, total, why = await self.helpers.queue(settings, spec, path)
            if outcome == "queued":
                log.info("batch %s: %d requests queued", batch.id, total)
                return
            if outcome == "cancelled":
                return  # cancelled (or expired) while being queued: it ends where it stopped
            if outcome == "gone":
                raise JobGoneError(batch.id)
            if outcome == "error":
                raise SwarmError(f"queuing its input: {why}")
            # busy: a driver of this batch that died still holds the job's producer lock,
            # until its TTL; queue when it lapses (the rerun resumes the input).
            await asyncio.sleep(LOOK_S)

    def _work_path(self, project: str, batch_id: str) -> Path:
        return self.files.folder(project) / f"{batch_id}.lines"

    async def _collect(
        self, project: str, batch: BatchObject, jobs: JobStore, queue: asyncio.Task[None]
    ) -> BatchObject:
        """Collect the job's answers in input order, as they come, into the work file; a
        cancel asked, or the completion window passed, cancels what is left of the job. A
        fault of the ``queue`` task (the job's producer) ends it too."""
        watch = asyncio.create_task(self._watch(project, batch, jobs))
        work = str(self._work_path(project, batch.id))
        collect = asyncio.create_task(
            collect_output(jobs, batch.id, work, "openai", wait=True, progress=False, evict=True)
        )
        try:
            await asyncio.wait({collect, queue}, return_when=asyncio.FIRST_COMPLETED)
            fault = queue.exception() if queue.done() else None
            if fault is not None:
                raise fault
            await collect
        finally:
            for task in (collect, watch):
                task.cancel()
            await asyncio.gather(collect, watch, return_exceptions=True)
        return msgspec.structs.replace(
            batch, status=BatchStatus.FINALIZING, finalizing_at=epoch_s()
        )

    async def _watch(self, project: str, batch: BatchObject, jobs: JobStore) -> None:
        """Cancel the job once a cancel is asked or the batch's window has passed (its
        answered requests stay answered; the rest fail as cancelled)."""
        while True:
            stored = await self.store.batch(project, batch.id)
            asked = stored is not None and stored.cancel_at is not None
            if asked or epoch_s() >= batch.expires_at:
                why = (
                    "the batch was cancelled (batches.cancel)"
                    if asked
                    else f"the batch expired: its completion window ({batch.completion_window}) "
                    "ended before this request was answered"
                )
                try:
                    await jobs.cancel(batch.id, why)
                    return
                except JobNotFoundError:
                    pass  # not queued yet: cancelled once it is
            await asyncio.sleep(LOOK_S)

    async def _finish(self, project: str, batch: BatchObject, jobs: JobStore) -> BatchObject:
        """Split the work file into the output and error files, and end the batch. Its
        requests cut short by its cancel or its window's end are in the error file as OpenAI
        writes them: no response, and the code ``batch_cancelled`` or ``batch_expired``."""
        status = await jobs.status(batch.id, rate=False)
        now = epoch_s()
        stored = await self.store.batch(project, batch.id)
        cancelled = stored is not None and stored.cancel_at is not None
        expired = not cancelled and status.failed > 0 and now >= batch.expires_at
        stopped = "batch_expired" if expired else "batch_cancelled"
        batch = await self._split_files(project, batch, clean=status.failed == 0, stopped=stopped)
        end = (
            {
                "status": BatchStatus.CANCELLED,
                "cancelled_at": now,
                "cancelling_at": stored.cancel_at,
            }
            if cancelled and stored is not None
            else {"status": BatchStatus.EXPIRED, "expired_at": now}
            if expired
            else {"status": BatchStatus.COMPLETED, "completed_at": now}
        )
        log.info("batch %s: %s", batch.id, end["status"])
        counts = counts_of(status.done, status.failed, status.total or 0)
        return msgspec.structs.replace(batch, request_counts=counts, usage=usage_of(status), **end)

    async def _split_files(
        self,
        project: str,
        batch: BatchObject,
        *,
        clean: bool = False,
        stopped: str = "batch_cancelled",
    ) -> BatchObject:
        """Split the work file into the output file (answered requests) and the error file
        (failed ones), keep their records, and forget the work file. A ``clean`` batch (no
        request failed) has every line in its output file: the work file becomes it, renamed,
        not copied line by line (half a second for 100,000 lines). A request cancelled before
        it was answered gets OpenAI's code ``stopped`` (see :func:`.workfile.split_lines`).
        Split line by line, the batch's counts become its files' lines: what a client then
        reads agrees with what it can download (a job deleted under its batch loses what it
        had answered but not yet collected)."""
        work = self._work_path(project, batch.id)
        ids = {role: workfile.file_id(batch.id, role) for role in ("output", "error")}
        paths = {role: self.files.path(project, fid) for role, fid in ids.items()}
        if clean:
            sizes = await asyncio.to_thread(workfile.rename_whole, work, paths)
        else:
            sizes, lines = await asyncio.to_thread(workfile.split_lines, work, paths, stopped)
            counts = counts_of(lines["output"], lines["error"], batch.request_counts.total)
            batch = msgspec.structs.replace(batch, request_counts=counts)
        now = epoch_s()
        keep = batch.output_expires_after
        kept: dict[str, str | None] = {}
        for role, file_id in ids.items():
            if sizes[role] == 0:
                self.files.remove(project, file_id)
                kept[role] = None
                continue
            name = f"{batch.id}_{role}.jsonl"
            await self.store.put_file(
                project,
                FileObject(
                    id=file_id, bytes=sizes[role], created_at=now, filename=name,
                    purpose="batch_output", expires_at=None if keep is None else now + keep.seconds,
                ),
            )  # fmt: skip
            kept[role] = file_id
        await asyncio.to_thread(workfile.forget_work, work)
        return msgspec.structs.replace(
            batch, output_file_id=kept["output"], error_file_id=kept["error"]
        )


class _InputGone(Exception):
    """A batch's input file was deleted before any of it was queued."""


async def _queued_whole(jobs: JobStore, job: str) -> bool:
    """Whether ``job`` holds all of its input (sealed with its total)."""
    try:
        return (await jobs.status(job, rate=False)).total is not None
    except JobNotFoundError:
        return False


async def _input_gone(jobs: JobStore, job: str) -> None:
    """The input of ``job`` was deleted part-way: the job ends with what was queued (sealed
    so), or :class:`_InputGone` if nothing was."""
    try:
        gen = (await jobs.load_spec(job)).generation
    except JobNotFoundError:
        raise _InputGone(job) from None
    queued = await jobs.enqueued_count(job)
    if not queued:
        raise _InputGone(job)
    await jobs.seal(job, queued, gen=gen)
    log.warning(
        "batch %s: its input file was deleted before all of it was queued; it ends with the "
        "%d requests queued",
        job,
        queued,
    )
