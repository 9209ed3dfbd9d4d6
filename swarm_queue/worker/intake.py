"""Where a drain loop's next batch comes from, job by job in service order: its own
unacknowledged entries first (a restarted worker's leftovers, taken back at once), then
entries orphaned by workers that died or released by failing endpoints, then those waiting in
its endpoint's lane (agent turns whose prefix its engine holds), then new ones. When none of
these is left anywhere: entries that waited too long in other endpoints' lanes, and at a job's
tail speculative copies of the batches other endpoints still hold (MapReduce's backup tasks:
the first commit wins).

Released entries are reclaimable at once, so they are looked for often; a full batch of
orphans means more may wait, so the next step looks again at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from swarm_queue.common.keys import group_of, lane_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import Hungry, WorkerStore
from swarm_queue.worker.inflight import Pace

__all__ = ["Delivery", "Intake", "Queued", "Taken", "queued", "service_order"]

# After a look for speculative copies of a job found none, the next is this much later: at a
# job's tail the entries still held are copied once each, so an empty look stays empty until
# an entry is released or orphaned (and those are reclaimed, not copied).
NO_COPIES_REST_S = 2.0
# An endpoint with nothing to do but other endpoints' laned turns says so at most this often,
# and what it says holds this long: a busy engine's worker, looking at its gauges every
# quarter second, hands its newest waiting turns on only while someone is there to take them.
HUNGRY_EVERY_S = 0.25
HUNGRY_TTL_MS = 1000

log = logging.getLogger("swarm.worker")

# (entry ID, payload, how many workers died running it)
Delivery = tuple[bytes, bytes | None, int]


class Taken(NamedTuple):
    """A batch for a slot: its job (as it was when the batch was taken: its generation is what
    the batch's writes carry) and entries; ``copy``: a speculative copy of entries other
    consumers hold (not ours to release, and no run of them is a death)."""

    spec: JobSpec
    deliveries: list[Delivery]
    copy: bool = False

    @property
    def job(self) -> str:
        return self.spec.job


class Queued(NamedTuple):
    """A job as the service order weighs it: its priority, and the unit it shares a turn in
    (an agent's later turns share their agent job's; "": a unit of its own), at its ``step``."""

    job: str
    priority: int
    unit: str = ""
    step: int = 0


def queued(spec: JobSpec) -> Queued:
    """How the service order weighs ``spec``'s job: one whose entries have an affinity (an
    agent's later turn) goes in its group's unit, after the places before it."""
    group, place = group_of(spec.job)
    return Queued(spec.job, spec.priority, group if spec.affinity else "", place)


def service_order(jobs: list[tuple[str, int]] | list[Queued], turn: int) -> list[str]:
    """The order in which to look for work: every job of a higher priority before any of a
    lower one (so while an urgent job has work, it gets every free slot), and units of equal
    priority rotated by ``turn`` (a fair share among them). In an agent job's unit, earlier
    turns go first: an agent whose first turn is served last ends last, after its tool and
    its later turns, with the engines idle meanwhile; earlier turns first leave the later
    turns of the agents answered before to fill them."""
    if len(jobs) == 1:  # most steps of most workers: nothing to weigh
        return [jobs[0][0]]
    weighed = [Queued(*j) for j in jobs]
    out: list[str] = []
    for level in sorted({q.priority for q in weighed}, reverse=True):
        units: dict[str, list[Queued]] = {}
        for q in weighed:
            if q.priority == level:
                units.setdefault(q.unit or q.job, []).append(q)
        names = list(units)
        start = turn % len(names)
        for name in names[start:] + names[:start]:
            out += [q.job for q in sorted(units[name], key=lambda q: q.step)]
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
        # Whether this endpoint's engine has sequences of ours waiting: then it takes nothing
        # from other lanes (the turns it handed on among them), as it could not start them.
        self.engine_busy: Callable[[], bool] = lambda: False
        # This endpoint's paces (seconds a completion token of its answers).
        self.pace: Callable[[], Pace] = Pace
        self._ready: set[str] = set()  # jobs whose own leftovers have been taken back
        self._losses = 0  # the store's connection losses when last looked at
        self._recovery_lock = asyncio.Lock()
        self._recovered: deque[tuple[JobSpec, list[Delivery]]] = deque()
        self._reclaim_at: dict[str, float] = {}  # when to look for orphans again (monotonic)
        self._reclaim_lock = asyncio.Lock()
        # Released entries are reclaimable at once: look for them (and for orphans) often.
        self._reclaim_every_s = min(settings.claim_idle_ms / 4000, 2.0)
        # When copies of each job may be looked for again (monotonic): once a poll after some
        # were found, NO_COPIES_REST_S after none were (every idle slot steps once a poll, and
        # a thousand idle endpoints asking each poll cost Redis more than the job itself).
        self._copies_at: dict[str, float] = {}
        self._steal_at: dict[str, float] = {}  # when others' lanes may be looked at again
        self._hungry_at: dict[str, float] = {}  # when to say again that it has nothing to do
        # How long this endpoint's own batches of each job take (s, a moving average): a
        # batch in another's hands for less than that is not late, and a copy of it would
        # most likely finish second, its decoding thrown away.
        self._batch_s: dict[str, float] = {}

    def hand(self, job: str) -> set[bytes]:
        """The entries of ``job`` this endpoint's slots hold: being run, or just taken."""
        return self.in_hand.setdefault(job, set())

    def took(self, job: str, seconds: float) -> None:
        """One of this endpoint's batches of ``job`` was answered in ``seconds``."""
        before = self._batch_s.get(job)
        self._batch_s[job] = seconds if before is None else 0.8 * before + 0.2 * seconds

    def reclaim_soon(self, job: str) -> None:
        """Entries of ``job`` were released: look for them on the next step."""
        self._reclaim_at.pop(job, None)

    def forget(self, job: str) -> None:
        """``job`` is no longer served: if it is taken up again, its entries left pending to
        this consumer are taken back first, as at a start."""
        self._ready.discard(job)

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
        if not jobs:
            if block_ms:
                await self.sleep(block_ms / 1000)
            return None
        got = await self._own(jobs) or await self._others(jobs, idle)
        if got is None and block_ms:
            first = jobs[0]
            batch = self.settings.batch_size
            entries = await self.store.read_new(first.job, self.consumer, batch, block_ms=block_ms)
            return self._held(first, [(eid, payload, 0) for eid, payload in entries])
        return got

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

    async def _own(self, jobs: list[JobSpec]) -> Taken | None:
        """Per job, in order: its orphaned or released entries, those in this endpoint's
        lane, then new ones."""
        batch = self.settings.batch_size
        for spec in jobs:
            claimed = await self._reclaim(spec)
            if claimed:
                return Taken(spec, claimed)
            if spec.affinity:
                mine = await self.store.take_lane(spec.job, self.lane, self.consumer, batch)
                if (taken := self._held(spec, mine)) is not None:
                    return taken
            entries = await self.store.read_new(spec.job, self.consumer, batch)
            if (taken := self._held(spec, [(eid, p, 0) for eid, p in entries])) is not None:
                return taken
        return None

    async def _others(self, jobs: list[JobSpec], idle: bool) -> Taken | None:
        """With nothing of its own: what waited too long in other endpoints' lanes or was
        handed on to the open lane (and, finding none, it says it has nothing to do: a busy
        engine's worker then hands its newest waiting turns on), then (if ``idle``)
        speculative copies of what other endpoints hold. While its own engine has our
        sequences waiting it takes no other lane's turns: it could not start them either."""
        for spec in jobs:
            if spec.affinity and not self.engine_busy():
                stolen = await self._steal(spec.job)
                if (taken := self._held(spec, stolen)) is not None:
                    return taken
                if self.settings.hand_on:
                    await self._hungry(spec.job)
        if idle and self.settings.speculate:
            # Not an agent's later turns: a copy on another engine would compute its whole
            # conversation again, and a stuck endpoint's turns come back by its circuit.
            for spec in (s for s in jobs if not s.affinity):
                copies = await self._copies(spec)
                if copies:
                    return Taken(spec, copies, copy=True)
        return None

    async def _recover(self, spec: JobSpec) -> None:
        """Queue this consumer's own unacknowledged entries of ``spec``'s job (left by a
        previous run)."""
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
            if self._recovered:
                log.info(
                    "%s: resuming %d own unfinished batches of job %s",
                    self.label,
                    len(self._recovered),
                    job,
                )
            self._ready.add(job)

    async def _copies(self, spec: JobSpec) -> list[Delivery]:
        """Speculative copies of ``spec``'s job's entries other consumers hold, when it is time
        to look again; a full batch may mean more: look again next step."""
        job = spec.job
        if not _due(self._copies_at, job):
            return []
        batch = self.settings.batch_size
        # Only batches in flight longer than ours take (kept under the heartbeat's period,
        # which resets an entry's idle time, so a stuck batch's entries always qualify).
        late_ms = min(1000 * self._batch_s.get(job, 0.0), self.settings.claim_idle_ms / 4)
        copies = await self.store.copies(
            job, self.consumer, batch, gen=spec.generation, min_idle_ms=int(late_ms)
        )
        rest = self.settings.poll_ms / 1000 if copies else NO_COPIES_REST_S
        self._copies_at[job] = _after(len(copies) == batch, rest)
        return [(eid, payload, 0) for eid, payload in copies]

    async def _hungry(self, job: str) -> None:
        """Say (at most every :data:`HUNGRY_EVERY_S`), with this endpoint's pace, that it
        found nothing to do but ``job``'s turns held in busy engines: those slower by
        :data:`worker.drainer.HAND_ON_PACE` hand their newest waiting ones on."""
        if not _due(self._hungry_at, job):
            return
        self._hungry_at[job] = _after(False, HUNGRY_EVERY_S)
        pace = self.pace()
        said = Hungry(pace.s_per_token or 0.0, pace.decode_s_per_token or 0.0, self.lane)
        await self.store.note_hungry(job, HUNGRY_TTL_MS, said)

    async def _steal(self, job: str) -> list[Delivery]:
        """Entries of ``job`` that waited at least ``lane_wait_ms`` in other endpoints' lanes,
        when it is time to look again (every poll while some are found)."""
        if not _due(self._steal_at, job):
            return []
        batch = self.settings.batch_size
        stolen = await self.store.steal_lanes(
            job, self.lane, self.consumer, batch, self.settings.lane_wait_ms
        )
        self._steal_at[job] = _after(len(stolen) == batch, self.settings.poll_ms / 1000)
        if stolen:
            log.debug(
                "%s: took %d entries of job %s from other lanes", self.label, len(stolen), job
            )
        return stolen

    async def _reclaim(self, spec: JobSpec) -> list[Delivery]:
        """Entries of ``spec``'s job orphaned by workers that died or released by failing
        ones, when it is time to look again for them."""
        job = spec.job
        if not _due(self._reclaim_at, job):
            return []
        batch = self.settings.batch_size
        async with self._reclaim_lock:  # one slot at a time, so no two take the same entry
            claimed = await self.store.autoclaim(
                job, self.consumer, self.settings.claim_idle_ms, batch
            )
            # A full batch may mean more orphans wait: look again next step.
            self._reclaim_at[job] = _after(len(claimed) == batch, self._reclaim_every_s)
            held = self.hand(job)
            copied = [eid for eid, _, _ in claimed if eid in held]
            claimed = [d for d in claimed if d[0] not in held]
            held.update(eid for eid, _, _ in claimed)
        if copied:
            # Released by their holder while a speculative copy of them runs here: the claim
            # made them this consumer's, idle reset, and the copy neither commits nor hands
            # back what it could not answer. Handed straight back to the fleet, or they
            # would wait the claim idle time for nobody (seen: 21 prompts of 600).
            await self.store.release(job, self.consumer, copied, gen=spec.generation)
        if claimed:
            log.info(
                "%s: took over %d entries of job %s from other workers",
                self.label,
                len(claimed),
                job,
            )
        return claimed


def _due(at: dict[str, float], job: str) -> bool:
    """Whether the time ``at[job]`` (monotonic) has come (never set: due)."""
    return time.monotonic() >= at.get(job, -math.inf)


def _after(full: bool, rest_s: float) -> float:
    """When to look again: at once after a full batch (more may wait), else ``rest_s`` on."""
    return -math.inf if full else time.monotonic() + rest_s
