"""Which source a drain loop looks at next, and when it looks again: pure, without Redis (the
races of the intake's bookkeeping are tested here, its Redis side in test_lanes.py,
test_reliability.py and test_speculation.py)."""

from __future__ import annotations

from swarm_queue.common.models import JobSpec
from swarm_queue.worker.sources import Cadence, Source, plan

PLAIN = JobSpec(job="plain")
TURNS = JobSpec(job="ag:s1", affinity=True)


def _looks(jobs: list[JobSpec], **state: bool) -> list[tuple[str, str]]:
    options = {"idle": True, "engine_busy": False, "speculate": True} | state
    return [(spec.job, source.name) for spec, source in plan(jobs, **options)]


def test_every_jobs_own_entries_come_before_any_other_lane_or_copy() -> None:
    assert _looks([TURNS, PLAIN]) == [
        ("ag:s1", "RECLAIMED"),
        ("ag:s1", "LANE"),
        ("ag:s1", "NEW"),
        ("plain", "RECLAIMED"),
        ("plain", "NEW"),
        ("ag:s1", "STOLEN"),
        ("plain", "COPIES"),
    ]


def test_a_busy_engine_takes_no_other_lanes_turns_and_a_busy_endpoint_no_copies() -> None:
    own = [("ag:s1", "RECLAIMED"), ("ag:s1", "LANE"), ("ag:s1", "NEW")]
    own += [("plain", "RECLAIMED"), ("plain", "NEW")]
    assert _looks([TURNS, PLAIN], engine_busy=True) == [*own, ("plain", "COPIES")]
    assert _looks([TURNS, PLAIN], idle=False) == [*own, ("ag:s1", "STOLEN")]
    assert _looks([TURNS, PLAIN], speculate=False) == [*own, ("ag:s1", "STOLEN")]


def test_turns_of_an_affinity_are_never_copied() -> None:
    """A copy of an agent's turn would compute its whole conversation again elsewhere."""
    assert Source.COPIES not in {
        step.source for step in plan([TURNS], idle=True, engine_busy=False, speculate=True)
    }


def test_a_source_is_looked_at_again_at_once_after_a_full_batch_and_rests_after_less() -> None:
    now = [100.0]
    cadence = Cadence(clock=lambda: now[0])
    assert cadence.due("j")  # never looked at
    cadence.rest("j", full=False, rest_s=2.0)
    assert not cadence.due("j") and cadence.due("other")  # each job its own
    now[0] += 2.0
    assert cadence.due("j")
    cadence.rest("j", full=True, rest_s=2.0)  # a full batch: more may wait
    assert cadence.due("j")
    cadence.rest("j", full=False, rest_s=2.0)
    cadence.now("j")  # entries released: look on the next step
    assert cadence.due("j")
