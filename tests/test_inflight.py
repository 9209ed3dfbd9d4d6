"""An endpoint's requests in flight (swarm_queue/worker/inflight.py): which one a more urgent batch
preempts. Never a batch of its own workflow: an agent's next turn, a pipeline's next step,
outranks the turn or step before only in which work is taken first; aborting that earlier
batch would throw its decoded tokens away and put its prompts behind the later ones (seen in
issue 34's agent scenario: 8 first turns preempted, answered 4 s after the other 992)."""

from __future__ import annotations

import asyncio
import time

import pytest

from swarm_queue.common.models import Result, Usage
from swarm_queue.worker.inflight import Answers, Cancelled, InFlight, Pace


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
    turn0 = inflight.start(_forever(), 0, "ag")
    turn1 = inflight.start(_forever(), 1, "ag:s1")
    # The agents' third turn starts: their first and second turns' batches stay; another
    # workflow's lower batch gives way.
    inflight.preempt_below(2, "ag:s2", share=8)
    await asyncio.sleep(0)
    assert [inflight.why(r) for r in (other, turn0, turn1)] == [Cancelled.PREEMPTED, None, None]
    # With only its own workflow's batches below it, nothing is preempted.
    inflight.remove(other)
    inflight.preempt_below(2, "ag:s2", share=8)
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


async def test_only_the_newest_unanswered_agent_batch_fitting_the_queue_is_handed_on() -> None:
    """vLLM serves requests of one priority first come, first served: with ``waiting``
    sequences queued, the newest batch of no more prompts than that has not started, so
    handing it on throws nothing decoded away. One begun (an answer in) is never handed on,
    nor anything older than it, nor a batch not counted for it (a plain job's)."""
    inflight = InFlight()
    older = Answers()
    first = inflight.start(_forever(), 0, "ag:s1", size=8, answers=older)
    plain = inflight.start(_forever(), 0, "plain")  # not a batch of an affinity: never handed on
    newest = Answers()
    last = inflight.start(_forever(), 0, "ag:s1", size=16, answers=newest)
    assert inflight.to_hand_on(15) is None  # larger than the queue: some of it may run
    assert inflight.to_hand_on(16) == (last, "ag:s1", False)
    newest.add(Result(index=0, text="x"))
    assert inflight.to_hand_on(64) is None  # begun: it, and what is older, are running
    inflight.remove(last)
    last.cancel()
    assert inflight.to_hand_on(64) == (first, "ag:s1", False)
    assert inflight.hand_on(first) == 8
    await asyncio.sleep(0)
    assert inflight.why(first) is Cancelled.HANDED_ON and first.cancelled()
    assert inflight.to_hand_on(64) is None and inflight.hand_on(first) == 0  # once
    assert inflight.why(plain) is None
    plain.cancel()


async def test_a_young_batch_begun_is_handed_on_only_within_its_age() -> None:
    """At a job's tail no turn waits, but the slow engine's newest batch has just begun
    while the others idle: sent under ``young_s`` ago and none of it answered, it is handed
    on (a few tokens thrown away); older, or with an answer in, it stays."""
    inflight = InFlight()
    answers = Answers()
    batch = inflight.start(_forever(), 0, "ag:s1", size=32, answers=answers)
    answers.t0 = time.monotonic() - 0.5  # sent half a second ago
    assert inflight.to_hand_on(0) is None  # no young_s: only what waits
    assert inflight.to_hand_on(0, young_s=0.8) == (batch, "ag:s1", True)
    answers.t0 = time.monotonic() - 0.9
    assert inflight.to_hand_on(0, young_s=0.8) is None  # too old
    assert inflight.to_hand_on(0, young_s=1.0) == (batch, "ag:s1", True)
    answers.add(Result(index=0, text="x"))
    assert inflight.to_hand_on(0, young_s=1.0) is None  # an answer in
    batch.cancel()


def test_a_batch_times_its_engines_decoding_from_the_gaps_between_its_answers() -> None:
    """Requests started together finish one token's decode apart per token of difference:
    the time between a batch's first answer and a later one, over the tokens between them,
    is the engine's decoding alone (its queue not in it), what a begun turn is handed on by."""
    pace = Pace()
    answers = Answers(pace)
    answers.t0 = time.monotonic() - 1.0  # a second in the queue and decoding
    answers.add(Result(index=0, text="x", usage=Usage(prompt_tokens=5, completion_tokens=8)))
    assert pace.decode_s_per_token is None  # one answer: no gap yet
    first_s, _ = answers.first or (0.0, 0)
    answers.first = (first_s - 0.32, 8)  # as if it came 0.32 s before the next
    answers.add(Result(index=1, text="y", usage=Usage(prompt_tokens=5, completion_tokens=24)))
    assert pace.decode_s_per_token == pytest.approx(0.02, rel=0.1)  # 0.32 s over 16 tokens
    assert pace.s_per_token is not None and pace.s_per_token > 0.04  # the queue counted
    answers.add(Result(index=2, text="z", usage=Usage(prompt_tokens=5, completion_tokens=10)))
    assert pace.decode_s_per_token == pytest.approx(0.02, rel=0.1)  # 2 tokens apart: no time
