"""Lanes against real Redis: an agent's next turn handed to the lane of the endpoint that
served its turn before, taken by that endpoint's drain loops before anything new, by another
endpoint only once it has waited ``lane_wait_ms`` with that endpoint having nothing else to
do (or once a busy engine's worker handed it on to the open lane), and never copied
speculatively."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarm_queue.common.errors import JobGoneError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import GROUP, OPEN_LANE, lane_name
from swarm_queue.common.models import JobSpec, PromptItem
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import Hungry, JobStore
from swarm_queue.common.store.steps import Move
from swarm_queue.flows.agents.spec import AgentSpec, build_agents
from swarm_queue.worker.inflight import Pace
from swarm_queue.worker.intake import Intake

A, B, C = "http://node-a:8000", "http://node-b:8000", "http://node-c:8000"


async def _no_sleep(_: float) -> bool:
    return True


async def _turn_job(store: JobStore) -> JobSpec:
    specs, _ = build_agents("lj", JobOptions(max_tokens=8), AgentSpec(max_turns=2), [], source="t")
    for spec in specs:
        await store.create_job(spec)
    turn = await store.load_spec("lj:s1")
    assert turn.affinity and not (await store.load_spec("lj")).affinity
    return turn


async def _move(store: JobStore, turn: JobSpec, lanes: list[str]) -> None:
    first = await store.enqueued_count(turn.job)
    moves = [
        Move(first + i, PromptItem.of(first + i, f"turn of {first + i}", None), lane=lane)
        for i, lane in enumerate(lanes)
    ]
    await store.move_on("lj", turn.job, first, moves, [], gen=turn.generation)


def _intake(store: JobStore, settings: Settings, endpoint: str) -> Intake:
    return Intake(store, f"w/{endpoint}", settings, endpoint, _no_sleep)


def _indices(taken: object) -> list[int]:
    assert taken is not None
    return sorted(int(eid.split(b"-")[1]) - 1 for eid, _, _ in taken.deliveries)  # type: ignore[attr-defined]


async def test_an_endpoint_takes_its_own_lane_and_others_wait(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(batch_size=8, lane_wait_ms=60_000)
    turn = await _turn_job(store)
    await _move(store, turn, [lane_name(A), lane_name(B), lane_name(A), lane_name(B)])
    a, b, c = (_intake(store, settings, e) for e in (A, B, C))

    status = await store.status(turn.job)
    assert (status.pending, status.in_flight) == (4, 0)  # queued in lanes, in no one's hands
    # C served none of these turns before: nothing for it (the lanes' wait is long).
    assert await c.next([turn], None, idle=True) is None
    got = [await a.next([turn], None), await b.next([turn], None)]
    assert [_indices(t) for t in got] == [[0, 2], [1, 3]]
    # (Queued in a lane is not running: taken from it, a turn counts no death.)
    assert [d for t in got if t is not None for _, _, d in t.deliveries] == [0, 0, 0, 0]
    assert await a.next([turn], None) is None
    status = await store.status(turn.job)
    assert (status.pending, status.in_flight) == (0, 4)


async def test_a_turn_that_waited_long_enough_goes_to_an_endpoint_with_nothing_else(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    turn = await _turn_job(store)
    await _move(store, turn, [lane_name(A)] * 3)
    waiting = _intake(store, make_settings(batch_size=8, lane_wait_ms=60_000), C)
    assert await waiting.next([turn], None, idle=True) is None
    eager = _intake(store, make_settings(batch_size=8, lane_wait_ms=0), C)
    taken = await eager.next([turn], None, idle=True)
    assert _indices(taken) == [0, 1, 2] and taken is not None and not taken.copy
    # Taken from the lane: A finds nothing left, and C holds them as its own work.
    assert await _intake(store, make_settings(batch_size=8), A).next([turn], None) is None
    held = await store.redis.xpending_range(
        store.keys.stream(turn.job), GROUP, "-", "+", 9, "w/" + C
    )
    assert len(held) == 3


async def test_a_lane_hand_over_never_takes_an_entry_queued_for_any_endpoint(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """An item with no lane (its turn before came from the cache) stays for any endpoint;
    items queued after it in lanes then stay for any endpoint too, so that no lane ever takes
    an entry that is not its own."""
    settings = make_settings(batch_size=8, lane_wait_ms=60_000)
    turn = await _turn_job(store)
    await _move(store, turn, ["", lane_name(A)])
    await _move(store, turn, [lane_name(B)])
    b = _intake(store, settings, B)
    assert _indices(await b.next([turn], None)) == [0, 1, 2]  # read as new: none in a lane
    await _move(store, turn, [lane_name(A), lane_name(B)])  # nothing left undelivered: handed
    assert _indices(await b.next([turn], None)) == [4]
    assert _indices(await _intake(store, settings, A).next([turn], None)) == [3]


async def test_an_agents_later_turns_are_never_copied_at_their_tail(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """A copy on another engine would compute the whole conversation again: an idle endpoint
    copies a plain job's batches at its tail, never a later turn's."""
    settings = make_settings(batch_size=8, lane_wait_ms=60_000)
    turn = await _turn_job(store)
    await _move(store, turn, [lane_name(B), lane_name(B)])
    await store.seal(turn.job, 2, gen=turn.generation)
    assert _indices(await _intake(store, settings, B).next([turn], None)) == [0, 1]
    assert await _intake(store, settings, C).next([turn], None, idle=True) is None


@pytest.mark.parametrize("endpoint", [A, "http://user:secret@node-a:8000/v1"])
def test_a_lane_is_named_by_its_endpoint_alone(endpoint: str) -> None:
    assert lane_name(endpoint).startswith("lane:") and "secret" not in lane_name(endpoint)
    assert lane_name(endpoint) != lane_name(B)


async def test_turns_handed_on_by_a_busy_engine_go_at_once_to_an_endpoint_with_nothing_else(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """Handed on, a turn is in the open lane as if it had waited the lane wait: an endpoint
    with nothing else takes it at once; the endpoint that handed it on takes nothing of
    another lane while its engine has sequences waiting; orphan reclaims (which wait the claim
    idle time) leave it alone; its running mark is taken back (no death); and an endpoint
    that finds nothing says so, which is what lets a busy engine's worker hand turns on."""
    settings = make_settings(batch_size=8, lane_wait_ms=30_000, claim_idle_ms=120_000, hand_on=True)
    turn = await _turn_job(store)
    await _move(store, turn, [lane_name(A)] * 3)
    a, b, c = (_intake(store, settings, e) for e in (A, B, C))
    assert await store.hungry(turn.job, lane_name(A)) is None
    paced = Pace()
    paced.s_per_token, paced.decode_s_per_token = 0.025, 0.02
    b.pace = lambda: paced
    assert await b.next([turn], None, idle=True) is None  # A's lane: not B's, not yet
    # B said so, with its paces, to the others: never to itself once busy again (a busy
    # engine's slower pace against its own idle one's would hand its turns on to nobody).
    assert await store.hungry(turn.job, lane_name(A)) == Hungry(0.025, 0.02, lane_name(B))
    assert await store.hungry(turn.job, lane_name(B)) is None
    taken = await a.next([turn], None)
    assert taken is not None
    ids = [eid for eid, _, _ in taken.deliveries]
    await store.start(turn.job, dict.fromkeys(ids, 0), gen=turn.generation)
    with pytest.raises(JobGoneError):
        await store.give_back(turn.job, "w/" + A, ids, idle_ms=30_000, gen="another")
    assert await store.give_back(turn.job, "w/" + A, ids, idle_ms=30_000, gen=turn.generation) == 3
    held = await store.redis.xpending_range(
        store.keys.stream(turn.job), GROUP, "-", "+", 9, OPEN_LANE
    )
    assert len(held) == 3
    assert await store.autoclaim(turn.job, "w/x", 120_000, 8) == []
    a.engine_busy = lambda: True
    assert await a.next([turn], None, idle=False) is None
    handed = await c.next([turn], None, idle=True)
    assert _indices(handed) == [0, 1, 2]
    assert handed is not None and [d for _, _, d in handed.deliveries] == [0, 0, 0]  # no death
    # C holds them now: A handing them on again changes nothing.
    assert await store.give_back(turn.job, "w/" + A, ids, idle_ms=30_000, gen=turn.generation) == 0
