"""The places a drain loop's next batch may come from, each with its own cadence, and the
order in which they are looked at (:func:`plan`: pure, so which source comes next is tested
without Redis or processes). :mod:`worker.intake` walks the plan."""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable, Container
from typing import NamedTuple

from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import Hungry, WorkerStore
from swarm_queue.worker.lookout import Watch

__all__ = ["Cadence", "Copies", "Looks", "Reclaimed", "Source", "Stolen", "plan"]

log = logging.getLogger("swarm.worker")

# (entry ID, payload, how many workers died running it)
Delivery = tuple[bytes, bytes | None, int]

# After a look for speculative copies of a job found none, the next is this much later: at a
# job's tail the entries still held are copied once each, so an empty look stays empty until
# an entry is released or orphaned (and those are reclaimed, not copied).
NO_COPIES_REST_S = 2.0
# An endpoint with nothing to do but other endpoints' turns of an affinity says so at most
# this often, and what it says holds this long: a busy engine's worker, looking at its gauges
# every quarter second, hands its newest waiting turns on only while someone is there.
HUNGRY_EVERY_S = 0.25
HUNGRY_TTL_MS = 1000
# A batch of a job whose prompts carry affinity keys is copied only once in flight this many
# times as long as this endpoint's own batches take.
AFFINE_LATE = 3


class Source(enum.Enum):
    """Where a batch may come from, for one job."""

    RECLAIMED = "entries orphaned by workers that died, or released by failing endpoints"
    LANE = "entries waiting in this endpoint's lane (its engine holds their prefix)"
    NEW = "entries never delivered"
    STOLEN = "entries that waited too long in other endpoints' lanes, or were handed on"
    COPIES = "speculative copies of entries other endpoints hold, at a job's tail"


class Step(NamedTuple):
    """One look: a job and the source to look at for it."""

    spec: JobSpec
    source: Source


def plan(
    jobs: list[JobSpec],
    *,
    idle: bool,
    engine_busy: bool,
    speculate: bool,
    affine: Container[str] = (),
) -> list[Step]:
    """The order of the looks for a batch among ``jobs`` (in service order): per job, its
    orphaned or released entries, its lane's (a job of an affinity, or one whose prompts
    carry affinity keys: ``affine``), its new ones; when none of those is left anywhere,
    other lanes' entries that waited too long (not while this endpoint's engine has sequences
    of ours waiting: it could not start them either); then, only when ``idle`` (a busy
    endpoint's copies would queue behind its own batches and could not finish first),
    speculative copies of jobs of no affinity (a copy of an agent's turn would compute its
    whole conversation again on another engine, and agents' engines are idle between turns
    long before their job's tail)."""
    laned = {s.job for s in jobs if s.affinity or s.job in affine}
    own = [
        Step(spec, source)
        for spec in jobs
        for source in (Source.RECLAIMED, Source.LANE, Source.NEW)
        if source is not Source.LANE or spec.job in laned
    ]
    stolen = [Step(s, Source.STOLEN) for s in jobs if s.job in laned and not engine_busy]
    copies = [Step(s, Source.COPIES) for s in jobs if idle and speculate and not s.affinity]
    return own + stolen + copies


class Cadence:
    """When each job's source may be looked at again (monotonic; never set: now)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._at: dict[str, float] = {}

    def due(self, job: str) -> bool:
        return self.clock() >= self._at.get(job, -math.inf)

    def rest(self, job: str, full: bool, rest_s: float) -> None:
        """Look again at once after a full batch (more may wait), else ``rest_s`` on."""
        self._at[job] = -math.inf if full else self.clock() + rest_s

    def now(self, job: str) -> None:
        """Look again on the next step."""
        self._at.pop(job, None)


class Looks:
    """The looks one endpoint of a worker process makes for all of them: the blocking read
    of a job's new entries (:class:`Watch`), and when the process looks next for a job's
    orphaned or released entries and for its speculative copies. Each endpoint looking on its
    own cadence, a thousand idle endpoints cost Redis more than the job they wait for (issue
    50: a claim and a copy look every two seconds each, 0.3 commands a prompt)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.watch = Watch()
        self.reclaim = Cadence(clock)
        self.copies = Cadence(clock)


class Reclaimed:
    """Entries orphaned by workers that died or released by failing ones. Released entries
    are reclaimable at once, so they are looked for often (a quarter of the claim idle time,
    at most 2 s), by one endpoint of the process at a time (``cadence``: the process's); a
    full batch means more may wait, and the next endpoint to look claims on."""

    def __init__(
        self,
        store: WorkerStore,
        consumer: str,
        settings: Settings,
        label: str,
        cadence: Cadence | None = None,
    ) -> None:
        self.store, self.consumer, self.settings, self.label = store, consumer, settings, label
        self.cadence = cadence or Cadence()
        self._every_s = min(settings.claim_idle_ms / 4000, 2.0)
        self._lock = asyncio.Lock()  # one slot at a time, so no two take the same entry

    async def take(self, spec: JobSpec, held: set[bytes], batch: int) -> list[Delivery]:
        """Up to ``batch`` entries claimed, but those in ``held`` (this endpoint's own, being
        run); a claim that returns some of those (released by their holder while a copy of
        them runs here) hands them straight back to the fleet."""
        job = spec.job
        if not self.cadence.due(job):
            return []
        self.cadence.rest(job, False, self._every_s)  # (the process's other endpoints wait)
        async with self._lock:
            claimed = await self.store.autoclaim(
                job, self.consumer, self.settings.claim_idle_ms, batch
            )
            if len(claimed) == batch:
                self.cadence.now(job)
            copied = [eid for eid, _, _ in claimed if eid in held]
            claimed = [d for d in claimed if d[0] not in held]
            held.update(eid for eid, _, _ in claimed)
        if copied:
            # The claim made them this consumer's, idle reset, and the copy neither commits
            # nor hands back what it could not answer: they would wait the claim idle time
            # for nobody (seen: 21 prompts of 600).
            await self.store.release(job, self.consumer, copied, gen=spec.generation)
        if claimed:
            n = len(claimed)
            log.info("%s: took over %d entries of job %s from other workers", self.label, n, job)
        return claimed


class Copies:
    """Speculative copies of a job's entries other consumers hold (MapReduce's backup tasks:
    the first commit wins), looked for once a poll while some are found, and
    :data:`NO_COPIES_REST_S` after none were, by one endpoint of the process at a time
    (``cadence``: the process's; every idle slot steps once a poll, and a thousand idle
    endpoints asking each poll cost Redis more than the job itself)."""

    def __init__(
        self,
        store: WorkerStore,
        consumer: str,
        settings: Settings,
        cadence: Cadence | None = None,
    ) -> None:
        self.store, self.consumer, self.settings = store, consumer, settings
        self.cadence = cadence or Cadence()
        # How long this endpoint's own batches of each job take (s, a moving average): a
        # batch in another's hands for less than that is not late, and a copy of it would
        # most likely finish second, its decoding thrown away.
        self._batch_s: dict[str, float] = {}

    def took(self, job: str, seconds: float) -> None:
        """One of this endpoint's batches of ``job`` was answered in ``seconds``."""
        before = self._batch_s.get(job)
        self._batch_s[job] = seconds if before is None else 0.8 * before + 0.2 * seconds

    async def take(self, spec: JobSpec, batch: int, *, affine: bool = False) -> list[Delivery]:
        """Up to ``batch`` copies of ``spec``'s entries held late elsewhere; of a job whose
        prompts carry affinity keys (``affine``), only of batches :data:`AFFINE_LATE` times as
        late (a copy computes the prefix again, and their batches' times vary with how much
        is cached)."""
        job = spec.job
        if not self.cadence.due(job):
            return []
        # Only batches in flight longer than ours take (kept under the heartbeat's period,
        # which resets an entry's idle time, so a stuck batch's entries always qualify).
        late_s = self._batch_s.get(job, 0.0) * (AFFINE_LATE if affine else 1)
        late_ms = min(1000 * late_s, self.settings.claim_idle_ms / 4)
        self.cadence.rest(job, False, NO_COPIES_REST_S)  # (the process's other endpoints wait)
        copies = await self.store.copies(
            job, self.consumer, batch, gen=spec.generation, min_idle_ms=int(late_ms)
        )
        if copies:
            self.cadence.rest(job, len(copies) == batch, self.settings.poll_ms / 1000)
        return [(eid, payload, 0) for eid, payload in copies]


class Stolen:
    """Entries of a job of an affinity that waited at least ``lane_wait_ms`` in other
    endpoints' lanes (looked for every poll while some are found); finding none, this
    endpoint says it has nothing to do (at most every :data:`HUNGRY_EVERY_S`), with its
    pace, so that a slower busy engine's worker hands its newest waiting turns on."""

    def __init__(
        self, store: WorkerStore, consumer: str, settings: Settings, label: str, lane: str
    ) -> None:
        self.store, self.consumer, self.settings = store, consumer, settings
        self.label, self.lane = label, lane
        self.cadence = Cadence()
        self.hungry = Cadence()

    async def take(self, job: str, batch: int) -> list[Delivery]:
        """Up to ``batch`` entries that waited too long in other lanes."""
        if not self.cadence.due(job):
            return []
        stolen = await self.store.steal_lanes(
            job, self.lane, self.consumer, batch, self.settings.lane_wait_ms
        )
        self.cadence.rest(job, len(stolen) == batch, self.settings.poll_ms / 1000)
        if stolen:
            n = len(stolen)
            log.debug("%s: took %d entries of job %s from other lanes", self.label, n, job)
        return stolen

    async def say_hungry(self, job: str, pace_s: float, decode_s: float) -> None:
        if not self.hungry.due(job):
            return
        self.hungry.rest(job, False, HUNGRY_EVERY_S)
        await self.store.note_hungry(job, HUNGRY_TTL_MS, Hungry(pace_s, decode_s, self.lane))
