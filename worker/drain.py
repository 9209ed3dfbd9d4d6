"""The drain engine: one loop per endpoint, several batches in flight, every job served.

Each endpoint's :class:`EndpointDrainer` runs ``inflight`` slots. A slot takes a batch (its own
unacknowledged leftovers first, then entries orphaned by dead workers, then new entries), sends
ONE list-prompt ``/v1/completions`` request, maps the choices by ``choice.index`` and commits
the results and the acks atomically. Because a slot only takes work when it is free, fast
endpoints take more batches than slow ones: no static split, no straggler share.

Failures: transient errors are retried with capped, jittered backoff; a batch the server rejects
(HTTP 400, e.g. one prompt over the context) is bisected so only the offending prompts fail;
an endpoint that keeps failing releases its batches to other workers at once and is probed
until it answers again (a circuit breaker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from msgspec.structs import replace

from common.backoff import backoff_s
from common.errors import (
    BadRecordError,
    ConfigError,
    EndpointError,
    EndpointRejected,
    EndpointRetryable,
    EndpointUnusable,
    JobNotFoundError,
    ModelNotServed,
    StoreUnavailable,
    SwarmError,
)
from common.models import (
    EndpointInfo,
    EndpointStats,
    JobSpec,
    PromptItem,
    Result,
    SamplingParams,
)
from common.schema import AnswerValidator
from common.settings import Settings
from common.store import Commit, JobStore, decode_entry, index_of
from worker.batch import BatchRunner, Tally
from worker.circuit import Circuit, GiveUp
from worker.endpoint import EndpointClient
from worker.intake import Delivery, Intake, service_order
from worker.reduce import Reducer, StageBusy
from worker.window import ADAPT_START, Window, follow_load

__all__ = ["EndpointDrainer", "Engine"]

log = logging.getLogger("swarm.worker")

# An entry that this many workers died running is suspected of killing them: it runs alone.
SUSPECT_DEATHS = 2

# After a 404 for a model, the served models are re-read this much later at the soonest: a
# server that lists a model it then refuses costs one request per job this often, no more.
MODELS_RECHECK_S = 5.0

T = TypeVar("T")


# The span (s) over which the published per-endpoint rate is measured.
RATE_SPAN_S = 10.0


class _JobCount:
    """One drainer's prompts finished for one job, with recent samples for a rate."""

    __slots__ = ("done", "failed", "samples")

    def __init__(self, start: float) -> None:
        self.done = 0
        self.failed = 0
        self.samples: deque[tuple[float, int]] = deque([(start, 0)])

    def rate(self, now: float) -> float:
        """Prompts per second over the last :data:`RATE_SPAN_S` (sampled at each publish)."""
        self.samples.append((now, self.done + self.failed))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_SPAN_S:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class Engine:
    """Serves every active job from every configured endpoint until stopped (or idle, in burst)."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        clients: list[EndpointClient] | None = None,
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.store = store
        self.rand = rand
        if clients is None:
            clients = [
                EndpointClient(e.url, settings.api_key, timeout_s=settings.request_timeout_s or 600)
                for e in settings.endpoints
            ]
        if not clients:
            raise ConfigError("no endpoints: set SWARM_ENDPOINTS or SWARM_HOSTFILE")
        self.drainers = [EndpointDrainer(self, c) for c in clients]
        self.reducer = Reducer(store, clients, settings.reduce_functions)
        # Called with (job, level) whenever a job's stage ``level`` is seen finished with its
        # reduce not yet advanced; by default advances it here, in the background. The arq
        # worker replaces it with queuing one arq job per (job, level).
        self.on_stage_done: Callable[[str, int], Awaitable[None]] = self.advance_here
        self._advancing: dict[tuple[str, int], asyncio.Task[str]] = {}
        self._reduces_pending = False
        self._validators: dict[str, AnswerValidator] = {}
        self.jobs: dict[str, JobSpec] = {}
        # Per urgent job, the batches one endpoint may start by preemption (see _fair_shares).
        self.shares: dict[str, int] = {}
        self._unreadable: set[str] = set()  # jobs whose spec cannot be read, logged once
        self._refreshed_at = -math.inf
        self._refresh_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        # Jobs with prompts finished since the last publish of the endpoint figures, and the
        # jobs that publish reported as served.
        self.touched: set[str] = set()
        self._published: set[str] = set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_stop(self) -> None:
        """Stop taking work; batches in flight still finish and commit."""
        if not self._stopping.is_set():
            log.info("stopping: finishing batches in flight, taking no new work")
        self._stopping.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep, but wake early on stop; returns True if stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        return self.stopping

    async def refresh_jobs(self, *, force: bool = False) -> None:
        """Pick up new jobs and drop finished ones, at most every ``jobs_refresh_s``."""
        if not force and time.monotonic() - self._refreshed_at < self.settings.jobs_refresh_s:
            return
        async with self._refresh_lock:
            if not force and time.monotonic() - self._refreshed_at < self.settings.jobs_refresh_s:
                return
            names = await self.store.list_jobs()
            unfinished = await self.store.unfinished(names)
            for name in unfinished:
                if name not in self.jobs:
                    try:
                        self.jobs[name] = await self.store.load_spec(name)
                    except JobNotFoundError:
                        continue  # registered but its spec is gone (deleted meanwhile)
                    except BadRecordError as exc:  # never fatal to the other jobs
                        if name not in self._unreadable:
                            self._unreadable.add(name)
                            log.error("skipping job %s: %s", name, exc)
                        continue
                    await self.store.ensure_group(name)
                    log.info("serving job %s", name)
            for name in list(self.jobs):
                if name not in unfinished:
                    del self.jobs[name]
                    log.info("job %s finished", name)
            pending = await self.store.reduces_pending(names)
            # A stage still running is work of its own stage job; only a finished stage waits
            # on the reduce itself.
            self._reduces_pending = any(finished for _, _, finished in pending)
            self.shares = await self._fair_shares()
            for job, level, finished in pending:
                if finished:
                    try:
                        await self.on_stage_done(job, level)
                    except SwarmError as exc:
                        log.warning("job %s: cannot advance stage %d yet: %s", job, level, exc)
            self._refreshed_at = time.monotonic()

    async def _fair_shares(self) -> dict[str, int]:
        """For each job above the lowest priority served: how many of its batches one endpoint
        may start by preempting lower ones, its fair share over the live endpoints serving its
        model. (Without it, the first worker to see an urgent job would take all of it: each
        preempted slot takes the next urgent batch at once.)"""
        specs = list(self.jobs.values())
        if len({s.priority for s in specs}) < 2:
            return {}
        lowest = min(s.priority for s in specs)
        fleet = await self.store.read_fleet()
        now = time.time()
        shares = {}
        for spec in specs:
            if spec.priority == lowest:
                continue
            serving = sum(
                1
                for e in fleet
                if e.live(now) and e.circuit != "broken" and (spec.model in (None, *e.models))
            )
            serving = max(serving, sum(d.serves(spec) for d in self.drainers), 1)
            batches = -(-(await self.store.enqueued_count(spec.job)) // self.settings.batch_size)
            shares[spec.job] = max(1, -(-batches // serving))
        return shares

    def validator(self, spec: JobSpec) -> AnswerValidator | None:
        """The answer validator of ``spec``'s schema, built once per job (None: no schema)."""
        if spec.schema is None:
            return None
        if spec.job not in self._validators:
            self._validators[spec.job] = AnswerValidator(spec.schema)
        return self._validators[spec.job]

    async def advance_here(self, job: str, level: int) -> None:
        """Advance ``job``'s finished stage ``level`` in this process, in the background."""
        key = (job, level)
        if key in self._advancing and not self._advancing[key].done():
            return
        task = asyncio.create_task(self.reducer.advance(job, level), name=f"advance {job}")
        self._advancing[key] = task

        def done(t: asyncio.Task[str]) -> None:
            self._advancing.pop(key, None)
            exc = None if t.cancelled() else t.exception()
            if exc is not None:  # the next sweep tries again
                log.log(
                    logging.DEBUG if isinstance(exc, StageBusy) else logging.WARNING,
                    "job %s: stage %d not advanced yet: %s",
                    job,
                    level,
                    exc,
                )

        task.add_done_callback(done)

    def reclaim_soon(self, job: str) -> None:
        """Released entries wait: every drainer of this worker looks for them on its next step."""
        for d in self.drainers:
            d.reclaim_soon(job)

    async def any_work(self, drainer: EndpointDrainer | None = None) -> bool:
        """True while some job (that ``drainer``'s endpoint may serve) still has entries queued
        or in flight, is still being fed, or has a finished stage whose reduce is to run."""
        await self.refresh_jobs(force=True)
        if self._reduces_pending:
            return True
        for job, spec in list(self.jobs.items()):
            if drainer is not None and not drainer.may_serve(spec):
                continue
            if await self.store.job_has_work(job):
                return True
        return False

    def unserved(self) -> list[JobSpec]:
        """The jobs no endpoint of this worker serves: left for other workers' endpoints."""
        return [s for s in list(self.jobs.values()) if not any(d.serves(s) for d in self.drainers)]

    async def run(self, *, burst: bool = False) -> None:
        """Drain until stopped; with ``burst``, return once no job has work left."""
        await self.refresh_jobs(force=True)
        publisher = asyncio.create_task(self._publish_loop(), name="swarm-stats")
        try:
            await asyncio.gather(*(d.run(burst=burst) for d in self.drainers))
            if burst and not self.stopping:
                left = [
                    f"{s.job} ({f'model {s.model!r}' if s.model else 'any model'})"
                    for s in self.unserved()
                    if await self.store.job_has_work(s.job)
                ]
                if left:
                    log.info(
                        "burst: no work left that these endpoints serve; waiting for other "
                        "endpoints: %s",
                        ", ".join(left),
                    )
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
            with contextlib.suppress(SwarmError):  # the last word: this worker has stopped
                await self.publish_stats(stopped=True)

    @property
    def broken(self) -> list[str]:
        """Why each endpoint that can take no work at all (wrong key, not an OpenAI server) is
        unusable: the reason a burst worker exits with a failure."""
        return [d.broken for d in self.drainers if d.broken is not None]

    async def publish_stats(self, *, stopped: bool = False) -> None:
        """Publish every drainer's figures for ``swarm-status``: for the jobs served now, and
        a last word (``finished``, or ``stopped`` when this worker exits) for the jobs left;
        and each endpoint's served models in the fleet registry (taken out on stop)."""
        now = time.time()
        if stopped:
            await self.store.publish_fleet([], gone=[d.fleet_field for d in self.drainers])
        else:
            await self.store.publish_fleet([d.info(now) for d in self.drainers])
        live = set() if stopped else set(self.jobs)
        left = (self._published | self.touched) - live
        self.touched = set()
        self._published = live
        if not (live or left):
            return
        word = "stopped" if stopped else "finished"
        mono = time.monotonic()
        await self.store.publish_endpoints(
            {
                job: {
                    d.consumer: d.stats(job, now, mono, last=None if job in live else word)
                    for d in self.drainers
                }
                for job in live | left
            }
        )

    async def _publish_loop(self) -> None:
        while not await self.sleep(self.settings.stats_period_s):
            try:
                await self.publish_stats()
            except SwarmError as exc:  # figures only: the work goes on without them
                log.debug("endpoint figures not published: %s", exc)

    async def close(self) -> None:
        for task in list(self._advancing.values()):
            task.cancel()
        await asyncio.gather(*self._advancing.values(), return_exceptions=True)
        for d in self.drainers:
            await d.client.close()


class EndpointDrainer:
    """The drain loop of one endpoint: ``inflight`` slots sharing one consumer name."""

    def __init__(self, engine: Engine, client: EndpointClient) -> None:
        self.engine = engine
        self.client = client
        self.settings = engine.settings
        self.store = engine.store
        self.consumer = f"{self.settings.worker_name}|{client.url}"
        self.fleet_field = f"{self.settings.worker_name}|{client.label}"
        # The models the endpoint serves, as /v1/models lists them (base model first, then
        # LoRA adapters); None until it has answered once.
        self.models: tuple[str, ...] | None = None
        self._models_stale = asyncio.Event()
        self.circuit = Circuit(client.label, self.settings.circuit_failures)
        self.runner = BatchRunner(client, self.settings, self.circuit, self._backoff)
        self.intake = Intake(self.store, self.consumer, self.settings, client.label, engine.sleep)
        self._rr = 0
        self.window = Window(self.settings.inflight)
        self.prompts_done = 0
        self.prompts_failed = 0
        # Prompts whose batch was cancelled for a more urgent job's, released to run again.
        self.preempted = 0
        # Batches in flight (their request work) and their job's priority, oldest first.
        self._running: dict[asyncio.Task[list[Result]], tuple[int, str]] = {}
        self._preempted: set[asyncio.Task[list[Result]]] = set()
        self.dead_lettered = 0
        self._counts: dict[str, _JobCount] = {}

    def reclaim_soon(self, job: str) -> None:
        self.intake.reclaim_soon(job)

    def _job_count(self, job: str, now: float) -> _JobCount:
        count = self._counts.get(job)
        if count is None:
            count = self._counts[job] = _JobCount(now)
        return count

    def _count(self, job: str, commit: Commit) -> None:
        self.prompts_done += commit.done
        self.prompts_failed += commit.failed
        count = self._job_count(job, time.monotonic())
        count.done += commit.done
        count.failed += commit.failed
        self.engine.touched.add(job)

    def serves(self, spec: JobSpec) -> bool:
        """True when this endpoint takes work of ``spec``'s job: it serves the job's model (a
        job without one takes the endpoint's own)."""
        if not self.models:
            return False
        return spec.model is None or spec.model in self.models

    def may_serve(self, spec: JobSpec) -> bool:
        """Like :meth:`serves`, but True while the served models are not yet known."""
        return self.models is None or self.serves(spec)

    def info(self, now: float) -> EndpointInfo:
        """This endpoint's row in the fleet registry."""
        return EndpointInfo(
            endpoint=self.client.label,
            worker=self.settings.worker_name,
            models=self.models or (),
            circuit=self.circuit.state,
            updated_s=now,
            period_s=self.settings.stats_period_s,
        )

    def stats(self, job: str, now: float, mono: float, *, last: str | None = None) -> EndpointStats:
        """This drainer's figures for ``job`` (see :class:`EndpointStats`); ``last``: the
        state of a last word (this worker no longer serves the job)."""
        count = self._job_count(job, mono)
        circuit = last if last is not None else self.circuit.state
        return EndpointStats(
            endpoint=self.client.label,
            worker=self.settings.worker_name,
            circuit=circuit,
            done=count.done,
            failed=count.failed,
            errors=self.circuit.errors,
            last_error=self.circuit.broken or self.circuit.last_error,
            rate_per_s=0.0 if last else count.rate(mono),
            window=self.window.size,
            in_flight=0 if last else self.window.in_use,
            updated_s=now,
            period_s=self.settings.stats_period_s,
        )

    @property
    def circuit_open(self) -> bool:
        return self.circuit.is_open

    @property
    def broken(self) -> str | None:
        """Why the endpoint can take no work at all, if so (see :class:`Circuit`)."""
        return self.circuit.broken

    @property
    def errors(self) -> int:
        return self.circuit.errors

    @property
    def last_error(self) -> str:
        return self.circuit.last_error

    @property
    def retries(self) -> int:
        return self.runner.retries

    @property
    def requests(self) -> int:
        """Generation requests sent to the endpoint (probes included), as the client counts
        them where they are sent."""
        return self.client.requests

    # -- loops --------------------------------------------------------------------------

    async def run(self, *, burst: bool = False) -> None:
        # No work is taken until the endpoint answers (a vLLM still loading its model).
        self.circuit.hold()
        adapt = self.settings.inflight_max > 0
        slots = max(self.settings.inflight_max, self.settings.inflight)
        if adapt:
            await self.window.resize(ADAPT_START)
        helpers = [asyncio.create_task(self._follow_models())]
        if adapt:
            helpers.append(asyncio.create_task(self._adapt(slots)))
        try:
            await asyncio.gather(*(self._slot(burst) for _ in range(slots)))
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.circuit.close()

    async def _follow_models(self) -> None:
        """Re-read the served models every ``models_refresh_s``, and soon after a 404 for a
        model (an adapter unloaded, the server restarted with another model)."""
        while not self.engine.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._models_stale.wait(), self.settings.models_refresh_s)
            if self._models_stale.is_set() and await self.engine.sleep(MODELS_RECHECK_S):
                return
            self._models_stale.clear()
            if self.circuit.is_open or self.broken is not None:
                continue  # the probe reads them when the endpoint answers again
            try:
                await self._read_models()
            except EndpointError as exc:  # requests will tell if the endpoint is in trouble
                log.debug("%s: served models not re-read: %s", self.client.label, exc)

    async def _read_models(self) -> None:
        infos = await self.client.models(timeout_s=self.settings.probe_timeout_s)
        models = tuple(m.id for m in infos)
        if not models:
            raise EndpointRetryable(self.client.label, "serves no model (/v1/models is empty)")
        if models != self.models:
            log.info("%s: serves %s", self.client.label, ", ".join(models))
            self.models = models

    async def _adapt(self, hi: int) -> None:
        """Follow the endpoint's load with the window (see :func:`worker.window.follow_load`)."""
        await follow_load(
            self.window,
            self.client.load,
            answered=lambda: self.prompts_done,
            sleep=self.engine.sleep,
            hi=hi,
            settings=self.settings,
            label=self.client.label,
        )

    async def _slot(self, burst: bool) -> None:
        while not self.engine.stopping and self.broken is None:
            try:
                if self.circuit.is_open:
                    # (at start, the endpoint is probed once before the job list decides)
                    if burst and self.circuit.probed and not await self.engine.any_work(self):
                        return
                    await self.circuit.until_closed(
                        self._probe,
                        give_up=lambda: self._give_up_probing(burst),
                        sleep=self.engine.sleep,
                        backoff=self._backoff,
                    )
                    continue
                async with self.window.token():
                    # A stop may have come while this slot waited for the window.
                    did = not self.engine.stopping and await self.step(
                        block_ms=self.settings.poll_ms
                    )
                if did:
                    continue
                if burst and not await self.engine.any_work(self):
                    return
            except StoreUnavailable as exc:
                # redis-py already retried with backoff; keep trying, slower. A read whose
                # reply was lost left entries pending for us: look for them again.
                log.warning("%s: %s; retrying", self.client.label, exc)
                self.intake.look_again()
                await self.engine.sleep(self._backoff(3))
            except Exception:
                # A bug or an unforeseen answer must not silently kill a slot in a days-long
                # run: log it loudly and carry on; unacked work is reclaimed as usual.
                log.exception("%s: unexpected error in drain loop; continuing", self.client.label)
                await self.engine.sleep(self._backoff(3))

    async def step(self, block_ms: int | None = None) -> bool:
        """Take one batch and finish it; False when there was nothing to take. Takes nothing
        while the circuit is open: a slot that was waiting for the window when it opened would
        otherwise take back the batches its siblings had just released."""
        if self.circuit.is_open or self.broken is not None:
            return False
        if self.models is None:  # a step taken outside run(), whose probe reads them
            try:
                await self._read_models()
            except EndpointError as exc:
                self.circuit.trip(exc)
                return False
        await self.engine.refresh_jobs()
        got = await self._next_batch(block_ms)
        if got is None:
            return False
        await self.process(*got)
        return True

    # -- taking work --------------------------------------------------------------------

    async def _next_batch(self, block_ms: int | None) -> tuple[str, list[Delivery]] | None:
        # Only jobs whose model this endpoint serves (the others wait for endpoints that do),
        # the highest priority first, jobs of equal priority in turn; and while this endpoint
        # runs batches of some priority, nothing below it starts: the engine lightens as the
        # lower work finishes, and the urgent prompts decode faster.
        top = max((p for p, _ in self._running.values()), default=None)
        served = [
            (job, spec.priority)
            for job, spec in list(self.engine.jobs.items())
            if self.serves(spec) and (top is None or spec.priority >= top)
        ]
        jobs = service_order(served, self._rr)
        self._rr += 1
        return await self.intake.next(jobs, block_ms)

    # -- doing work ---------------------------------------------------------------------

    async def process(self, job: str, deliveries: list[Delivery]) -> None:
        """Finish one batch, each entry by how many workers died running it. One death is
        usually innocent (a walltime, a node lost) and runs as usual; from
        :data:`SUSPECT_DEATHS` on, the entry runs alone, one after another, so that a prompt
        that kills workers cannot take its neighbours with it; past ``max_deliveries`` deaths
        it is dead-lettered. A release (a failing endpoint, a model not served) or a restart
        taking back its own batches is no death: only a run that never finished is."""
        limit = self.settings.max_deliveries
        dead = [d for d in deliveries if d[2] > limit]
        fresh = [d for d in deliveries if d[2] < SUSPECT_DEATHS]
        suspects = [d for d in deliveries if SUSPECT_DEATHS <= d[2] <= limit]
        ids = [eid for eid, _, _ in deliveries]
        # Everything taken stays ours until done: refreshed claims, and never restarted by a
        # sibling slot's reclaim while it waits for its turn here.
        heartbeat = asyncio.create_task(self._keep_claimed(job, ids))
        self.intake.in_hand.update(ids)
        self._job_count(job, time.monotonic())  # its rate counts from its first batch
        try:
            if dead:
                await self._dead_letter(job, dead)
            if fresh:
                await self._run_batch(job, fresh)
            for suspect in suspects:
                await self._run_batch(job, [suspect])
        finally:
            heartbeat.cancel()
            self.intake.in_hand.difference_update(ids)

    async def _dead_letter(self, job: str, dead: list[Delivery]) -> None:
        results = [
            (
                eid,
                Result(
                    index=index_of(eid),
                    endpoint=self.client.label,
                    error=f"dead-lettered: {n} workers died running it (a prompt that "
                    "kills workers?)",
                    error_kind="dead_letter",
                ),
                payload,
            )
            for eid, payload, n in dead
        ]
        commit = await self._commit(job, results)
        self.dead_lettered += commit.failed
        self._count(job, commit)
        log.warning("%s: dead-lettered %d entries of job %s", self.client.label, len(dead), job)

    async def _run_batch(self, job: str, deliveries: list[Delivery]) -> None:
        """Complete one batch and commit it; on giving up, release it to other workers."""
        spec = self.engine.jobs.get(job) or await self.store.load_spec(job)
        ids = [eid for eid, _, _ in deliveries]
        results: list[tuple[bytes, Result, bytes | None]] = []
        items: list[tuple[bytes, bytes | None, PromptItem]] = []
        for eid, payload, _ in deliveries:
            decoded = decode_entry(eid, payload)
            if isinstance(decoded, str):
                bad = Result(
                    index=index_of(eid),
                    endpoint=self.client.label,
                    error=decoded,
                    error_kind="bad_entry",
                )
                results.append((eid, bad, payload))
            else:
                items.append((eid, payload, decoded))
        tally = Tally()
        work: asyncio.Task[list[Result]] | None = None
        try:
            if items:
                await self.store.start(job, [eid for eid, _, _ in items])
                self._preempt_below(spec.priority, job)
                model = self._model_for(spec)
                if model is None:
                    raise ModelNotServed(self.client.label, "serves no model")
                request = self.runner.run(spec, [it for _, _, it in items], model, tally)
                work = asyncio.create_task(request)
                self._running[work] = (spec.priority, job)
                done = await work
                validator = self.engine.validator(spec)
                if validator is not None:
                    done = [self._checked(r, validator) for r in done]
                for (eid, payload, _), result in zip(items, done, strict=True):
                    results.append((eid, result, payload))
        except (GiveUp, EndpointUnusable, ModelNotServed) as exc:
            cause = exc.cause if isinstance(exc, GiveUp) else exc
            await self._release(job, ids, cause, self._model_for(spec))
            return
        except asyncio.CancelledError:
            # Preempted by a batch of a more urgent job, or stopped past the grace period:
            # the batch goes back, and its run is no death.
            with contextlib.suppress(StoreUnavailable):
                await asyncio.shield(self.store.release(job, self.consumer, ids))
            if work is not None and work in self._preempted:
                self.preempted += len(ids)
                log.debug("%s: preempted %d prompts of job %s", self.client.label, len(ids), job)
                return
            raise
        finally:
            if work is not None:
                self._running.pop(work, None)
                self._preempted.discard(work)
        # Shielded: once results exist, finishing the (atomic) commit beats redoing them.
        commit = await self._commit(job, results, tally.prompt_tokens, tally.completion_tokens)
        self._count(job, commit)

    def _preempt_below(self, priority: int, job: str) -> None:
        """A batch of ``priority`` starts: cancel the newest batch in flight of a lower
        priority, if any, so the engine gives its slots to the urgent prompts now rather than
        after the lower ones (as vLLM's own priority scheduling does). The newest has done
        the least work; one for one, so the engine's load stays the same. (The window keeps
        the engine just full, and its gauges lag by a period: whether this batch would have
        found free slots cannot be known, so the trade is always made; it costs at most one
        lower batch's progress per urgent batch.) Only up to the job's fair share of batches on
        this endpoint: the rest are for the other endpoints."""
        mine = sum(1 for _, j in self._running.values() if j == job)
        if mine >= self.engine.shares.get(job, 0):
            return
        lower = [
            w for w, (p, _) in self._running.items() if p < priority and w not in self._preempted
        ]
        if lower:
            victim = lower[-1]  # dicts keep insertion order: the newest last
            self._preempted.add(victim)
            victim.cancel()

    async def _commit(
        self,
        job: str,
        results: list[tuple[bytes, Result, bytes | None]],
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> Commit:
        """Commit, retrying through a Redis outage: the results are computed and the commit is
        idempotent (first write wins), so keeping them beats redoing the batch. Shielded, so a
        cancellation does not cut a commit short either."""
        attempt = 0
        while True:
            try:
                return await asyncio.shield(
                    self.store.commit(job, results, prompt_tokens, completion_tokens)
                )
            except StoreUnavailable as exc:
                attempt += 1
                log.warning(
                    "%s: commit of %d results waits for Redis (%s)",
                    self.client.label,
                    len(results),
                    exc,
                )
                await asyncio.sleep(self._backoff(attempt))

    async def _keep_claimed(self, job: str, ids: list[bytes]) -> None:
        """Refresh our claim on a long batch so no other worker takes it as orphaned."""
        period = self.settings.claim_idle_ms / 3000
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(StoreUnavailable):
                await self.store.touch(job, self.consumer, ids)

    async def _release(
        self, job: str, ids: list[bytes], cause: EndpointError, model: str | None
    ) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.release(job, self.consumer, ids)
        self.engine.reclaim_soon(job)  # this worker's other endpoints take them at once
        if isinstance(cause, ModelNotServed):
            # The job's trouble, not the endpoint's: stop taking the job until the served
            # models, re-read soon, say otherwise.
            if self.models is not None and model in self.models:
                self.models = tuple(m for m in self.models if m != model)
                log.warning(
                    "%s: does not serve model %r (%s); job %s is left to endpoints that do",
                    self.client.label,
                    model,
                    cause.message,
                    job,
                )
            self._models_stale.set()
            return
        if isinstance(cause, EndpointUnusable):
            self.circuit.broken = str(cause)
            log.error(
                "%s: endpoint unusable, no more work taken from it: %s", self.client.label, cause
            )
            return
        log.warning(
            "%s: released %d entries to other workers (%s)", self.client.label, len(ids), cause
        )
        self.circuit.trip(cause)

    async def _probe(self) -> None:
        """One probe of the endpoint: /health, its models, and (after failures: a hung engine
        still answers those) one generated token. Raises an EndpointError while it cannot work."""
        if not await self.client.ready(self.settings.probe_timeout_s):
            raise EndpointRetryable(self.client.label, "/health not ready")
        await self._read_models()
        if self.circuit.was_ready:
            await self._probe_generation()

    async def _give_up_probing(self, burst: bool) -> bool:
        return burst and not await self.engine.any_work(self)

    async def _probe_generation(self) -> None:
        """One token of one prompt, within the probe timeout: the endpoint really generates.
        A refusal is an answer too (the server is alive); a timeout or 5xx is not."""
        assert self.models
        with contextlib.suppress(EndpointRejected, ModelNotServed):
            await self.client.complete(
                self.models[0],
                ["ping"],
                SamplingParams(max_tokens=1),
                timeout_s=self.settings.probe_timeout_s,
            )

    def _backoff(self, attempt: int) -> float:
        return backoff_s(
            attempt,
            base_s=self.settings.backoff_base_s,
            cap_s=self.settings.backoff_cap_s,
            rand=self.engine.rand,
        )

    def _model_for(self, spec: JobSpec) -> str | None:
        """The model to ask for: the job's, else the endpoint's own (the first it lists)."""
        return spec.model or (self.models[0] if self.models else None)

    @staticmethod
    def _checked(r: Result, validator: AnswerValidator) -> Result:
        """``r`` failed with kind ``schema`` if its text does not match; the text is kept."""
        if not r.ok:
            return r
        reason = validator.error(r.text or "")
        if reason is None:
            return r
        return replace(r, error=reason, error_kind="schema")
