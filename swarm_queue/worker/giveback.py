"""A batch's prompts this endpoint will not answer: each given back to other endpoints (a
strike), or failed once no other can take it or it has gone round too often; or the whole
batch released, with what its failure says about the endpoint (its circuit) or the job's
model (the models served)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from swarm_queue.common.errors import (
    BadRecordError,
    EndpointError,
    EndpointMalformed,
    EndpointUnusable,
    ModelNotServed,
    RouteMissing,
    StoreUnavailable,
)
from swarm_queue.common.fleet import takers
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.request import route_of
from swarm_queue.common.store import Commit
from swarm_queue.common.throttle import Throttled
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.answers import Unanswered
from swarm_queue.worker.circuit import Circuit
from swarm_queue.worker.context import DrainContext
from swarm_queue.worker.deliveries import Finished, decode_deliveries
from swarm_queue.worker.intake import Delivery, Intake
from swarm_queue.worker.served import ServedModels

__all__ = ["MAX_GIVE_BACKS", "MAX_STRIKES", "GiveBack"]

log = logging.getLogger("swarm.worker")
said = Throttled(log)

# An entry given back by this many endpoints because their answers to it could not be used
# fails then, rather than going round the fleet again; and so does one given back this many
# times in all (an endpoint may take back what it gave back, while no other takes it).
MAX_STRIKES = 3
MAX_GIVE_BACKS = 2 * MAX_STRIKES


class GiveBack:
    """What one endpoint does with the prompts and batches it gives up on."""

    def __init__(
        self,
        engine: DrainContext,
        label: str,
        consumer: str,
        *,
        served: ServedModels,
        circuit: Circuit,
        intake: Intake,
        commit: Callable[[JobSpec, list[Finished]], Awaitable[Commit]],
        count: Callable[[str, Commit], None],
    ) -> None:
        self.engine, self.store, self.settings = engine, engine.store, engine.settings
        self.label, self.consumer = label, consumer
        self.served, self.circuit, self.intake = served, circuit, intake
        self.commit, self.count = commit, count

    async def takers(self, spec: JobSpec) -> int:
        """How many other endpoints may take work of ``spec``'s job now: this worker's own,
        and the fleet registry's (an unreadable registry counts as one: the strikes decide)."""
        mine = self.engine.takers(spec)
        try:
            now = await self.store.server_time()
            theirs = takers(spec.model, await self.store.read_fleet(), now)
        except BadRecordError:
            theirs = {""}
        return len((mine | theirs) - {self.label})

    async def unanswerable(
        self, spec: JobSpec, deliveries: list[Delivery], cause: EndpointMalformed
    ) -> None:
        """Entries this endpoint took while it answers unusably, never sent: each goes to
        another endpoint if one can take it now, or fails with ``cause``."""
        items, results = decode_deliveries(deliveries, self.label)
        unanswered = [Unanswered(d, str(cause), FailureKind.MALFORMED) for d in items]
        try:
            results = await self.prompts(spec, results, unanswered)
            if results:
                self.count(spec.job, await self.commit(spec, results))
        finally:  # taken in hand by the intake; a job queued again reuses their IDs
            self.intake.hand(spec.job).difference_update(eid for eid, _, _ in deliveries)

    async def prompts(
        self, spec: JobSpec, results: list[Finished], unanswered: list[Unanswered]
    ) -> list[Finished]:
        """Give ``unanswered`` prompts back to other endpoints, but for those no other can
        take (none serves the job's model with its circuit closed, or it has been given back
        MAX_STRIKES times): those fail with their reason, added to ``results`` to commit. A
        prompt one endpoint failed to answer is tried elsewhere before it fails."""
        strikes = await self.store.strikes(spec.job, [u.decoded[0] for u in unanswered])
        others = await self.takers(spec)
        back: dict[int, list[bytes]] = {}  # by the requests that carried them here
        out = list(results)
        for u, (n, times, tries) in zip(unanswered, strikes, strict=True):
            eid, payload, item = u.decoded
            if others and n + 1 < MAX_STRIKES and times + 1 < MAX_GIVE_BACKS:
                back.setdefault(u.attempts, []).append(eid)
                continue
            where = (
                "no other endpoint serves the job's model"
                if not others
                else f"given back by {n + 1} endpoints"
                if n + 1 >= MAX_STRIKES
                else f"given back {times + 1} times"
            )
            failed = Result(
                index=item.index,
                endpoint=self.label,
                error=f"{u.why}; {where}",
                error_kind=u.kind,
                attempts=u.attempts + tries,  # its tries on the endpoints that gave it back too
                custom_id=item.custom_id,
            )
            out.append((eid, failed, payload))
        if back:
            self.let_go(spec.job, [eid for ids in back.values() for eid in ids])
            with contextlib.suppress(StoreUnavailable):
                for tried, ids in back.items():
                    await self.store.release(
                        spec.job, self.consumer, ids, gen=spec.generation, strike=True, tries=tried
                    )
            self.engine.reclaim_soon(spec.job)
        said.say(
            logging.WARNING,
            f"unusable {self.label}",
            "%s: no usable answer to %d prompts of job %s (%s): %d given to other endpoints, "
            "%d failed",
            self.label,
            len(unanswered),
            spec.job,
            unanswered[0].why,
            len(back),
            len(out) - len(results),
        )
        return out

    def let_go(self, job: str, ids: list[bytes]) -> None:
        """``ids`` leave this endpoint's hands before they are released: a sibling slot's
        reclaim that takes them at once must not drop them as held (it would own them, idle
        reset, and nobody would run them for the claim idle time: seen, 6 prompts of 600
        waiting so after an endpoint gave them back)."""
        self.intake.hand(job).difference_update(ids)

    async def release(
        self,
        spec: JobSpec,
        ids: list[bytes],
        cause: EndpointError,
        model: str | None,
        *,
        lost: bool = False,
    ) -> None:
        """Give up a batch: hand back the entries still ours, and record what the failure
        says about the endpoint or the job's model. ``lost``: its request was lost in the
        server (it hung or died under it), a death of each of its prompts, as a worker's."""
        job = spec.job
        self.let_go(job, ids)
        with contextlib.suppress(StoreUnavailable):
            await self.store.release(job, self.consumer, ids, gen=spec.generation, lost=lost)
        self.engine.reclaim_soon(job)  # this worker's other endpoints take them at once
        if isinstance(cause, ModelNotServed):
            # The job's trouble, not the endpoint's: stop taking the job until the served
            # models, re-read soon, say otherwise.
            route = route_of(spec) if isinstance(cause, RouteMissing) else None
            if self.served.refused(model, route):
                what = (
                    "has" if isinstance(cause, RouteMissing) else f"does not serve model {model!r}:"
                )
                log.warning(
                    "%s: %s %s; job %s is left to endpoints that serve it",
                    self.label,
                    what,
                    cause.message,
                    job,
                )
            return
        if isinstance(cause, EndpointUnusable):
            self.circuit.broken = str(cause)
            log.error("%s: endpoint unusable, no more work taken from it: %s", self.label, cause)
            return
        said.say(
            logging.WARNING,
            f"released {self.label}",
            "%s: released %d entries to other workers (%s)",
            self.label,
            len(ids),
            cause,
        )
        self.circuit.trip(cause)
