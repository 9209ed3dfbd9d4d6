"""The arq entry point: ``arq worker.WorkerSettings [--burst]``.

arq runs the worker process: its signal handling, its own job queue (used for worker-side jobs),
its startup and shutdown hooks. The drain engine runs beside arq's polling loop:

* startup parses the settings (once, here), starts the engine, and, in burst mode, holds arq's
  own burst exit back until the engine has drained every job;
* SIGTERM/SIGINT reach the engine through arq's ``on_stop`` hook: it stops taking work, and
  shutdown gives batches in flight ``SWARM_SHUTDOWN_GRACE_S`` to finish before cancelling them.

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

import msgspec
from arq import Retry
from arq.connections import ArqRedis, RedisSettings
from arq.jobs import Job, JobStatus
from arq.worker import Worker, func

from common.errors import ConfigError, EndpointRetryable, StoreUnavailable
from common.settings import Settings
from common.store import RETRY_ON, JobStore, redis_retry
from worker.engine import Engine
from worker.reduce import StageBusy

__all__ = ["WorkerSettings", "job_deserializer", "job_serializer"]

log = logging.getLogger("swarm.worker")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def job_serializer(data: dict[str, Any]) -> bytes:
    """arq job payloads as msgpack (arq's default is pickle)."""
    return _encoder.encode(data)


def job_deserializer(data: bytes) -> dict[str, Any]:
    result: dict[str, Any] = _decoder.decode(data)
    return result


def _load_settings() -> Settings:
    try:
        return Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"swarm worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _current_arq_worker() -> Worker | None:
    """The arq Worker whose ``main()`` is running this hook, found through the current task.

    arq hands hooks only a ctx dict; the Worker object is needed to know ``--burst`` and to hook
    ``on_stop``. If arq's internals change, we fall back to plain (non-burst) behaviour.
    """
    task = asyncio.current_task()
    coro = task.get_coro() if task is not None else None
    frame = getattr(coro, "cr_frame", None)
    candidate = frame.f_locals.get("self") if frame is not None else None
    return candidate if isinstance(candidate, Worker) else None


def _setup_logging() -> None:
    logger = logging.getLogger("swarm")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


async def startup(ctx: dict[str, Any]) -> None:
    _setup_logging()
    settings = SETTINGS
    store = JobStore.from_settings(settings)
    try:
        engine = Engine(settings, store)
    except ConfigError as exc:
        await store.close()
        print(f"swarm worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    worker = _current_arq_worker()
    burst = bool(worker is not None and worker.burst)
    log.info(
        "worker %s: %d endpoint(s) %s, batch %d x %d in flight, Redis %s%s",
        settings.worker_name,
        len(engine.drainers),
        ", ".join(d.client.label for d in engine.drainers),
        settings.batch_size,
        settings.inflight,
        settings.redis_url_masked,
        ", burst" if burst else "",
    )
    arq_redis: ArqRedis = ctx["redis"]

    async def schedule_advance(job: str, level: int) -> None:
        # One arq job per (job, stage): its ID makes arq refuse a second while one is queued
        # or running, however many workers notice the finished stage.
        job_id = settings.keys.advance_job_id(job, level)
        queued = await arq_redis.enqueue_job(
            "advance", job, level, _job_id=job_id, _queue_name=settings.keys.arq_queue
        )
        if queued is not None:
            return
        state = await Job(job_id, arq_redis, _queue_name=settings.keys.arq_queue).status()
        if state in (JobStatus.not_found, JobStatus.complete):
            # Refused, yet nothing is queued or running under that ID: a stray record squats
            # it. The step is idempotent and locked, so it is run here instead of never.
            log.warning(
                "job %s: arq job ID %s is taken by a stray record; advancing here", job, job_id
            )
            await engine.advance_here(job, level)

    engine.on_stage_done = schedule_advance
    task = asyncio.create_task(engine.run(burst=burst), name="swarm-engine")

    if worker is not None:
        # arq's burst loop would exit as soon as its own queue is empty; keep it running until
        # the engine has drained everything, then let it finish its queue and exit.
        worker.burst = False
        worker.on_stop = lambda _sig: engine.request_stop()

        def _engine_done(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("drain engine failed: %r", t.exception())
            worker.burst = True
            if not burst and not engine.stopping:
                # Only endpoint-wide trouble (a wrong key, no OpenAI server at the URL) ends
                # the drain loops of a long-running worker; never a job.
                log.error("no usable endpoint left; stopping the worker")
                worker.handle_sig(signal.SIGTERM)

        task.add_done_callback(_engine_done)
    ctx["swarm"] = (engine, task, store)


async def shutdown(ctx: dict[str, Any]) -> None:
    if "swarm" not in ctx:
        return
    engine, task, store = ctx["swarm"]
    if not task.done():
        engine.request_stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=SETTINGS.shutdown_grace_s)
        except TimeoutError:
            log.warning("grace period over; cancelling batches in flight (they stay queued)")
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    await engine.close()
    await store.close()
    for d in engine.drainers:
        log.info(
            "%s: %d prompts done, %d failed, %d requests, %d retries, %d prompts preempted",
            d.client.label,
            d.prompts_done,
            d.prompts_failed,
            d.requests,
            d.retries,
            d.preempted,
        )
    if engine.broken:
        # The exit status says work was left that these endpoints should have done: arq
        # itself would exit 0. Its Redis pool is closed here, as arq would after this hook.
        for reason in engine.broken:
            log.error("exiting with an error: endpoint unusable: %s", reason)
        await ctx["redis"].close(close_connection_pool=True)
        raise SystemExit(1)


async def advance(ctx: dict[str, Any], job: str, level: int) -> str:
    """arq job: move ``job`` on from its finished stage ``level`` (see :mod:`worker.reduce`).

    Transient trouble (Redis or the endpoints unreachable, another worker on the same stage)
    is retried by arq; the last try ends the reduce with the error instead of leaving the job
    waiting forever.
    """
    engine: Engine = ctx["swarm"][0]
    try:
        return await engine.reducer.advance(job, level)
    except (StoreUnavailable, EndpointRetryable, StageBusy) as exc:
        if ctx.get("job_try", 1) >= ADVANCE_TRIES:
            return await engine.reducer.fail(job, f"stage {level} could not advance: {exc}")
        log.info("job %s: stage %d not advanced yet (%s); retrying", job, level, exc)
        raise Retry(defer=ctx.get("job_try", 1) * 5) from None


# A busy stage's lock expires in 30 s; Redis or an endpoint gets a few minutes to come back.
ADVANCE_TRIES = 20


async def ping(ctx: dict[str, Any]) -> str:
    """A trivial arq function: arq needs one, and it lets an operator check a worker answers."""
    return "pong"


SETTINGS = _load_settings()


class WorkerSettings:
    """Read by ``arq``; configured from ``SWARM_*`` environment variables."""

    functions = [
        ping,
        # keep_result=0: the job ID blocks a duplicate only while queued or running; once done,
        # the stage it advanced is recorded and no worker schedules it again.
        func(advance, keep_result=0, max_tries=ADVANCE_TRIES, timeout=SETTINGS.reduce_timeout_s),
    ]
    on_startup = startup
    on_shutdown = shutdown
    redis_settings = dataclasses.replace(
        RedisSettings.from_dsn(SETTINGS.redis_url),
        retry=redis_retry(),
        retry_on_error=RETRY_ON,
        retry_on_timeout=True,
        conn_retries=30,
        ssl_ca_certs=SETTINGS.redis_ca_file or None,
    )
    queue_name = SETTINGS.keys.arq_queue
    health_check_key = SETTINGS.keys.arq_health_check
    job_serializer = job_serializer
    job_deserializer = job_deserializer
    # arq hands a killed worker's job to another after the longest function timeout + 10 s.
    job_timeout = SETTINGS.reduce_timeout_s
    poll_delay = 0.5
