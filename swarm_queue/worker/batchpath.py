"""One batch's path through an endpoint's drain loop, in steps: sorted by the deaths of its
entries (run as usual, alone, or dead-lettered), answered from the response cache where it
can be, one request for the rest (marked running, a lower batch preempted), the results and
acks committed atomically, the new answers kept; on giving up, released to other workers. The
batch stays claimed (a heartbeat) until its path ends. Every write carries the generation of
the job the batch was taken from."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec

from swarm_queue.common.errors import (
    BadRecordError,
    EndpointMalformed,
    EndpointUnusable,
    JobGoneError,
    ModelNotServed,
    StoreUnavailable,
)
from swarm_queue.common.models import JobSpec, Result, Usage
from swarm_queue.common.perprompt import answered
from swarm_queue.common.schema import validator_of
from swarm_queue.common.store import Commit
from swarm_queue.common.throttle import Throttled
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.answers import Unanswered, settled
from swarm_queue.worker.backend import Backend
from swarm_queue.worker.batch import BatchRunner
from swarm_queue.worker.cache import AnswerCache
from swarm_queue.worker.circuit import Circuit, GiveUp
from swarm_queue.worker.context import DrainContext
from swarm_queue.worker.deliveries import (
    Decoded,
    Finished,
    Triage,
    dead_letters,
    decode_deliveries,
    one_by_one,
    unanswered,
    unreadable,
)
from swarm_queue.worker.dims import Dimensions, keeps_vectors
from swarm_queue.worker.early import EarlyCommits
from swarm_queue.worker.figures import EndpointFigures
from swarm_queue.worker.giveback import GiveBack
from swarm_queue.worker.inflight import Answers, Cancelled, InFlight, Pace, Request
from swarm_queue.worker.intake import Delivery, Intake
from swarm_queue.worker.served import ServedModels
from swarm_queue.worker.usage import Tally

__all__ = ["BatchPath"]

log = logging.getLogger("swarm.worker")
said = Throttled(log)


class _Dropped(Exception):
    """A batch's request was cancelled on purpose (see :class:`~worker.inflight.Cancelled`):
    its batch is released, nothing to commit."""


def _told(early: EarlyCommits | None, answers: Answers | None) -> Callable[[Result], None] | None:
    """What hears each answer of a batch as it comes: its early commits, its count."""
    if answers is None:
        return early.add if early is not None else None
    if early is None:
        return answers.add

    def both(result: Result) -> None:
        answers.add(result)
        early.add(result)

    return both


class BatchPath:
    """The path of one endpoint's batches, from taken to committed or released."""

    def __init__(
        self,
        engine: DrainContext,
        client: Backend,
        *,
        consumer: str,
        served: ServedModels,
        circuit: Circuit,
        runner: BatchRunner,
        cache: AnswerCache,
        intake: Intake,
        figures: EndpointFigures,
        inflight: InFlight,
        backoff: Callable[[int], float],
    ) -> None:
        self.engine, self.settings, self.store = engine, engine.settings, engine.store
        self.client, self.consumer, self.served = client, consumer, served
        self.circuit, self.runner, self.cache = circuit, runner, cache
        self.intake, self.figures, self.inflight = intake, figures, inflight
        self._backoff = backoff
        self.dims = Dimensions(engine.store, client.label, circuit)
        self.pace = Pace()  # of this endpoint's flow chat answers (see worker/inflight.py)
        self.giveback = GiveBack(
            engine,
            client.label,
            consumer,
            served=served,
            circuit=circuit,
            intake=intake,
            commit=self._commit,
            count=self._count,
        )

    def _count(self, job: str, commit: Commit) -> None:
        self.figures.count(job, commit.done, commit.failed, time.monotonic())
        self.engine.touched.add(job)
        self.engine.metrics.committed(job, self.client.label, commit)

    async def process(
        self,
        spec: JobSpec,
        deliveries: list[Delivery],
        *,
        copy: bool = False,
        fresh: bool = False,
        marked: frozenset[bytes] = frozenset(),
    ) -> None:
        """Finish one batch of ``spec``'s job, each entry by how many workers died running it
        (see :class:`~worker.deliveries.Triage`). A release (a failing endpoint, a model not
        served) or a restart taking back its own batches is no death: only a run that never
        finished is. A speculative ``copy`` runs like any batch: the heartbeat and a release act
        only on entries this consumer holds, so on a copy they do nothing. Every write carries
        the generation of ``spec``: if the job is gone (deleted, lost, queued again under its
        name), the batch is dropped and the engine told, once. Chunks not ``fresh`` (never
        delivered before) run only their prompts not answered yet. ``marked``: entries the
        read marked running already."""
        job = spec.job
        ids = [eid for eid, _, _ in deliveries]
        sorted_ = Triage(deliveries, self.settings.max_deliveries)
        # Everything taken stays ours until done: refreshed claims, and never restarted by a
        # sibling slot's reclaim while it waits for its turn here.
        heartbeat = asyncio.create_task(self.intake.keep_claimed(spec, ids))
        self.intake.hand(job).update(ids)
        self.figures.job(job, time.monotonic())  # its rate counts from its first batch
        try:
            deliveries, bad = await unreadable(
                self.store, job, deliveries, self.client.label, spec.chunk
            )
            if bad:
                self._count(job, await self._commit(spec, bad))
            if not fresh:
                deliveries, whole = await unanswered(self.store, job, deliveries)
                if whole:
                    await self._commit(spec, [], whole=whole)
            if bad or not fresh:
                sorted_ = Triage(deliveries, self.settings.max_deliveries)
            rest = await self._dead_letter(spec, sorted_.dead) if sorted_.dead else []
            if sorted_.fresh:
                await self._run_batch(spec, sorted_.fresh, copy=copy, marked=marked)
            for suspect in one_by_one(sorted_.suspects) + rest:
                if suspect[0] in self.intake.hand(job):  # (given back: its taker runs the rest)
                    await self._run_batch(spec, [suspect])
        except JobGoneError as exc:
            # Entries read under a stale spec belong to the job that holds the name now: this
            # consumer takes them back once the engine has read that job.
            self.engine.job_gone(exc, spec)
            self.intake.look_again()
        except BadRecordError as exc:
            # A key of the job holds another tool's value: its entries stay pending here,
            # taken back if the job is read again; no other job waits on it (nor looks for
            # its own leftovers again: it has none for this).
            self.engine.unreadable(exc)
            if exc.job:
                self.intake.forget(exc.job)
            else:
                self.intake.look_again()
        finally:
            heartbeat.cancel()
            self.intake.hand(job).difference_update(ids)

    async def _dead_letter(self, spec: JobSpec, dead: list[Delivery]) -> list[Delivery]:
        """Dead-letter ``dead``; what is left to run of them (a chunk's other prompts)."""
        results, rest = dead_letters(dead, self.client.label)
        commit = await self._commit(spec, results)
        self.figures.dead_lettered += commit.failed
        self._count(spec.job, commit)
        log.warning(
            "%s: dead-lettered %d prompts of job %s", self.client.label, len(results), spec.job
        )
        return rest

    async def _run_batch(
        self,
        spec: JobSpec,
        deliveries: list[Delivery],
        *,
        copy: bool = False,
        marked: frozenset[bytes] = frozenset(),
    ) -> None:
        """Complete one batch and commit it, in steps: answers from the cache, the request for
        the rest, the commit, the answers kept. On giving up, the batch is released to other
        workers. A ``copy`` is not marked as running (its run is no entry's death) and
        preempts nothing. A flow's chat batch commits each answer as it comes
        (:class:`~worker.early.EarlyCommits`): its next step need not wait for the batch."""
        ids = [eid for eid, _, _ in deliveries]
        items, results = decode_deliveries(deliveries, self.client.label)
        validator = validator_of(spec.schema)
        keys: list[str | None] = []  # the cache's keys of the answers to come, if it is used
        if items and spec.cache:
            hits, items, keys = await self.cache.answered(spec, items)
            results += [(e, validator.checked(r) if validator else r, p) for e, r, p in hits]

        # Its runs before this one that never ended (a worker died, a server hung or dropped
        # it): each a try of the prompt's, counted in its line's attempts.
        deaths = {eid: n for eid, _, n in deliveries if n}
        before = {it.index: deaths[eid] for eid, _, it in items if eid in deaths}

        def shape(r: Result) -> Result:
            r = answered(spec, r) if spec.per_prompt is not None else r
            if before:
                r = msgspec.structs.replace(r, attempts=r.attempts + before.get(r.index, 0))
            return validator.checked(r) if validator is not None else r

        def committed(commit: Commit) -> None:
            self._count(spec.job, commit)
            if copy:
                self.figures.copies_won += commit.done + commit.failed

        early = self._early(spec, items, shape, committed)
        if copy:
            self.figures.copied += len(ids)
        tally = Tally()
        answers: list[Result] = []  # shaped, in the order of ``items``, for the cache
        if items:
            try:
                sent = await self._send(
                    spec, deliveries, items, tally, copy=copy, early=early, marked=marked
                )
            except (GiveUp, EndpointUnusable, ModelNotServed) as exc:
                await self._gave_up(spec, ids, items, results, exc, copy=copy, early=early)
                return
            except _Dropped:
                if early is not None:
                    await early.settle()
                return
            if early is not None:
                await early.settle()
                tally.take(early.shaped.values())
            rest, left_out, keys, answers = settled(items, sent, keys, shape, early)
            if left_out and not copy:  # choices it kept leaving out: another endpoint's to try
                results = await self.giveback.prompts(spec, results, left_out)
            results += [(eid, r, payload) for (eid, payload, _), r in rest]
            tally.take(r for _, r, _ in results)  # what each carries counts with it
        if results or early is None:
            # Shielded: once results exist, finishing the (atomic) commit beats redoing them.
            # It may bring this slot's next batch (see Intake.read_ahead).
            read = None if copy or self.engine.stopping else self.intake.read_ahead(spec)
            commit = await self._commit(spec, results, tally.rest, read=read)
            committed(commit)
            await self.intake.arrived(spec, commit.taken, commit.marked)
        if keys and answers:
            await self.cache.keep(keys, answers)

    def _early(
        self,
        spec: JobSpec,
        items: list[Decoded],
        shape: Callable[[Result], Result],
        committed: Callable[[Commit], None],
    ) -> EarlyCommits | None:
        """Early commits for a batch of a job whose answers move on (None for any other)."""
        if not items or spec.flow is None:
            return None

        async def commit_part(part: list[Finished]) -> Commit:
            return await self._commit(spec, part)

        return EarlyCommits(items, commit_part, shape, committed)

    async def _gave_up(
        self,
        spec: JobSpec,
        ids: list[bytes],
        items: list[Decoded],
        results: list[Finished],
        exc: GiveUp | EndpointUnusable | ModelNotServed,
        *,
        copy: bool,
        early: EarlyCommits | None,
    ) -> None:
        """This endpoint will not finish the batch: an unusable answer's prompts go to other
        endpoints (or fail if none can take them), anything else is released to them. What was
        answered and committed meanwhile stays answered."""
        if early is not None:
            await early.settle()
        cause = exc.cause if isinstance(exc, GiveUp) else exc
        if isinstance(cause, EndpointMalformed) and copy:
            self.circuit.trip(cause)  # a copy's prompts are their holder's to answer
            return
        if isinstance(cause, EndpointMalformed):
            # It answers, but unusably: its prompts go elsewhere, or fail if none can.
            why = str(cause)
            unanswered = [  # each carried by the one request its unusable answer came to
                Unanswered(d, why, FailureKind.MALFORMED, 1)
                for d in items
                if early is None or d[0] not in early.ids
            ]
            results = await self.giveback.prompts(spec, results, unanswered)
            if results:
                self._count(spec.job, await self._commit(spec, results))
            self.circuit.trip(cause)
            return
        lost = isinstance(exc, GiveUp) and exc.lost and not copy  # (a copy's are its holder's)
        await self.giveback.release(spec, ids, cause, self.served.model_for(spec), lost=lost)

    async def _send(
        self,
        spec: JobSpec,
        deliveries: list[Delivery],
        items: list[Decoded],
        tally: Tally,
        *,
        copy: bool,
        early: EarlyCommits | None = None,
        marked: frozenset[bytes] = frozenset(),
    ) -> list[Result]:
        """The endpoint's results for ``items``, in order: marked running (unless a copy, or
        ``marked`` as they were read), a lower batch preempted, then one request.
        :class:`_Dropped` when it was cancelled on purpose (preempted, or its job is over): its
        batch is released, no death."""
        job, gen = spec.job, spec.generation
        request: Request | None = None
        try:
            if not copy:
                deaths = {eid: n for eid, _, n in deliveries if eid not in marked}
                start = {eid: deaths[eid] for eid, _, _ in items if eid in deaths}
                await self.store.start(job, start, gen=gen)
                share = self.engine.shares.get(job, 0)
                self.inflight.preempt_below(spec.priority, job, share)
            model = self.served.model_for(spec)
            if model is None:
                raise ModelNotServed(self.client.label, "serves no model")
            self.figures.job(job, time.monotonic()).model = model
            dim = await self.dims.of(spec)
            # A flow's chat answers time the endpoint's pace; entries of an affinity (an
            # agent's turns) may be handed on while they wait in a busy engine.
            answers = Answers(self.pace) if early is not None and not copy else None
            request = self.inflight.start(
                self.runner.run(
                    spec,
                    [it for _, _, it in items],
                    model,
                    tally,
                    dim,
                    _told(early, answers),
                ),
                spec.priority,
                job,
                size=len(items) if spec.affinity else 0,
                answers=answers,
            )
            began = time.monotonic()
            sent = await request
            self.intake.took(job, time.monotonic() - began)
            if keeps_vectors(spec) and dim is None:
                await self.dims.fix(spec, sent)
            return sent
        except asyncio.CancelledError:
            # Preempted by a batch of a more urgent job, its job over, or stopped past the
            # grace period: the batch goes back, and its run is no death.
            ids = [eid for eid, _, _ in deliveries]
            why = self.inflight.why(request)
            if why is Cancelled.HANDED_ON:
                handed = self.store.give_back(
                    job, self.consumer, ids, idle_ms=self.settings.lane_wait_ms, gen=gen
                )
            else:
                handed = self.store.release(job, self.consumer, ids, gen=gen)
            with contextlib.suppress(StoreUnavailable, JobGoneError):
                await asyncio.shield(handed)
            # No longer this slot's: a sibling that takes them back (the open lane, a
            # reclaim) must not find them still in hand.
            self.intake.hand(job).difference_update(ids)
            if why is None:
                raise
            if why is Cancelled.PREEMPTED:
                self.figures.preempted += len(ids)
            elif why is Cancelled.HANDED_ON:
                self.figures.handed_on += len(ids)
            log.debug("%s: %s %d prompts of job %s", self.client.label, why, len(ids), job)
            raise _Dropped from None
        finally:
            if request is not None:
                self.inflight.remove(request)

    async def _commit(
        self,
        spec: JobSpec,
        results: list[tuple[bytes, Result, bytes | None]],
        rest: Usage | None = None,
        whole: list[bytes] | None = None,
        read: tuple[str, int] | None = None,
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
                        spec.job,
                        results,
                        rest,
                        gen=spec.generation,
                        moves_on=spec.flow is not None,
                        failures_move=spec.flow is not None and spec.flow.failures,
                        whole=whole or (),
                        chunk=spec.chunk,
                        read=read,
                    )
                )
            except StoreUnavailable as exc:
                attempt += 1
                said.say(
                    logging.WARNING,
                    f"commit {self.client.label}",
                    "%s: commit of %d results waits for Redis (%s)",
                    self.client.label,
                    len(results),
                    exc,
                )
                await asyncio.sleep(self._backoff(attempt))
