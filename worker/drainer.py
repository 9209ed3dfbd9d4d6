"""One endpoint's drain loop: ``inflight`` slots sharing one consumer name.

A slot takes a batch (see :mod:`worker.intake`), sends it (see :mod:`worker.batch`), and
commits the results and the acks atomically. Because a slot only takes work when it is free,
fast endpoints take more batches than slow ones: no static split, no straggler share. The
endpoint's models decide which jobs it takes; its circuit (:mod:`worker.circuit`) whether it
takes any; its window (:mod:`worker.window`) how many batches it has in flight. A batch of a
more urgent job preempts a lower one in flight; an entry whose workers died running it runs
alone, and past ``max_deliveries`` deaths is dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from common.backoff import backoff_s
from common.errors import (
    BadRecordError,
    EndpointError,
    EndpointUnusable,
    JobGoneError,
    ModelNotServed,
    StoreUnavailable,
    SwarmError,
)
from common.fleet import EndpointInfo, EndpointStats
from common.models import JobSpec, Result
from common.store import Commit
from worker.backend import Backend
from worker.batch import BatchRunner, Tally
from worker.cache import AnswerCache
from worker.circuit import Circuit, GiveUp
from worker.context import DrainContext
from worker.deliveries import Decoded, Triage, dead_letters, decode_deliveries
from worker.figures import EndpointFigures
from worker.inflight import Cancelled, InFlight, Request
from worker.intake import Delivery, Intake, Taken, service_order
from worker.lookout import Lookout
from worker.probe import probe_endpoint
from worker.served import ServedModels
from worker.window import ADAPT_START, Window, follow_load

__all__ = ["EndpointDrainer"]

log = logging.getLogger("swarm.worker")


class _Dropped(Exception):
    """A batch's request was cancelled on purpose (see :class:`~worker.inflight.Cancelled`):
    its batch is released, nothing to commit."""


# How long a slot rests while another looks for work (a safety net: the lookout wakes it).
LOOKOUT_REST_S = 2.0


class EndpointDrainer:
    """The drain loop of one endpoint: ``inflight`` slots sharing one consumer name."""

    def __init__(self, engine: DrainContext, client: Backend) -> None:
        self.engine = engine
        self.client = client
        self.settings = engine.settings
        self.store = engine.store
        self.consumer = f"{self.settings.worker_name}|{client.url}"
        self.fleet_field = f"{self.settings.worker_name}|{client.label}"
        self.served = ServedModels(client, self.settings)
        self.circuit = Circuit(client.label, self.settings.circuit_failures)
        self.runner = BatchRunner(
            client, self.settings, self.circuit, self._backoff, engine.metrics
        )
        self.intake = Intake(self.store, self.consumer, self.settings, client.label, engine.sleep)
        self.cache = AnswerCache(self.store, self.settings, client.label)
        self._rr = 0
        self.window = Window(self.settings.inflight)
        self.figures = EndpointFigures(
            client.label, self.settings.worker_name, self.settings.stats_period_s
        )
        # The requests of its batches in flight, with their job and priority.
        self.inflight = InFlight()
        self._burst_done = False  # burst mode: no work left for this endpoint (_nothing_left)
        # While there is no work, one slot polls for it and the others rest.
        self.lookout = Lookout(rest_s=LOOKOUT_REST_S)

    @property
    def label(self) -> str:
        """The endpoint, as logs and figures name it (its URL, a password masked)."""
        return self.client.label

    def summary(self) -> str:
        """What this drain loop did, in one line (the worker's last words)."""
        f = self.figures
        return (
            f"{self.label}: {f.prompts_done} prompts done, {f.prompts_failed} failed, "
            f"{self.client.requests} requests, {self.runner.retries} retries, {f.preempted} "
            f"prompts preempted, {f.copied} copied at a job's tail ({f.copies_won} first)"
        )

    def reclaim_soon(self, job: str) -> None:
        self.intake.reclaim_soon(job)

    def _count(self, job: str, commit: Commit) -> None:
        self.figures.count(job, commit.done, commit.failed, time.monotonic())
        self.engine.touched.add(job)
        self.engine.metrics.committed(job, self.client.label, commit)

    def info(self, now: float) -> EndpointInfo:
        """This endpoint's row in the fleet registry."""
        return self.figures.info(self.models or (), self.circuit.state, now)

    def stats(self, job: str, now: float, mono: float, *, last: str | None = None) -> EndpointStats:
        """This drainer's figures for ``job``; ``last``: the state of a last word (this worker
        no longer serves the job)."""
        return self.figures.stats(
            job,
            now,
            mono,
            circuit=last if last is not None else self.circuit.state,
            errors=self.circuit.errors,
            last_error=self.circuit.broken or self.circuit.last_error,
            window=self.window.size,
            in_flight=self.window.in_use,
            last=last is not None,
        )

    @property
    def models(self) -> tuple[str, ...] | None:
        """The models the endpoint serves (see :class:`~worker.served.ServedModels`)."""
        return self.served.names

    def serves(self, spec: JobSpec) -> bool:
        return self.served.serves(spec)

    def may_serve(self, spec: JobSpec) -> bool:
        return self.served.may_serve(spec)

    @property
    def broken(self) -> str | None:
        """Why the endpoint can take no work at all, if so (see :class:`Circuit`)."""
        return self.circuit.broken

    # -- loops --------------------------------------------------------------------------

    async def run(self) -> None:
        # No work is taken until the endpoint answers (a vLLM still loading its model).
        self.circuit.hold()
        adapt = self.settings.inflight_max > 0
        slots = max(self.settings.inflight_max, self.settings.inflight)
        if adapt:
            await self.window.resize(ADAPT_START)
        paused = lambda: self.circuit.is_open or self.broken is not None  # noqa: E731
        helpers = [asyncio.create_task(self.served.follow(self.engine.sleep, paused))]
        if adapt:
            helpers.append(asyncio.create_task(self._adapt(slots)))
        try:
            await asyncio.gather(*(self._slot(i) for i in range(slots)))
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.circuit.close()

    async def _adapt(self, hi: int) -> None:
        """Follow the endpoint's load with the window (see :func:`worker.window.follow_load`)."""
        await follow_load(
            self.window,
            self.client.load,
            answered=lambda: self.figures.prompts_done,
            in_flight=lambda: len(self.inflight),
            sleep=self.engine.sleep,
            hi=hi,
            settings=self.settings,
            label=self.client.label,
        )

    async def _slot(self, slot: int) -> None:
        try:
            await self._slot_loop(slot)
        finally:
            self.lookout.leave(slot)

    async def _slot_loop(self, slot: int) -> None:
        while not self.engine.stopping and self.broken is None and not self._burst_done:
            try:
                if self.circuit.is_open:
                    # (at start, the endpoint is probed once before the job list decides)
                    if self.circuit.probed and await self._nothing_left():
                        return
                    await self.circuit.until_closed(
                        self._probe,
                        give_up=self._give_up_probing,
                        sleep=self.engine.sleep,
                        backoff=self._backoff,
                    )
                    continue
                async with self.window.token():
                    # A stop may have come while this slot waited for the window.
                    did = (
                        not self.engine.stopping
                        and not self._burst_done
                        and await self.step(block_ms=self.settings.poll_ms)
                    )
                if did:
                    self.lookout.found(slot)
                    continue
                if await self._nothing_left():
                    return
                await self.lookout.nothing_found(slot)
            except StoreUnavailable as exc:
                # redis-py already retried with backoff; keep trying, slower. A read whose
                # reply was lost left entries pending for us: look for them again.
                log.warning("%s: %s; retrying", self.client.label, exc)
                self.intake.look_again()
                await self.engine.sleep(self._backoff(3))
            except SwarmError as exc:
                # Redis refused something no job or key above explains: say so, go on slower.
                log.warning("%s: %s; continuing", self.client.label, exc)
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
                await self.served.read()
            except EndpointError as exc:
                self.circuit.trip(exc)
                return False
        await self.engine.refresh_jobs()
        try:
            got = await self._next_batch(block_ms)
        except JobGoneError as exc:  # its stream went while this slot read it
            self.engine.job_gone(exc)
            return False
        except BadRecordError as exc:  # a job's key holds another tool's value: skip the job
            self.engine.unreadable(exc)
            return False
        if got is None:
            return False
        await self.process(got.spec, got.deliveries, copy=got.copy)
        return True

    # -- taking work --------------------------------------------------------------------

    async def _next_batch(self, block_ms: int | None) -> Taken | None:
        # Only jobs whose model this endpoint serves (the others wait for endpoints that do),
        # the highest priority first, jobs of equal priority in turn; and while this endpoint
        # runs batches of some priority, nothing below it starts: the engine lightens as the
        # lower work finishes, and the urgent prompts decode faster.
        top = self.inflight.top_priority()
        specs = {
            job: spec
            for job, spec in list(self.engine.jobs.items())
            if self.serves(spec) and (top is None or spec.priority >= top)
        }
        jobs = service_order([(job, spec.priority) for job, spec in specs.items()], self._rr)
        self._rr += 1
        return await self.intake.next([specs[j] for j in jobs], block_ms, idle=not self.inflight)

    # -- doing work ---------------------------------------------------------------------

    async def process(
        self, spec: JobSpec, deliveries: list[Delivery], *, copy: bool = False
    ) -> None:
        """Finish one batch of ``spec``'s job, each entry by how many workers died running it
        (see :class:`~worker.deliveries.Triage`). A release (a failing endpoint, a model not
        served) or a restart taking back its own batches is no death: only a run that never
        finished is. A speculative ``copy`` runs like any batch: the heartbeat and a release act
        only on entries this consumer holds, so on a copy they do nothing. Every write carries
        the generation of ``spec``: if the job is gone (deleted, lost, queued again under its
        name), the batch is dropped and the engine told, once."""
        job = spec.job
        sorted_ = Triage(deliveries, self.settings.max_deliveries)
        ids = [eid for eid, _, _ in deliveries]
        # Everything taken stays ours until done: refreshed claims, and never restarted by a
        # sibling slot's reclaim while it waits for its turn here.
        heartbeat = asyncio.create_task(self._keep_claimed(spec, ids))
        self.intake.in_hand.update(ids)
        self.figures.job(job, time.monotonic())  # its rate counts from its first batch
        try:
            if sorted_.dead:
                await self._dead_letter(spec, sorted_.dead)
            if sorted_.fresh:
                await self._run_batch(spec, sorted_.fresh, copy=copy)
            for suspect in sorted_.suspects:
                await self._run_batch(spec, [suspect])
        except JobGoneError as exc:
            # Entries read under a stale spec belong to the job that holds the name now: this
            # consumer takes them back once the engine has read that job.
            self.engine.job_gone(exc, spec)
            self.intake.look_again()
        except BadRecordError as exc:
            # A key of the job holds another tool's value: its entries stay pending here,
            # taken back if the job is read again; no other job waits on it.
            self.engine.unreadable(exc)
            self.intake.look_again()
        finally:
            heartbeat.cancel()
            self.intake.in_hand.difference_update(ids)

    async def _dead_letter(self, spec: JobSpec, dead: list[Delivery]) -> None:
        results = dead_letters(dead, self.client.label)
        commit = await self._commit(spec, results)
        self.figures.dead_lettered += commit.failed
        self._count(spec.job, commit)
        log.warning(
            "%s: dead-lettered %d entries of job %s", self.client.label, len(dead), spec.job
        )

    async def _run_batch(
        self, spec: JobSpec, deliveries: list[Delivery], *, copy: bool = False
    ) -> None:
        """Complete one batch and commit it, in steps: answers from the cache, the request for
        the rest, the commit, the answers kept. On giving up, the batch is released to other
        workers. A ``copy`` is not marked as running (its run is no entry's death) and
        preempts nothing."""
        ids = [eid for eid, _, _ in deliveries]
        items, results = decode_deliveries(deliveries, self.client.label)
        validator = self.engine.validator(spec)
        keys: list[str | None] = []  # the cache's keys of the answers to come, if it is used
        if items and spec.cache:
            hits, items, keys = await self.cache.answered(spec, items)
            results += [(e, validator.checked(r) if validator else r, p) for e, r, p in hits]
        tally = Tally()
        sent: list[Result] = []
        if items:
            try:
                sent = await self._send(spec, deliveries, items, tally, copy=copy)
            except (GiveUp, EndpointUnusable, ModelNotServed) as exc:
                cause = exc.cause if isinstance(exc, GiveUp) else exc
                await self._release(spec, ids, cause, self.served.model_for(spec))
                return
            except _Dropped:
                return
            if validator is not None:
                sent = [validator.checked(r) for r in sent]
            results += [(eid, r, payload) for (eid, payload, _), r in zip(items, sent, strict=True)]
        # Shielded: once results exist, finishing the (atomic) commit beats redoing them.
        commit = await self._commit(spec, results, tally.prompt_tokens, tally.completion_tokens)
        self._count(spec.job, commit)
        if keys and sent:
            await self.cache.keep(keys, sent)
        if copy:
            self.figures.copied += len(ids)
            self.figures.copies_won += commit.done + commit.failed

    async def _send(
        self,
        spec: JobSpec,
        deliveries: list[Delivery],
        items: list[Decoded],
        tally: Tally,
        *,
        copy: bool,
    ) -> list[Result]:
        """The endpoint's results for ``items``, in order: marked running (unless a copy),
        a lower batch preempted, then one request. :class:`_Dropped` when it was cancelled on
        purpose (preempted, or its job is over): its batch is released, no death."""
        job, gen = spec.job, spec.generation
        request: Request | None = None
        try:
            if not copy:
                deaths = {eid: n for eid, _, n in deliveries}
                await self.store.start(job, {eid: deaths[eid] for eid, _, _ in items}, gen=gen)
                self.inflight.preempt_below(spec.priority, job, self.engine.shares.get(job, 0))
            model = self.served.model_for(spec)
            if model is None:
                raise ModelNotServed(self.client.label, "serves no model")
            self.figures.job(job, time.monotonic()).model = model
            request = self.inflight.start(
                self.runner.run(spec, [it for _, _, it in items], model, tally), spec.priority, job
            )
            return await request
        except asyncio.CancelledError:
            # Preempted by a batch of a more urgent job, its job over, or stopped past the
            # grace period: the batch goes back, and its run is no death.
            ids = [eid for eid, _, _ in deliveries]
            with contextlib.suppress(StoreUnavailable, JobGoneError):
                await asyncio.shield(self.store.release(job, self.consumer, ids, gen=gen))
            why = self.inflight.why(request)
            if why is None:
                raise
            if why is Cancelled.PREEMPTED:
                self.figures.preempted += len(ids)
            log.debug("%s: %s %d prompts of job %s", self.client.label, why, len(ids), job)
            raise _Dropped from None
        finally:
            if request is not None:
                self.inflight.remove(request)

    def abandon(self, job: str) -> None:
        """``job`` is over (finished, cancelled or gone): cut its requests still in flight
        short. Their answers could change nothing (each prompt has its result, or the job is
        no more), and a stalled endpoint's would hold its slots, and a burst worker, until
        the request timed out."""
        self.inflight.abandon(job)

    async def _commit(
        self,
        spec: JobSpec,
        results: list[tuple[bytes, Result, bytes | None]],
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> Commit:
        """Commit, retrying through a Redis outage: the results are computed and the commit is
        idempotent (first write wins), so keeping them beats redoing the batch. Shielded, so a
        cancellation does not cut a commit short either. :class:`JobGoneError` when the job is
        no longer of ``spec``'s generation: nothing was written."""
        attempt = 0
        while True:
            try:
                return await asyncio.shield(
                    self.store.commit(
                        spec.job, results, prompt_tokens, completion_tokens, gen=spec.generation
                    )
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

    async def _keep_claimed(self, spec: JobSpec, ids: list[bytes]) -> None:
        """Refresh our claim on a long batch so no other worker takes it as orphaned (a job
        gone meanwhile has nothing left to claim: its batch learns so at its commit)."""
        period = self.settings.claim_idle_ms / 3000
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(StoreUnavailable, JobGoneError):
                await self.store.touch(spec.job, self.consumer, ids, gen=spec.generation)

    async def _release(
        self, spec: JobSpec, ids: list[bytes], cause: EndpointError, model: str | None
    ) -> None:
        """Give up a batch: hand back the entries still ours, and record what the failure
        says about the endpoint or the job's model."""
        job = spec.job
        with contextlib.suppress(StoreUnavailable):
            await self.store.release(job, self.consumer, ids, gen=spec.generation)
        self.engine.reclaim_soon(job)  # this worker's other endpoints take them at once
        if isinstance(cause, ModelNotServed):
            # The job's trouble, not the endpoint's: stop taking the job until the served
            # models, re-read soon, say otherwise.
            if self.served.refused(model):
                log.warning(
                    "%s: does not serve model %r (%s); job %s is left to endpoints that do",
                    self.client.label,
                    model,
                    cause.message,
                    job,
                )
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
        await probe_endpoint(
            self.client,
            self.served,
            timeout_s=self.settings.probe_timeout_s,
            generate=self.circuit.was_ready,
        )

    async def _nothing_left(self) -> bool:
        """In burst mode: True once no work this endpoint can do is left. The first slot to
        find so ends them all (the others would each wait out an empty poll in turn)."""
        if (
            not self._burst_done
            and self.engine.burst
            and not await self.engine.any_work(self.may_serve)
        ):
            self._burst_done = True
            self.lookout.wake()
        return self._burst_done

    async def _give_up_probing(self) -> bool:
        return await self._nothing_left()

    def _backoff(self, attempt: int) -> float:
        return backoff_s(
            attempt,
            base_s=self.settings.backoff_base_s,
            cap_s=self.settings.backoff_cap_s,
            rand=self.engine.rand,
        )
