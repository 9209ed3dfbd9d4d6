"""arq's part of the worker: ``arq swarm_queue.worker.WorkerSettings [--burst]``, and
``swarm-worker``.

arq runs the process and the startup and shutdown hooks; the drain engine runs beside arq's
loop. No work goes through arq's queue: prompts are on the job's streams, and a reduce's next
step is taken by whichever worker's reduce flow finds its stage finished (flows/reduce/).
Only arq's documented surface is used: the worker's arguments as a mapping
(:func:`worker_settings`, parsed when arq's CLI reads ``worker.WorkerSettings``, never at
import), the ``ctx`` its hooks receive, and
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
from typing import Any

from swarm_queue.common.arqconf import arq_connection, job_deserializer, job_serializer
from swarm_queue.common.errors import ConfigError, SwarmError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.engine import Engine

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


@dataclasses.dataclass
class _Running:
    """What startup leaves in arq's ctx for shutdown."""

    engine: Engine
    task: asyncio.Task[None]  # the engine's run
    store: JobStore
    arq_loop: asyncio.Task[Any] | None  # arq's main loop, which runs the hooks


# A worker's Redis connections: SHARED_CONNECTIONS, and one for every two of its endpoints,
# for its slots' reads, commits and heartbeats, its job sweep, its figures, and the blocking
# reads of new entries (one a job among its idle endpoints: worker/lookout.py's Watch). One an
# endpoint once, when each idle endpoint held a blocking read of its own; unbounded, a worker
# held 4.6 an endpoint at its peak (scenario 9: 4,594 clients for 1,000 endpoints, near
# Redis's default maxclients of 10,000 at 2,000). 16: two instant endpoints with 32 batches in
# flight each, Redis-bound, ran 0.92x as fast with 8 and 1.03x with 16 as unbounded (150,000
# prompts, three alternating rounds, this 2-core machine).
SHARED_CONNECTIONS = 16


def worker_connections(settings: Settings) -> int:
    """The most connections to Redis one worker process holds (see SHARED_CONNECTIONS)."""
    return len(settings.endpoints) // 2 + SHARED_CONNECTIONS


async def startup(ctx: dict[str, Any]) -> None:
    _setup_logging()
    settings: Settings = ctx["settings"]
    burst = bool(ctx.get("burst"))
    store = JobStore.from_settings(settings, connections=worker_connections(settings))
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


async def ping(ctx: dict[str, Any]) -> str:
    """arq's one function: arq needs one, and it lets an operator check a worker answers.
    Nothing of the work goes through arq's queue (see the module's docstring)."""
    return "pong"


def worker_settings(settings: Settings, *, burst: bool = False) -> dict[str, Any]:
    """arq's worker arguments for ``settings`` (arq takes a mapping as well as a class).

    arq installs no signal handlers (``handle_signals=False``): startup installs the worker's
    own, which stop the engine first. ``burst`` is the engine's (``swarm-worker --burst``):
    arq's loop runs until the engine is done, then is ended.
    """
    return {
        "functions": [ping],
        "on_startup": startup,
        "on_shutdown": shutdown,
        **arq_connection(settings),
        "queue_name": settings.keys.arq_queue,
        "health_check_key": settings.keys.arq_health_check,
        "job_serializer": job_serializer,
        "job_deserializer": job_deserializer,
        "poll_delay": 0.5,
        "handle_signals": False,
        "ctx": {"settings": settings, "burst": burst},
    }
