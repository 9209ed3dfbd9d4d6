"""arq's part of the worker: ``arq swarm_queue.worker.WorkerSettings [--burst]``, and
``swarm-worker``.

arq runs the process, its own job queue (the reduce steps) and the startup and shutdown hooks;
the drain engine runs beside arq's loop. Only arq's documented surface is used: the worker's
arguments as a mapping (:func:`worker_settings`, parsed when arq's CLI reads
``worker.WorkerSettings``, never at import), the ``ctx`` its hooks receive, and
``handle_signals=False`` so that the worker's own handlers stop the engine first:

* startup starts the engine; a signal stops it taking work and ends arq's loop, and shutdown
  gives batches in flight ``SWARM_SHUTDOWN_GRACE_S`` before cancelling them;
* when the engine is done (``swarm-worker --burst``, or no usable endpoint) it ends arq's loop;
* when arq's loop ends by itself (``arq ... --burst``: arq's queue is empty), shutdown lets
  the engine finish the work left first.

arq's job payloads are msgpack via msgspec, never pickle: nothing read from Redis is unpickled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from typing import Any

from arq import Retry
from arq.connections import ArqRedis
from arq.jobs import Job, JobStatus
from arq.worker import func

from swarm_queue.common.arqconf import arq_connection, job_deserializer, job_serializer
from swarm_queue.common.errors import ConfigError, EndpointRetryable, StoreUnavailable, SwarmError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.reduce import StageBusy

__all__ = ["job_deserializer", "job_serializer", "load_worker_settings", "worker_settings"]

log = logging.getLogger("swarm.worker")


def load_worker_settings() -> dict[str, Any]:
    """``worker.WorkerSettings`` as arq's CLI reads it: the settings parsed from the
    environment at that moment (a bad one is one line and exit status 2)."""
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"swarm worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return worker_settings(settings)


def _setup_logging() -> None:
    logger = logging.getLogger("swarm")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


# How long this worker sees a stage's arq advance job marked running before it advances the
# stage itself: arq marks a job taken before running it, and a connection lost with that
# mark's reply (a Redis restart) leaves it marked and run by nobody until the mark expires,
# the reduce's whole timeout and more. Advancing is idempotent and locked: beside a run that
# is real, the stage is busy and nothing is done twice.
ADVANCE_GRACE_S = 10.0


class _Advances:
    """A finished stage's advance, handed to arq's queue (any worker may run it), or run here
    when arq would never run it."""

    def __init__(self, engine: Engine, arq_redis: ArqRedis, arq_loop: asyncio.Task[Any] | None):
        self.engine, self.arq_redis, self.arq_loop = engine, arq_redis, arq_loop
        # Each advance job this worker saw marked running: its ID -> since (monotonic).
        self.running_since: dict[str, float] = {}

    async def schedule(self, job: str, level: int) -> None:
        engine, keys = self.engine, self.engine.settings.keys
        if self.arq_loop is None or self.arq_loop.done():
            # arq's loop has ended (its --burst found its queue empty): nobody here would
            # run a queued arq job, so the step runs here (it is idempotent and locked).
            await engine.advance_here(job, level)
            return
        # One arq job per (job, stage): its ID makes arq refuse a second while one is queued
        # or running, however many workers notice the finished stage.
        job_id = keys.advance_job_id(job, level)
        queued = await self.arq_redis.enqueue_job(
            "advance", job, level, _job_id=job_id, _queue_name=keys.arq_queue
        )
        if queued is not None:
            return
        state = await Job(job_id, self.arq_redis, _queue_name=keys.arq_queue).status()
        if state != JobStatus.in_progress:
            self.running_since.pop(job_id, None)
        elif time.monotonic() - self.running_since.setdefault(job_id, time.monotonic()) >= (
            ADVANCE_GRACE_S
        ):
            await engine.advance_here(job, level)  # its run may be lost: see ADVANCE_GRACE_S
            return
        if state in (JobStatus.not_found, JobStatus.complete):
            # Refused, yet nothing is queued or running under that ID: a stray record squats
            # it. The step is idempotent and locked, so it is run here instead of never.
            log.warning(
                "job %s: arq job ID %s is taken by a stray record; advancing here", job, job_id
            )
            await engine.advance_here(job, level)


@dataclasses.dataclass
class _Running:
    """What startup leaves in arq's ctx for shutdown and the arq functions."""

    engine: Engine
    task: asyncio.Task[None]  # the engine's run
    store: JobStore
    arq_loop: asyncio.Task[Any] | None  # arq's main loop, which runs the hooks


async def startup(ctx: dict[str, Any]) -> None:
    _setup_logging()
    settings: Settings = ctx["settings"]
    burst = bool(ctx.get("burst"))
    store = JobStore.from_settings(settings)
    engine: Engine | None = None
    try:
        engine = Engine(settings, store)
        await engine.start_metrics()
    except ConfigError as exc:
        if engine is not None:
            await engine.close()
        await store.close()
        print(f"swarm worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    log.info(
        "worker %s: %d endpoint(s) %s, batch %d x %d in flight, Redis %s%s",
        settings.worker_name,
        len(engine.drainers),
        ", ".join(d.label for d in engine.drainers),
        settings.batch_size,
        settings.inflight,
        settings.redis_url_masked
        + (" (the default: SWARM_REDIS_URL is not set)" if settings.redis_defaulted else ""),
        ", burst" if burst else "",
    )
    arq_redis: ArqRedis = ctx["redis"]
    # arq runs its startup hook inside its main loop's task: ending that task is how its own
    # signal handler stops it, and how this worker stops it when the engine is done.
    arq_loop = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("%s received", sig.name)
        engine.request_stop()
        if arq_loop is not None:
            arq_loop.cancel()  # arq's loop ends, then its shutdown hook gives the grace period
        # A stop waits on no Redis that is gone past its grace period: arq's own last writes
        # (before our hook runs) and ours would each wait minutes for it to come back.
        loop.call_later(settings.shutdown_grace_s + STOP_WATCH_S, _past_grace, store)

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)

    def engine_done(t: asyncio.Task[None]) -> None:
        if not t.cancelled() and t.exception() is not None:
            # Never a process serving nothing: the worker exits with an error (shutdown).
            log.error("drain engine failed: %r; stopping the worker", t.exception())
        elif not engine.burst and not engine.stopping:
            # Only endpoint-wide trouble (a wrong key, no OpenAI server at the URL) ends
            # the drain loops of a long-running worker; never a job.
            log.error("no usable endpoint left; stopping the worker")
        if arq_loop is not None:
            arq_loop.cancel()

    engine.on_stage_done = _Advances(engine, arq_redis, arq_loop).schedule
    task = asyncio.create_task(engine.run(burst=burst), name="swarm-engine")
    task.add_done_callback(engine_done)
    ctx["swarm"] = _Running(engine, task, store, arq_loop)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long past its grace period a stopping worker waits on a Redis that does not answer.
STOP_WATCH_S = 10.0


def _past_grace(store: JobStore) -> None:
    """Still stopping, well past the grace period: if Redis does not answer, that is what the
    stop waits on. Exit now (status 1): the work taken stays queued in Redis for others."""
    if store.reachable:
        log.warning("still stopping past the grace period; waiting for the last writes")
        return
    log.error("Redis does not answer: stopping without the last writes (the work stays queued)")
    logging.shutdown()
    os._exit(1)


# How long a stopping worker waits, past its grace period, for its last writes to Redis.
LAST_WRITES_S = 5.0
_CUTS = 50


def _ended_by_its_burst(arq_loop: asyncio.Task[Any] | None) -> bool:
    """arq's loop returned by itself: with ``--burst``, arq stops once its own queue is empty
    (its loop is stopped by cancelling it otherwise, or ends by an error)."""
    return (
        arq_loop is not None
        and arq_loop.done()
        and not arq_loop.cancelled()
        and arq_loop.exception() is None
    )


async def shutdown(ctx: dict[str, Any]) -> None:
    running: _Running | None = ctx.get("swarm")
    if running is None:
        return
    engine, task = running.engine, running.task
    if not task.done() and not engine.stopping and _ended_by_its_burst(running.arq_loop):
        # ``arq ... --burst``: arq's queue is empty, the engine's work is not. It finishes
        # that first (a signal still stops it, with the grace period below).
        engine.finish_when_idle()
        stop = asyncio.create_task(engine.until_stopping())
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
    if not task.done():
        engine.request_stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=engine.settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("grace period over; cancelling batches in flight (they stay queued)")
            task.cancel()
    # A cancelled engine's last writes (what it held handed back, its last word for
    # swarm-status) wait on Redis; with Redis gone, for minutes. They are bounded: what it
    # held stays queued in Redis, and other workers reclaim it.
    await asyncio.wait({task}, timeout=LAST_WRITES_S)
    if not task.done():
        log.warning("Redis does not answer: stopping without the last writes (work stays queued)")
        for _ in range(_CUTS):  # each cancel cuts the write the engine waits on short
            task.cancel()
            await asyncio.wait({task}, timeout=0.2)
            if task.done():
                break
    failed = task.done() and not task.cancelled() and task.exception() is not None
    if task.done():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.remove_signal_handler(sig)
    for closing in (engine.close(), running.store.close()):
        with contextlib.suppress(TimeoutError, SwarmError):
            await asyncio.wait_for(closing, LAST_WRITES_S)
    for d in engine.drainers:
        log.info("%s", d.summary())
    if _left_work(engine, failed):
        # The exit status says work was left that these endpoints should have done: arq
        # itself would exit 0. Its Redis pool is closed here, as arq would after this hook.
        await ctx["redis"].close(close_connection_pool=True)
        raise SystemExit(1)


def _left_work(engine: Engine, failed: bool) -> bool:
    """Whether the worker leaves work its endpoints should have done (each reason logged):
    an endpoint unusable, every endpoint died (a burst worker), or the engine failed."""
    dead = engine.dead
    all_dead = bool(dead) and len(dead) == len(engine.drainers)
    for reason in dead if not all_dead else ():
        log.warning("endpoint given up on: %s", reason)
    for reason in engine.broken:
        log.error("exiting with an error: endpoint unusable: %s", reason)
    if all_dead:
        log.error("exiting with an error: every endpoint died: %s", "; ".join(dead))
    if failed:
        log.error("exiting with an error: the drain engine failed (see above)")
    return bool(engine.broken) or all_dead or failed


async def advance(ctx: dict[str, Any], job: str, level: int) -> str:
    """arq job: move ``job`` on from its finished stage ``level`` (see :mod:`worker.reduce`).

    Transient trouble (Redis or the endpoints unreachable, another worker on the same stage)
    is retried by arq; the last try ends the reduce with the error instead of leaving the job
    waiting forever.
    """
    engine: Engine = ctx["swarm"].engine
    try:
        return await engine.reducer.advance(job, level)
    except (StoreUnavailable, EndpointRetryable, StageBusy) as exc:
        if ctx.get("job_try", 1) >= ADVANCE_TRIES:
            spec = await engine.store.load_spec(job)
            return await engine.reducer.fail(spec, f"stage {level} could not advance: {exc}")
        log.info("job %s: stage %d not advanced yet (%s); retrying", job, level, exc)
        raise Retry(defer=ctx.get("job_try", 1) * 5) from None


# A busy stage's lock expires in 30 s; Redis or an endpoint gets a few minutes to come back.
ADVANCE_TRIES = 20


async def ping(ctx: dict[str, Any]) -> str:
    """A trivial arq function: arq needs one, and it lets an operator check a worker answers."""
    return "pong"


def worker_settings(settings: Settings, *, burst: bool = False) -> dict[str, Any]:
    """arq's worker arguments for ``settings`` (arq takes a mapping as well as a class).

    arq installs no signal handlers (``handle_signals=False``): startup installs the worker's
    own, which stop the engine first. ``burst`` is the engine's (``swarm-worker --burst``):
    arq's loop keeps serving the reduce steps until the engine is done, then is ended.
    """
    return {
        "functions": [
            ping,
            # keep_result=0: the job ID blocks a duplicate only while queued or running; once
            # done, the stage it advanced is recorded and no worker schedules it again.
            func(
                advance, keep_result=0, max_tries=ADVANCE_TRIES, timeout=settings.reduce_timeout_s
            ),
        ],
        "on_startup": startup,
        "on_shutdown": shutdown,
        **arq_connection(settings),
        "queue_name": settings.keys.arq_queue,
        "health_check_key": settings.keys.arq_health_check,
        "job_serializer": job_serializer,
        "job_deserializer": job_deserializer,
        # arq hands a killed worker's job to another after the longest function timeout + 10 s.
        "job_timeout": settings.reduce_timeout_s,
        "poll_delay": 0.5,
        "handle_signals": False,
        "ctx": {"settings": settings, "burst": burst},
    }
