"""Where a drain loop's next batch comes from, job by job in service order: its own
unacknowledged entries first (a restarted worker's leftovers, taken back at once), then a
batch a slot's commit read for it (:meth:`Intake.read_ahead`), then the sources of
:mod:`worker.sources` in the order its ``plan`` gives (orphaned or released entries, the
endpoint's lane, new ones; then other lanes' and speculative copies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Set
from typing import NamedTuple, TypeVar

from swarm_queue.common.errors import JobGoneError, StoreUnavailable
from swarm_queue.common.keys import group_of, lane_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import WorkerStore
from swarm_queue.common.store.entries import requeued
from swarm_queue.worker.caps import NO_CAPS, Caps
from swarm_queue.worker.inflight import Pace
from swarm_queue.worker.sources import Copies, Delivery, Looks, Reclaimed, Source, Stolen, plan

__all__ = ["Delivery", "Intake", "Queued", "Taken", "queued", "service_order"]

log = logging.getLogger("swarm.worker")


async def _alone(spec: JobSpec) -> list[str]:
    """No fleet known: every key stays with whoever reads it."""
    return []


class Taken(NamedTuple):
    """A batch for a slot: its job (as it was when the batch was taken: its generation is what
    the batch's writes carry) and entries; ``copy``: a speculative copy of entries other
    consumers hold (not ours to release, and no run of them is a death); ``fresh``: never
    delivered before (no prompt of theirs can have its result yet); ``marked``: the entries
    the read marked running already (their start is done)."""

    spec: JobSpec
    deliveries: list[Delivery]
    copy: bool = False
    fresh: bool = False
    marked: frozenset[bytes] = frozenset()

    @property
    def job(self) -> str:
        return self.spec.job


class Queued(NamedTuple):
    """A job as the service order weighs it: its priority, the unit it shares a turn in (an
    agent's later turns share their agent job's; "": a unit of its own) at its ``step``, its
    project ("": a share of its own) and its deadline (0: none)."""

    job: str
    priority: int
    unit: str = ""
    step: int = 0
    project: str = ""
    deadline_s: float = 0.0


def queued(spec: JobSpec) -> Queued:
    """How the service order weighs ``spec``'s job: one whose entries have an affinity (an
    agent's later turn) goes in its group's unit, after the places before it, and so does
    each shard of a job spread over several (one share of the fleet for them all)."""
    group, place = group_of(spec.job)
    unit = group if spec.affinity or spec.shards > 1 else ""
    return Queued(spec.job, spec.priority, unit, place, spec.project, spec.deadline_s)


def _entries(prompts: int, spec: JobSpec) -> int:
    """How many of ``spec``'s entries hold ``prompts`` prompts: a chunk each, rounded up."""
    return -(-prompts // spec.chunk)


T = TypeVar("T")


def _rotated(names: list[T], turn: int) -> list[T]:
    start = turn % len(names)
    return names[start:] + names[:start]


def service_order(jobs: list[tuple[str, int]] | list[Queued], turn: int) -> list[str]:
    """The order in which to look for work: every job of a higher priority before any of a
    lower one (so while an urgent job has work, it gets every free slot); of equal priority,
    projects rotated by ``turn`` (a fair share of the fleet each, however many jobs it has),
    and in a project the earliest deadline first, units of the same deadline rotated. In an
    agent job's unit, earlier turns go first: an agent whose first turn is served last ends
    last, after its tool and its later turns, with the engines idle meanwhile; earlier turns
    first leave the later turns of the agents answered before to fill them."""
    if len(jobs) == 1:  # most steps of most workers: nothing to weigh
        return [jobs[0][0]]
    weighed = [Queued(*j) for j in jobs]
    out: list[str] = []
    for level in sorted({q.priority for q in weighed}, reverse=True):
        projects: dict[str, dict[str, list[Queued]]] = {}
        for q in weighed:
            if q.priority == level:
                share = projects.setdefault(q.project or f"\0{q.unit or q.job}", {})
                share.setdefault(q.unit or q.job, []).append(q)
        for project in _rotated(list(projects), turn):
            units = projects[project]
            due = {name: min(q.deadline_s or math.inf for q in qs) for name, qs in units.items()}
            for name in sorted(_rotated(list(units), turn // len(projects)), key=due.__getitem__):
                # (of a unit's jobs at one place, a sharded job's, each first in turn)
                out += [q.job for q in sorted(_rotated(units[name], turn), key=lambda q: q.step)]
    return out


class Intake:
    """The batches of the consumer ``consumer`` (one drain loop; all its slots share this)."""

    def __init__(
        self,
        store: WorkerStore,
        consumer: str,
        settings: Settings,
        label: str,
        sleep: Callable[[float], Awaitable[bool]],
        looks: Looks | None = None,
    ) -> None:
        self.store = store
        self.consumer = consumer
        self.settings = settings
        self.label = label
        self.lane = lane_name(label)
        self.sleep = sleep
        # The entries this endpoint's slots are working on or have just taken, by job (entry
        # IDs repeat across jobs' streams): a reclaim or a look for leftovers that returns
        # them must not start them twice (see :meth:`hand`).
        self.in_hand: dict[str, set[bytes]] = {}
        # The jobs whose new entries are all one prompt's now (swarm-retry's: see _new).
        self.singles: set[str] = set()
        # Whether this endpoint's engine has sequences of ours waiting: then it takes nothing
        # from other lanes (the turns it handed on among them), as it could not start them.
        self.engine_busy: Callable[[], bool] = lambda: False
        # This endpoint's paces (seconds a completion token of its answers).
        self.pace: Callable[[], Pace] = Pace
        self._ready: set[str] = set()  # jobs whose own leftovers have been taken back
        # Jobs whose prompts were seen to carry affinity keys: their lanes are looked at too.
        self.affine: set[str] = set()
        # The live lanes a job's affinity keys may be given to (the worker's view of the fleet).
        self.lanes: Callable[[JobSpec], Awaitable[list[str]]] = _alone
        # How many lines each look may take of a job (its project's cap; see worker/caps.py).
        self.caps: Caps = NO_CAPS
        # The looks one endpoint of the process makes for all (``looks``: the process's).
        self.looks = looks or Looks()
        self.watch = self.looks.watch
        self._losses = 0  # the store's connection losses when last looked at
        self._recovery_lock = asyncio.Lock()
        self._recovered: deque[tuple[JobSpec, list[Delivery]]] = deque()
        # Batches a slot's commit read for it (see :meth:`read_ahead`), served first; and the
        # job this endpoint serves alone, the one job a read ahead may be of.
        self._ahead: deque[Taken] = deque()
        self._sole: str | None = None
        self.reclaimed = Reclaimed(store, consumer, settings, label, self.looks.reclaim)
        self.stolen = Stolen(store, consumer, settings, label, self.lane)
        self.copies = Copies(store, consumer, settings, self.looks.copies)

    def hand(self, job: str) -> set[bytes]:
        """The entries of ``job`` this endpoint's slots hold: being run, or just taken."""
        return self.in_hand.setdefault(job, set())

    def took(self, job: str, seconds: float) -> None:
        """One of this endpoint's batches of ``job`` was answered in ``seconds``."""
        self.copies.took(job, seconds)

    def reclaim_soon(self, job: str) -> None:
        """Entries of ``job`` were released: look for them on the next step."""
        self.reclaimed.cadence.now(job)

    def forget(self, job: str) -> None:
        """``job`` is no longer served: if it is taken up again, its entries left pending to
        this consumer are taken back first, as at a start (its batches read ahead are
        dropped: a job over has nothing left to run)."""
        self._ready.discard(job)
        for taken in [t for t in self._ahead if t.job == job]:
            self._ahead.remove(taken)
            self.hand(job).difference_update(eid for eid, _, _ in taken.deliveries)

    def look_again(self) -> None:
        """After Redis trouble (a read whose reply was lost leaves entries pending for this
        consumer): take this consumer's own leftovers back again."""
        self._ready.clear()

    async def next(
        self, jobs: list[JobSpec], block_ms: int | None, *, idle: bool = False
    ) -> Taken | None:
        """The next batch among ``jobs`` (in the order given), or None; ``block_ms`` waits that
        long for new entries of the first job when nothing is there at once. Only an ``idle``
        endpoint (no batch in flight) takes speculative copies: in a busy one they would queue
        behind its own batches and could not finish first."""
        if (lost := self.store.connection_losses) != self._losses:
            # A connection lost (a Redis restarting) and the command tried again: a read
            # whose reply went with it left entries pending for this consumer that nobody
            # holds. Look for them now rather than after the claim idle time.
            self._losses = lost
            self.look_again()
        for spec in jobs:
            if spec.job not in self._ready:
                await self._recover(spec)
        if self._recovered:
            return Taken(*self._recovered.popleft())
        self._sole = jobs[0].job if len(jobs) == 1 else None
        while self._ahead:
            taken = self._ahead.popleft()
            if jobs and (taken.job, taken.spec.generation) == (jobs[0].job, jobs[0].generation):
                return taken
            await self._release([taken])  # (its job no longer first here: the fleet's)
        if not jobs:
            if block_ms:
                await self.sleep(block_ms / 1000)
            return None
        got = await self._walk(jobs, idle)
        if got is None and block_ms:
            return await self._wait_new(jobs[0], block_ms)
        return got

    async def _wait_new(self, spec: JobSpec, block_ms: int) -> Taken | None:
        """New entries of ``spec``'s job, waiting ``block_ms`` for some (one blocking read a
        job among the process's idle endpoints: :class:`worker.lookout.Watch`); a job whose
        project is at its cap waits as long, taking nothing."""
        granted = await self.caps.grant(spec, self.settings.batch_size)
        if not granted:
            await self.sleep(block_ms / 1000)
            return None
        try:
            return await self.watch.wait(
                spec.job, block_ms, lambda ms: self._take(spec, Source.NEW, granted, ms)
            )
        finally:
            await self.caps.settle(spec, granted)

    async def _new(
        self, spec: JobSpec, batch: int, block_ms: int | None = None, watched: bool = False
    ) -> Taken | None:
        """Up to ``batch`` new entries of ``spec``'s job (waiting ``block_ms`` for some), but
        those whose affinity key is another endpoint's, handed to its lane; ``watched``: the
        job a blocking read waits on when the walk finds nothing."""
        job = spec.job
        marked: set[bytes] = set()
        if block_ms is None:  # (running from its read: see WorkerStore.take_new)
            asked = self.watch.clock()
            async with self.watch.turn(job):  # (one look at a time; none after one finds none)
                if self.watch.quiet(job) or self.watch.none_since(job, asked):
                    return None
                sent = self.watch.clock()
                entries, marked = await self.store.take_new(
                    job, self.consumer, batch, gen=spec.generation
                )
                if not entries:
                    # (only the job the blocking read waits on stays quiet: its read returns
                    # what comes; another job's next walk looks again)
                    self.watch.found_none(job, sent, self.settings.poll_ms if watched else None)
        else:
            entries = await self.store.read_keyed(job, self.consumer, batch, block_ms=block_ms)
        return await self._arrived(spec, entries, marked)

    async def _arrived(
        self, spec: JobSpec, entries: list[tuple[bytes, bytes | None, str]], marked: Set[bytes]
    ) -> Taken | None:
        """New entries of ``spec``'s job just read (``marked`` running by the read), as this
        slot takes them: those whose affinity key is another endpoint's handed to its lane."""
        job = spec.job
        gone: set[bytes] = set()
        if keyed := [(e, k) for e, _, k in entries if k]:
            self.affine.add(job)
            lanes = await self.lanes(spec)
            if lanes:
                gone = await self.store.route(job, self.lane, lanes, keyed)
        if entries and requeued(entries[-1][0]):
            # Entries after one swarm-retry queued are its too (their IDs come after every
            # one the producer can add): one prompt each, so a batch takes a batch of them.
            self.singles.add(job)
        taken = self._held(spec, [(e, payload, 0) for e, payload, _ in entries if e not in gone])
        if taken is None:
            return None
        return taken._replace(fresh=True, marked=frozenset(marked) - gone)

    async def keep_claimed(self, spec: JobSpec, ids: list[bytes]) -> None:
        """Refresh our claim on a long batch so no other worker takes it as orphaned (a job
        gone meanwhile has nothing left to claim: its batch learns so at its commit). Only
        what is still in hand: a refresh of entries the batch gave back would take them back
        from the fleet (their release undone, nobody to run them for the claim idle time:
        seen, 21 prompts of 600 so)."""
        period = self.settings.claim_idle_ms / 3000
        while True:
            await asyncio.sleep(period)
            held = self.hand(spec.job)
            mine = [i for i in ids if i in held]
            with contextlib.suppress(StoreUnavailable, JobGoneError):
                await self.store.touch(spec.job, self.consumer, mine, gen=spec.generation)

    def read_ahead(self, spec: JobSpec) -> tuple[str, int] | None:
        """The read a commit of ``spec``'s batch may carry (``WorkerStore.commit(read=)``):
        this consumer and a batch's entries, where the slot's next batch would be the job's
        new entries anyway: the one job this endpoint serves, plain (no cap to ask, no steps
        moving on, no affinity keys seen, not swarm-retry's entries), its queue not known
        empty. One round trip and one script a batch where there were two."""
        job = spec.job
        if (
            job != self._sole
            or self._ahead
            or self.caps.capped(spec)
            or spec.flow is not None
            or job in self.affine
            or job in self.singles
            or self.watch.quiet(job)
        ):
            return None
        return self.consumer, _entries(self.settings.batch_size, spec)

    async def arrived(
        self, spec: JobSpec, taken: list[tuple[bytes, bytes | None, str]], marked: Set[bytes]
    ) -> None:
        """What a commit's read brought: the next batch of a slot, served first."""
        if taken and (got := await self._arrived(spec, taken, marked)) is not None:
            self._ahead.append(got)

    def pop_ahead(self) -> Taken | None:
        """A batch read ahead, taken out of the queue (None: none waits)."""
        return self._ahead.popleft() if self._ahead else None

    async def release_ahead(self) -> None:
        """Give the batches read ahead back to the fleet (a stop, the endpoint failing): no
        run of theirs began, so none is a death."""
        ahead, self._ahead = list(self._ahead), deque()
        await self._release(ahead)

    async def _release(self, batches: list[Taken]) -> None:
        for taken in batches:
            ids = [eid for eid, _, _ in taken.deliveries]
            with contextlib.suppress(StoreUnavailable, JobGoneError):
                await self.store.release(taken.job, self.consumer, ids, gen=taken.spec.generation)
            self.hand(taken.job).difference_update(ids)

    def _held(self, spec: JobSpec, deliveries: list[Delivery]) -> Taken | None:
        """``deliveries`` of ``spec``'s job as this slot takes them, marked in hand at once
        (None: none left). The endpoint's slots share one consumer, so a look for its own
        leftovers sees what a sibling's read has just delivered before that sibling hears
        its reply: whichever hears its reply first keeps the entries, the other leaves them
        (before, both ran them)."""
        held = self.hand(spec.job)
        mine = [d for d in deliveries if d[0] not in held]
        held.update(eid for eid, _, _ in mine)
        return Taken(spec, mine) if mine else None

    async def _walk(self, jobs: list[JobSpec], idle: bool) -> Taken | None:
        """The first batch the plan's looks find (see :func:`worker.sources.plan`)."""
        busy = self.engine_busy()
        steps = plan(
            jobs, idle=idle, engine_busy=busy, speculate=self.settings.speculate, affine=self.affine
        )
        # The lines granted for the job being looked at: its project's cap read once for its
        # run of looks in the plan (a job's own sources come together), not once a source.
        held: tuple[JobSpec, int] | None = None
        try:
            for spec, source in steps:
                if source is Source.NEW and self.watch.quiet(spec.job):
                    continue  # (what comes, a blocking read of this process takes first)
                if held is None or held[0] is not spec:
                    if held is not None:
                        await self.caps.settle(*held)
                    held = (spec, await self.caps.grant(spec, self.settings.batch_size))
                watched = spec is jobs[0]
                if held[1] and (taken := await self._take(spec, source, held[1], watched=watched)):
                    return taken
            return None
        finally:
            if held is not None:
                await self.caps.settle(*held)

    async def _take(
        self,
        spec: JobSpec,
        source: Source,
        batch: int,
        block_ms: int | None = None,
        *,
        watched: bool = False,
    ) -> Taken | None:
        """One look at ``source`` for up to ``batch`` of ``spec``'s prompts (as many as its
        project's cap leaves: a batch when uncapped), so as many entries as hold them (a
        chunk's prompts: :mod:`common.store.entries`): what it gives, marked in hand."""
        job = spec.job
        prompts, batch = batch, _entries(batch, spec)
        if source is Source.NEW and job in self.singles:
            batch = prompts  # (its new entries are swarm-retry's now: a prompt each)
        if source is Source.RECLAIMED:
            claimed = await self.reclaimed.take(spec, self.hand(job), batch)
            return Taken(spec, claimed) if claimed else None
        if source is Source.LANE:
            mine = await self.store.take_lane(job, self.lane, self.consumer, batch)
            return self._held(spec, mine)
        if source is Source.NEW:
            return await self._new(spec, batch, block_ms, watched)
        if source is Source.STOLEN:
            taken = self._held(spec, await self.stolen.take(job, batch))
            if taken is None and self.settings.hand_on:
                # Nothing here: say so, with this endpoint's pace (a slower busy engine's
                # worker then hands its newest waiting turns on).
                pace = self.pace()
                await self.stolen.say_hungry(
                    job, pace.s_per_token or 0.0, pace.decode_s_per_token or 0.0
                )
            return taken
        copies = await self.copies.take(spec, batch, affine=spec.job in self.affine)
        return Taken(spec, copies, copy=True) if copies else None

    async def _recover(self, spec: JobSpec) -> None:
        """Queue this consumer's own unacknowledged entries of ``spec``'s job (left by a
        previous run), and learn whether its entries carry affinity keys."""
        job = spec.job
        async with self._recovery_lock:
            if job in self._ready:
                return
            after: bytes | None = b"-"
            while after is not None:
                entries, after = await self.store.claim_own_pending(
                    job, self.consumer, self.settings.batch_size, after, exclude=self.hand(job)
                )
                taken = self._held(spec, entries)
                if taken is not None:
                    self._recovered.append((spec, taken.deliveries))
            if await self.store.keyed(job):
                # Its keys were given before this endpoint read any (it restarted, or joined
                # late): its lane may hold entries already, and others' may too.
                self.affine.add(job)
            if self._recovered:
                log.info(
                    "%s: resuming %d own unfinished batches of job %s",
                    self.label,
                    len(self._recovered),
                    job,
                )
            self._ready.add(job)
