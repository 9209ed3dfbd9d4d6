"""One endpoint's drain loop: ``inflight`` slots sharing one consumer name.

A slot takes a batch (see :mod:`worker.intake`) and hands it down its path
(:mod:`worker.batchpath`: the cache, the request, the commit). Because a slot only takes work
when it is free, fast endpoints take more batches than slow ones: no static split, no
straggler share. The endpoint's models decide which jobs it takes; its circuit
(:mod:`worker.circuit`) whether it takes any; its window (:mod:`worker.window`) how many
batches it has in flight. A batch of a more urgent job preempts a lower one in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from swarm_queue.common.backoff import backoff_s
from swarm_queue.common.errors import (
    BadRecordError,
    EndpointError,
    EndpointMalformed,
    JobGoneError,
    StoreUnavailable,
    SwarmError,
)
from swarm_queue.common.fleet import EndpointInfo, EndpointStats, takers
from swarm_queue.common.models import JobSpec
from swarm_queue.common.throttle import Throttled
from swarm_queue.worker.backend import Backend
from swarm_queue.worker.batch import BatchRunner
from swarm_queue.worker.batchpath import BatchPath
from swarm_queue.worker.cache import AnswerCache
from swarm_queue.worker.circuit import Circuit
from swarm_queue.worker.context import DrainContext
from swarm_queue.worker.figures import EndpointFigures
from swarm_queue.worker.inflight import InFlight
from swarm_queue.worker.intake import Intake, Taken, queued, service_order
from swarm_queue.worker.lookout import Lookout
from swarm_queue.worker.probe import probe_endpoint
from swarm_queue.worker.replies import Load
from swarm_queue.worker.retry import RetryLoop
from swarm_queue.worker.served import ServedModels
from swarm_queue.worker.verify import EMBEDDINGS
from swarm_queue.worker.window import ADAPT_START, Window, follow_load

__all__ = ["HAND_ON_PACE", "EndpointDrainer"]

log = logging.getLogger("swarm.worker")

# A busy engine's worker hands its waiting agent turns on only to an endpoint at least this
# many times as fast as its own answers come (its queue counted): the turn's prefix, cached
# here, is computed again there. On a fleet of equal engines this keeps every turn in its
# lane; one engine of half the others' speed, queued, is past it.
HAND_ON_PACE = 1.5
# After handing on turns that had begun, how long an endpoint takes no other lane's turns.
HANDED_REST_S = 1.0
said = Throttled(log)


# How long a slot rests while another looks for work (a safety net: the lookout wakes it).
LOOKOUT_REST_S = 2.0
# Batches ended unsent after each failed probe of an endpoint that answers unusably.
MAX_ENDED_BATCHES = 100


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
            RetryLoop(
                client, self.settings, self.circuit, self._backoff, engine.metrics, self._check
            )
        )
        self.intake = Intake(
            self.store, self.consumer, self.settings, client.label, engine.sleep, engine.looks
        )
        # Sequences waiting in the engine at the last look at its gauges, while it had ours.
        self._waiting = 0
        # Until then, after handing on turns that had begun here, it takes no other lane's
        # turns (else it takes back what it handed on, its freed slots looking for work).
        self._handed_until = 0.0
        self.intake.engine_busy = lambda: (
            (self._waiting > 0 and len(self.inflight) > 0) or time.monotonic() < self._handed_until
        )
        self.intake.pace = lambda: self.path.pace
        self.intake.lanes = engine.lanes
        self.intake.caps = engine.caps
        self.cache = AnswerCache(self.store, self.settings, client.label)
        self._rr = 0
        self.window = Window(self.settings.inflight)
        self.figures = EndpointFigures(
            client.label, self.settings.worker_name, self.settings.stats_period_s
        )
        # The requests of its batches in flight, with their job and priority.
        self.inflight = InFlight()
        self._burst_done = False  # burst mode: no work left for this endpoint (_nothing_left)
        self._dead: str | None = None  # burst mode: why it was given up on (_died)
        # While there is no work, one slot polls for it and the others rest.
        self.lookout = Lookout(rest_s=LOOKOUT_REST_S)
        # Where each batch taken goes: the cache, the request, the commit.
        self.path = BatchPath(
            engine,
            client,
            consumer=self.consumer,
            served=self.served,
            circuit=self.circuit,
            runner=self.runner,
            cache=self.cache,
            intake=self.intake,
            figures=self.figures,
            inflight=self.inflight,
            backoff=self._backoff,
        )

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
            f"prompts preempted, {f.handed_on} handed on, {f.copied} copied at a job's tail "
            f"({f.copies_won} first)"
        )

    def reclaim_soon(self, job: str) -> None:
        self.intake.reclaim_soon(job)

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

    @property
    def dead(self) -> str | None:
        """Why a burst worker gave up on the endpoint (it died: see ``endpoint_dead_s``)."""
        return self._dead

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
            await asyncio.shield(self.intake.release_ahead())  # (no slot will run them)
            await self.circuit.close()

    async def _hand_on(self, waiting: int) -> None:
        """Agents' turns waiting behind this engine's queue while another endpoint has
        nothing to do and answers at least :data:`HAND_ON_PACE` times as fast (this one's
        queue counted): hand the newest batch of them on, to start there now. Between equal
        engines, moving a turn costs its cached prefix for little. A batch just begun
        (``hand_on_young_ms``) goes only to one that decodes that much faster: the queue is
        no longer what it waits on, and an idle engine of equal speed is not worth its
        prefix and its tokens decoded."""
        young_s = self.settings.hand_on_young_ms / 1000
        candidate = self.inflight.to_hand_on(waiting, young_s)
        if candidate is None:
            return
        request, job, begun = candidate
        pace = self.path.pace
        mine = pace.decode_s_per_token if begun else pace.s_per_token
        if mine is None:
            return
        with contextlib.suppress(StoreUnavailable, JobGoneError):
            said = await self.store.hungry(job, self.intake.lane)
            theirs = None if said is None else said.decode_s if begun else said.pace_s
            if theirs and mine >= HAND_ON_PACE * theirs:
                self.inflight.hand_on(request)
                if begun:
                    self._handed_until = time.monotonic() + HANDED_REST_S

    async def _adapt(self, hi: int) -> None:
        """Follow the endpoint's load with the window (see :func:`worker.window.follow_load`)."""

        async def load() -> Load | None:
            gauges = await self.client.load()
            self._waiting = 0 if gauges is None else int(gauges.waiting)
            if self.settings.hand_on and (self._waiting > 0 or self.settings.hand_on_young_ms):
                await self._hand_on(self._waiting)
            return gauges

        await follow_load(
            self.window,
            load,
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
            while self.engine.stopping and (got := self.intake.pop_ahead()):  # (in hand too)
                await self.path.process(got.spec, got.deliveries, fresh=True, marked=got.marked)
        finally:
            self.lookout.leave(slot)

    async def _slot_loop(self, slot: int) -> None:
        while (
            not self.engine.stopping
            and self.broken is None
            and self._dead is None
            and not self._burst_done
        ):
            try:
                if self.circuit.is_open:
                    await self.intake.release_ahead()  # (the fleet's to run meanwhile)
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
                said.say(
                    logging.WARNING, f"redis {self.label}", "%s: %s; retrying", self.label, exc
                )
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
        await self.path.process(
            got.spec, got.deliveries, copy=got.copy, fresh=got.fresh, marked=got.marked
        )
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
        jobs = service_order([queued(spec) for spec in specs.values()], self._rr)
        self._rr += 1
        return await self.intake.next([specs[j] for j in jobs], block_ms, idle=not self.inflight)

    def abandon(self, job: str) -> None:
        """``job`` is over (finished, cancelled or gone): cut its requests still in flight
        short. Their answers could change nothing (each prompt has its result, or the job is
        no more), and a stalled endpoint's would hold its slots, and a burst worker, until
        the request timed out."""
        self.inflight.abandon(job)
        self.intake.forget(job)

    async def _probe(self) -> None:
        await probe_endpoint(
            self.client,
            self.served,
            timeout_s=self.settings.probe_timeout_s,
            generate=self.circuit.was_ready,
            embeddings=bool(self.circuit.malformed and self.circuit.malformed.route == EMBEDDINGS),
            samples=self.circuit.malformed.samples if self.circuit.malformed else 1,
        )

    async def _check(self, failure: EndpointError) -> None:
        """The probe that tells a prompt's fault (an HTTP 500, its answer left out) from the
        server's: it always generates, and asks for what failed."""
        malformed = failure if isinstance(failure, EndpointMalformed) else None
        await probe_endpoint(
            self.client,
            self.served,
            timeout_s=self.settings.probe_timeout_s,
            generate=True,
            embeddings=malformed is not None and malformed.route == EMBEDDINGS,
            samples=malformed.samples if malformed else 1,
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
        if self.circuit.malformed is not None:
            await self._end_unanswerable(self.circuit.malformed)
        return await self._nothing_left() or self._died()

    def _died(self) -> bool:
        """In burst mode: True once the endpoint, ready before, has failed every probe for
        ``endpoint_dead_s``: its engine died, and waiting for it would hold the allocation."""
        limit, since = self.settings.endpoint_dead_s, self.circuit.down_since
        if not (self.engine.burst and limit and since is not None):
            return False
        down = time.monotonic() - since
        if down < limit:
            return False
        self._dead = f"{self.label}: no answer for {down:.0f} s ({self.circuit.last_error})"
        log.error("%s: giving up on the endpoint, its work left to others", self._dead)
        return True

    async def _end_unanswerable(self, cause: EndpointMalformed) -> None:
        """While this endpoint answers, but unusably (its last probe said so), the prompts of
        the jobs it serves that no other live endpoint serves end failed with its error (or
        go to an endpoint come up meanwhile): a job never waits for ever, showing nothing,
        on an endpoint that lies. Its entries are taken as batches, never sent."""
        try:
            fleet = await self.store.read_fleet()
            now = await self.store.server_time()
        except BadRecordError:
            return  # who else serves what is unknown: the jobs wait
        specs = [
            spec
            for spec in list(self.engine.jobs.values())
            if self.serves(spec)
            and not (takers(spec.model, fleet, now) | self.engine.takers(spec)) - {self.label}
        ]
        for _ in range(MAX_ENDED_BATCHES):
            got = await self.intake.next(specs, None, idle=False)
            if got is None or got.copy:
                return
            try:
                await self.path.giveback.unanswerable(got.spec, got.deliveries, cause)
            except JobGoneError as exc:
                self.engine.job_gone(exc, got.spec)
                return

    def _backoff(self, attempt: int) -> float:
        return backoff_s(
            attempt,
            base_s=self.settings.backoff_base_s,
            cap_s=self.settings.backoff_cap_s,
            rand=self.engine.rand,
        )
