"""Rounds of roles on a shared board (the blackboard pattern): each round, every role's prompt
is built from the board as it stands, the round's prompts are answered on the fleet as one
job (``board:b1``, ``board:b2``...), and the answers are written to their roles' sections. The
board is kept in Redis after every round: a driver that dies resumes at its last finished
round, and a round's job, queued again from the same board, resumes rather than repeats.

Roles are sections of the board; ``agents`` says how many answers each role gives a round.
The prompt function must be a function of the role and the board alone (a rerun rebuilds the
same prompts from the same board).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec

from swarm_queue.common.errors import ConfigError, JobConflictError
from swarm_queue.common.keys import round_name, validate_job_name
from swarm_queue.common.models import Result
from swarm_queue.common.store import FlowStore

__all__ = ["Blackboard", "BoardState", "RoundFailure"]

Sections = dict[str, list[str]]
# Answers a round's prompts (``(prompt, custom_id)``) as the job named: its results in order.
RoundRunner = Callable[[str, list[tuple[str, str | None]]], Awaitable[list[Result]]]


class RoundFailure(msgspec.Struct, frozen=True):
    """An answer a round did not get: its role and why."""

    round: int
    role: str
    error: str


class BoardState(msgspec.Struct):
    """A blackboard as kept in Redis: its sections, the rounds finished, what failed, and
    whether its stop condition held."""

    sections: Sections
    rounds: int = 0
    failed: list[RoundFailure] = msgspec.field(default_factory=list)
    done: bool = False


_decoder = msgspec.msgpack.Decoder(BoardState)
_encoder = msgspec.msgpack.Encoder()


class Blackboard:
    """Blackboard ``name`` with ``sections`` (its roles), ``prompt(role, sections)`` building
    each role's prompt; ``agents``: answers per role and round (one number for all)."""

    def __init__(
        self,
        store: FlowStore,
        name: str,
        sections: Sequence[str],
        prompt: Callable[[str, Sections], str],
        *,
        agents: Mapping[str, int] | int = 1,
    ) -> None:
        self.store, self.name = store, validate_job_name(name)
        if not sections or len(set(sections)) != len(sections):
            raise ConfigError("a blackboard needs its sections, each named once")
        self.sections = list(sections)
        self.prompt = prompt
        counts = agents if isinstance(agents, Mapping) else dict.fromkeys(sections, agents)
        unknown = set(counts) - set(sections)
        if unknown:
            raise ConfigError(f"agents for roles that are no section: {sorted(unknown)}")
        self.agents = {s: counts.get(s, 0) for s in sections}
        if any(n < 0 for n in self.agents.values()) or not any(self.agents.values()):
            raise ConfigError("agents: a number >= 0 per role, and some role must answer")

    async def state(self) -> BoardState:
        """The board as Redis keeps it (empty sections before its first round)."""
        rounds, raw = await self.store.read_overview(self.name)
        if raw is None:
            return BoardState({s: [] for s in self.sections})
        state = _decoder.decode(raw)
        if list(state.sections) != self.sections:
            raise ConfigError(
                f"blackboard {self.name!r} has sections {list(state.sections)}, not "
                f"{self.sections}: use another name"
            )
        state.rounds = rounds
        return state

    async def run(
        self,
        answer: RoundRunner,
        *,
        max_rounds: int,
        until: Callable[[Sections], bool] | None = None,
    ) -> BoardState:
        """Run rounds until ``max_rounds`` are finished or ``until(sections)`` holds after
        one, resuming after the last round the board records; the board at the end."""
        while True:
            state = await self.state()
            if state.done or state.rounds >= max_rounds:
                return state
            await self._round(state, answer, until)

    async def _round(
        self, state: BoardState, answer: RoundRunner, until: Callable[[Sections], bool] | None
    ) -> None:
        n = state.rounds + 1
        prompts: list[tuple[str, str | None]] = []
        for role in self.sections:
            text = self.prompt(role, copy.deepcopy(state.sections))
            prompts += [(text, f"{role}/{a}") for a in range(self.agents[role])]
        results = await answer(round_name(self.name, n), prompts)
        after = BoardState(copy.deepcopy(state.sections), n, list(state.failed))
        for (_, tag), r in zip(prompts, results, strict=True):
            role = (tag or "").rpartition("/")[0]
            if r.ok and r.text is not None:
                after.sections[role].append(r.text)
            else:
                after.failed.append(RoundFailure(n, role, r.error or "no answer"))
        after.done = bool(until is not None and until(after.sections))
        if not await self.store.write_board(self.name, state.rounds, _encoder.encode(after)):
            raise JobConflictError(
                f"blackboard {self.name!r} moved past round {state.rounds} meanwhile: another "
                "driver runs it"
            )
