"""What the agents' flow keeps of each agent between its turns, in Redis: its counts so far
(:class:`AgentState`) and, while it waits on its tools, its place (:class:`Waiting`)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from swarm_queue.common.chat import Message, ToolCall
from swarm_queue.common.keys import lane_name
from swarm_queue.common.models import PromptItem, Result
from swarm_queue.common.toolcall import ToolAnswer
from swarm_queue.flows.agents.spec import not_offered

__all__ = [
    "AgentState",
    "Onward",
    "Waiting",
    "answers_of",
    "counting",
    "decode_state",
    "decode_waiting",
    "encode",
    "lane_of",
]


class AgentState(msgspec.Struct):
    """An agent between turns: what it has used so far."""

    turns: int = 0
    repairs: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_runs: int = 0  # the runs behind its tools' answers (a call run twice counts 2)
    tools_cut: int = 0  # its tools' answers cut to SWARM_TOOL_MAX_BYTES
    # The last turn whose answer these counts hold, and the state before it was counted: a
    # pump that recorded a turn and died before acknowledging it leaves the turn to the
    # next, which counts it again from there, not on top (seen: 4 turns of 3).
    counted: int = -1
    prior: bytes = b""


class Waiting(msgspec.Struct, frozen=True):
    """A parked agent: the turn it asked from, its conversation, its calls (key, call; the
    key "" for a tool its job did not offer: never asked of a runner), the lane of the
    endpoint that served that turn (where its next turn is queued), and since when it waits
    (Redis's clock, s)."""

    turn: int
    item: PromptItem
    calls: list[tuple[str, ToolCall]]
    lane: str = ""
    since_s: float = 0.0
    # The answers read so far, by call (None: not yet): kept with the agent, so that an
    # answer expiring from Redis before its last sibling comes in is never asked again.
    answers: list[ToolAnswer | None] = []


Onward = tuple[int, PromptItem, tuple[Message, ...], str]


def answers_of(
    w: Waiting, got: Mapping[str, ToolAnswer | None], offered: list[str]
) -> list[ToolAnswer | None]:
    """The answers of a parked agent's calls as far as they are in: those it kept, those
    ``got`` now (by key), and for a tool its job did not offer, the refusal."""
    return [
        a if a is not None else got.get(key) if key else not_offered(c.name, offered)
        for (key, c), a in zip(w.calls, w.answers or [None] * len(w.calls), strict=True)
    ]


def counting(state: AgentState, k: int) -> AgentState:
    """``state`` ready to count turn ``k``'s answer in: from before it, if a pump that died
    counted it already, and with that start kept."""
    if state.counted == k and state.prior:
        state = decode_state(state.prior)
    state.prior = encode(msgspec.structs.replace(state, prior=b""))
    state.counted = k
    return state


def lane_of(r: Result | None) -> str:
    """The lane of the endpoint that computed ``r`` (none for an answer from the cache)."""
    return lane_name(r.endpoint) if r is not None and r.endpoint and not r.cached else ""


decode_state = msgspec.msgpack.Decoder(AgentState).decode
decode_waiting = msgspec.msgpack.Decoder(Waiting).decode
encode = msgspec.msgpack.Encoder().encode
