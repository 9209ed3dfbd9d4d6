"""Broadcast and blackboard rounds on the queue, with a real worker process: each round one
job, the board in Redis, a driver that dies mid-run resuming at its last finished round."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarm_queue.common.errors import ConfigError, JobConflictError
from swarm_queue.common.keys import Keys, round_name
from swarm_queue.common.models import Result
from swarm_queue.common.store import JobStore
from swarm_queue.flows.rounds.blackboard import Blackboard
from swarm_queue.producer.api import Swarm
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import FleetFactory

SECTIONS = ["hypotheses", "critiques"]
AGENTS = {"hypotheses": 2, "critiques": 1}


def ask(role: str, board: dict[str, list[str]]) -> str:
    """The prompt of ``role``: the board as it stands, and the role's task."""
    seen = "; ".join(f"{k}: {len(v)} ({' | '.join(v[-2:])})" for k, v in board.items())
    return f"Board: {seen}\nAs the {role}, add one entry."


def replay(rounds: int) -> dict[str, list[str]]:
    """The board the simulator's deterministic answers make after ``rounds`` rounds."""
    board: dict[str, list[str]] = {s: [] for s in SECTIONS}
    for _ in range(rounds):
        new = {s: list(v) for s, v in board.items()}
        for role in SECTIONS:
            text = completion_for(ask(role, board), 10)[0]
            new[role] += [text] * AGENTS[role]
        board = new
    return board


class _Crash(Exception):
    pass


async def test_a_blackboard_resumes_at_its_last_finished_round(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(2)
    fleet.worker("w", [0, 1], burst=False)
    crash_at = 3

    def dies(role: str, board: dict[str, list[str]]) -> str:
        if len(board["critiques"]) == crash_at - 1:  # round 3 is being built: the driver dies
            raise _Crash
        return ask(role, board)

    async with Swarm(fleet.redis_url, prefix=fleet.prefix, poll_ms=50) as swarm:
        with pytest.raises(_Crash):
            await swarm.blackboard(
                "study", SECTIONS, dies, max_rounds=5, agents=AGENTS, max_tokens=10
            )
        jobs = set(await swarm.store.list_jobs())
        assert {round_name("study", 1), round_name("study", 2)} <= jobs
        assert round_name("study", 3) not in jobs
        board = await swarm.blackboard(
            "study", SECTIONS, ask, max_rounds=5, agents=AGENTS, max_tokens=10
        )
        assert board.rounds == 5 and board.sections == replay(5) and not board.failed
        # Rounds 1 and 2 ran once: their jobs hold their three prompts, answered once.
        for n in (1, 2):
            status = await swarm.status(round_name("study", n))
            assert (status.total, status.done, status.failed) == (3, 3, 0)
        # Run again: finished, nothing more is asked.
        again = await swarm.blackboard(
            "study", SECTIONS, ask, max_rounds=5, agents=AGENTS, max_tokens=10
        )
        assert again.sections == board.sections
        assert round_name("study", 6) not in await swarm.store.list_jobs()
        with pytest.raises(ConfigError, match="has sections"):
            await swarm.blackboard("study", ["other"], ask, max_rounds=6)
    keys = Keys(fleet.prefix)
    assert keys.board("study") == f"{fleet.prefix}:{{study}}:board"


async def test_a_blackboard_stops_when_its_condition_holds_and_broadcast_answers_n_times(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet]
) -> None:
    async with (
        sim_fleet(1) as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        board = await swarm.blackboard(
            "b",
            SECTIONS,
            ask,
            max_rounds=10,
            agents=AGENTS,
            until=lambda s: len(s["hypotheses"]) >= 4,
            max_tokens=10,
        )
        answers = await swarm.broadcast("Name one enzyme.", 5, max_tokens=6, temperature=0.9)
    assert board.rounds == 2 and board.done and board.sections == replay(2)
    assert [r.custom_id for r in answers] == [f"agent-{i}" for i in range(5)]
    assert all(r.text == completion_for("Name one enzyme.", 6)[0] for r in answers)


async def test_a_second_driver_of_one_board_is_refused(store: JobStore) -> None:
    board = Blackboard(store, "twice", SECTIONS, ask)
    calls = 0

    async def answer(job: str, prompts: list[tuple[str, str | None]]) -> list[Result]:
        nonlocal calls
        calls += 1
        if calls == 1:  # another driver finishes this round meanwhile
            assert await store.write_board("twice", 0, b"\x81\xa8sections\x80")
        return [Result(index=i, text="x") for i in range(len(prompts))]

    with pytest.raises(JobConflictError, match="'twice' moved past round 0 meanwhile"):
        await board.run(answer, max_rounds=2)
