"""An endpoint's requests in flight (worker/inflight.py): which one a more urgent batch
preempts. Never a batch of its own workflow: an agent's next turn, a pipeline's next step,
outranks the turn or step before only in which work is taken first; aborting that earlier
batch would throw its decoded tokens away and put its prompts behind the later ones (seen in
issue 34's agent scenario: 8 first turns preempted, answered 4 s after the other 992)."""

from __future__ import annotations

import asyncio

from swarm_queue.common.models import Result
from swarm_queue.worker.inflight import Cancelled, InFlight


async def _forever() -> list[Result]:
    await asyncio.Event().wait()
    return []


async def test_an_urgent_batch_preempts_the_newest_lower_batch_of_another_workflow() -> None:
    inflight = InFlight()
    old = inflight.start(_forever(), 0, "plain")
    new = inflight.start(_forever(), 0, "other")
    inflight.preempt_below(5, "urgent", share=4)
    await asyncio.sleep(0)
    assert (inflight.why(new), inflight.why(old)) == (Cancelled.PREEMPTED, None)
    assert new.cancelled() and not old.done()
    old.cancel()


async def test_a_later_step_never_preempts_its_own_workflows_earlier_batches() -> None:
    inflight = InFlight()
    other = inflight.start(_forever(), 0, "plain")
    turn0 = inflight.start(_forever(), 0, "ag", "ag")
    turn1 = inflight.start(_forever(), 1, "ag:s1", "ag")
    # The agents' third turn starts: their first and second turns' batches stay; another
    # workflow's lower batch gives way.
    inflight.preempt_below(2, "ag:s2", share=8, family="ag")
    await asyncio.sleep(0)
    assert [inflight.why(r) for r in (other, turn0, turn1)] == [Cancelled.PREEMPTED, None, None]
    # With only its own workflow's batches below it, nothing is preempted.
    inflight.remove(other)
    inflight.preempt_below(2, "ag:s2", share=8, family="ag")
    await asyncio.sleep(0)
    assert not turn0.done() and not turn1.done()
    for r in (turn0, turn1):
        r.cancel()


async def test_a_job_at_its_fair_share_preempts_nothing() -> None:
    inflight = InFlight()
    low = inflight.start(_forever(), 0, "plain")
    mine = inflight.start(_forever(), 9, "urgent")
    inflight.preempt_below(9, "urgent", share=1)
    await asyncio.sleep(0)
    assert inflight.why(low) is None and not low.done()
    for r in (low, mine):
        r.cancel()
