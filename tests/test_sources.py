"""Which source a drain loop looks at next, and when it looks again: pure, without Redis (the
races of the intake's bookkeeping are tested here, its Redis side in test_lanes.py,
test_reliability.py and test_speculation.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.worker.sources import (
    NO_COPIES_REST_S,
    Cadence,
    Copies,
    Looks,
    Reclaimed,
    Source,
    plan,
)

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


class _Store:
    """What Reclaimed and Copies ask of the store, each ask noted; ``orphaned`` entries wait."""

    def __init__(self, orphaned: int = 0) -> None:
        self.orphaned = orphaned
        self.asked: list[tuple[str, str]] = []

    async def autoclaim(self, job: str, consumer: str, idle_ms: int, count: int) -> list[Any]:
        self.asked.append(("claim", consumer))
        got = [(f"0-{i}".encode(), b"p", 0) for i in range(min(count, self.orphaned))]
        self.orphaned -= len(got)
        return got

    async def copies(self, job: str, consumer: str, count: int, **kw: Any) -> list[Any]:
        self.asked.append(("copy", consumer))
        return []


async def test_one_endpoint_of_a_process_looks_for_orphaned_entries_for_all_of_them(
    make_settings: Callable[..., Settings],
) -> None:
    """A thousand idle endpoints each claiming every two seconds cost Redis more than the job
    (issue 50): the endpoints of a process share when it looks next; a full claim lets the
    next endpoint claim on at once (more may wait)."""
    now = [0.0]
    looks = Looks(clock=lambda: now[0])
    store = _Store(orphaned=3)
    settings = make_settings(claim_idle_ms=8_000)  # a look every 2 s
    a, b = (Reclaimed(store, c, settings, c, looks.reclaim) for c in ("w|a", "w|b"))
    spec = JobSpec(job="j")
    assert len(await a.take(spec, set(), 2)) == 2  # full: more may wait
    assert len(await b.take(spec, set(), 2)) == 1
    assert await a.take(spec, set(), 2) == [] and await b.take(spec, set(), 2) == []
    assert store.asked == [("claim", "w|a"), ("claim", "w|b")]  # the rest without Redis
    now[0] += 2.0
    assert await b.take(spec, set(), 2) == [] and await a.take(spec, set(), 2) == []
    assert store.asked[2:] == [("claim", "w|b")]


async def test_one_idle_endpoint_of_a_process_looks_for_copies_for_all_of_them(
    make_settings: Callable[..., Settings],
) -> None:
    now = [0.0]
    looks = Looks(clock=lambda: now[0])
    store = _Store()
    a, b = (Copies(store, c, make_settings(), looks.copies) for c in ("w|a", "w|b"))
    spec = JobSpec(job="j")
    for _ in range(3):
        assert await a.take(spec, 32) == [] and await b.take(spec, 32) == []
    now[0] += NO_COPIES_REST_S
    assert await b.take(spec, 32) == [] and await a.take(spec, 32) == []
    assert store.asked == [("copy", "w|a"), ("copy", "w|b")]
