"""A project's cap on its lines in flight, with real worker processes and a real Redis: the
jobs of a capped project never have more of their prompts taken at once than its cap (all
of its jobs together), every answer is exact, and the cap is set, shown and lifted with
``swarm-jobs``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.caps import ProjectCaps
from swarm_queue.worker.intake import Intake
from tests.harness import BIN, Fleet, FleetFactory, check_output
from tests.helpers import prompts


def _jobs(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / "swarm-jobs", *args], env=fleet.env, capture_output=True, text=True, timeout=60
    )


def _fleet(fleet_factory: FleetFactory) -> Fleet:
    """One endpoint of 16 sequences: alone, its worker would have 4 batches of 2 in flight."""
    return fleet_factory(1, "--step-ms", "10", "--max-num-seqs", "16")


def _drain(fleet: Fleet, jobs: dict[str, int]) -> None:
    worker = fleet.worker(
        "w", [0], SWARM_BATCH_SIZE="2", SWARM_INFLIGHT_MAX="0", SWARM_INFLIGHT="4"
    )
    assert worker.wait(timeout=300) == 0, fleet.logs[-1].read_text()[-3000:]
    for job, n in jobs.items():
        collect = fleet.collect(job)
        _, err = collect.communicate(timeout=60)
        assert collect.returncode == 0, err
        check_output(fleet.tmp / f"{job}.jsonl", n, set())


def test_the_jobs_of_a_capped_project_never_have_more_lines_in_flight_than_its_cap(
    fleet_factory: FleetFactory,
) -> None:
    fleet = _fleet(fleet_factory)
    set_cap = _jobs(fleet, "--cap", "lab=3")
    assert set_cap.returncode == 0, set_cap.stderr
    assert set_cap.stdout == "project lab: at most 3 lines in flight\n"
    for job in ("one", "two"):  # (one prompt an entry: a chunk is taken whole)
        assert fleet.enqueue(job, 40, set(), "--project", "lab", "--chunk", "1").wait(60) == 0
    _drain(fleet, {"one": 40, "two": 40})
    # Both jobs' 80 prompts, never more than 3 of them running at once (8 without the cap).
    assert fleet.answered(0) == 80
    assert fleet.peak(0) == 3
    assert "project lab: at most 3 lines in flight" in _jobs(fleet).stdout


def test_a_lifted_cap_leaves_the_project_the_whole_fleet(fleet_factory: FleetFactory) -> None:
    fleet = _fleet(fleet_factory)
    assert _jobs(fleet, "--cap", "lab=3").returncode == 0
    lifted = _jobs(fleet, "--cap", "lab=none")
    assert lifted.stdout == "project lab: no cap\n"
    assert fleet.enqueue("one", 40, set(), "--project", "lab").wait(timeout=60) == 0
    _drain(fleet, {"one": 40})
    assert fleet.peak(0) > 3
    assert "project lab" not in _jobs(fleet).stdout


def test_a_cap_that_would_keep_a_project_from_ending_is_refused_with_its_reason(
    fleet_factory: FleetFactory,
) -> None:
    fleet = _fleet(fleet_factory)
    zero = _jobs(fleet, "--cap", "lab=0")
    assert zero.returncode != 0
    assert "a cap of 0 lines would keep project 'lab''s jobs from ever ending" in zero.stderr
    bad = _jobs(fleet, "--cap", "lab")
    assert bad.returncode == 2
    assert "'lab' is not PROJECT=LINES" in bad.stderr


async def test_a_grant_is_the_cap_less_the_projects_lines_in_flight_across_its_jobs(
    store: JobStore,
) -> None:
    """Every job of the project counts, whatever worker holds its lines; other projects'
    jobs do not; what a process was granted and has not yet taken counts until settled."""
    for job, project in (("a", "lab"), ("b", "lab"), ("c", "other")):
        await enqueue_prompts(store, JobSpec(job=job, project=project), prompts(10))
    await store.read_keyed("a", "w1|http://x", 3)  # in flight: 3 of a, 4 of b, 5 of c
    await store.read_keyed("b", "w2|http://y", 4)
    await store.read_keyed("c", "w2|http://y", 5)
    specs = {name: await store.load_spec(name) for name in ("a", "b", "c")}
    caps = ProjectCaps(store, lambda: specs)
    await store.set_project_cap("lab", 10)
    await caps.read()
    assert await caps.grant(specs["a"], 8) == 3  # 10 - 7
    assert await caps.grant(specs["b"], 8) == 0  # the 3 granted are not taken yet
    await caps.settle(specs["a"], 3)  # taken: Redis counts them now
    await store.read_keyed("a", "w1|http://x", 3)
    assert await caps.grant(specs["b"], 8) == 0
    assert await caps.grant(specs["c"], 8) == 8  # no cap on its project


async def test_a_look_at_a_job_whose_project_is_at_its_cap_waits_a_poll_not_spinning(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """Where a blocking read would have waited for entries, a capped job's look waits as long
    (before, it returned at once, and the endpoint's lookout asked again and again)."""
    await enqueue_prompts(store, JobSpec(job="j", project="lab"), prompts(4))
    slept: list[float] = []

    async def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return False

    intake = Intake(store, "w|http://a", make_settings(batch_size=2), "http://a", sleep)

    class Full:
        async def grant(self, spec: JobSpec, want: int) -> int:
            return 0

        async def settle(self, spec: JobSpec, granted: int) -> None:
            return None

        def capped(self, spec: JobSpec) -> bool:
            return True

    intake.caps = Full()
    assert await intake.next([await store.load_spec("j")], 200) is None
    assert slept == [0.2]
