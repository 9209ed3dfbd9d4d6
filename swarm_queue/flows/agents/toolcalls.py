"""Asking for tool calls on behalf of agents: each call named by its key (the tool and its
arguments), answered from what Redis keeps, or queued once on its tool's stream for the tool
runners while others who ask the same wait for that one answer (see :mod:`common.toolcall`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore
from swarm_queue.common.toolcall import ToolAnswer, claim_s, tool_key

__all__ = ["ToolCaller"]


class ToolCaller:
    """Tool calls through the runners of one Redis; counts what it queued and what it shared."""

    def __init__(self, store: FlowStore, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self.claim_s = claim_s(settings.tool_timeout_s)
        self.queued = 0  # calls this caller queued for the runners
        self.shared = 0  # calls answered by a run another asker (or an earlier one) started
        # When each call waited on was last asked again (monotonic): every quarter of a
        # claim's time, which renews its claim while its entry waits, or queues it again if
        # its entry is gone (a stream deleted, a Redis restarted without it).
        self._asked_at: dict[str, float] = {}

    async def ask(self, name: str, arguments: str) -> str:
        """Ask for a call; returns its key, to look its answer up with :meth:`answers`."""
        return (await self.ask_all([(name, arguments)]))[0]

    async def ask_all(self, calls: Sequence[tuple[str, str]]) -> list[str]:
        """Ask for ``calls`` (``(name, arguments)``) at once; returns their keys in order. Each
        distinct call is asked once, all of them together (a round of an agents' flow asks
        for hundreds: one after another, they held the next turns back); the repeats share
        its run."""
        keys = [tool_key(name, arguments) for name, arguments in calls]
        distinct = dict(zip(keys, calls, strict=True))
        await asyncio.gather(*(self._ask(k, *call) for k, call in distinct.items()))
        if repeats := len(keys) - len(distinct):
            self.shared += repeats
            await self.store.count_tools("shared", repeats)
        return keys

    async def _ask(
        self, key: str, name: str, arguments: str, again: bool = False
    ) -> ToolAnswer | None:
        """Queue a call unless it is answered, queued or running; returns its answer if in.
        Asked ``again`` (a call waited on), an answer that landed in between is this asker's
        own, not counted as shared."""
        self._asked_at[key] = time.monotonic()
        got = await self.store.ask_tool(key, name, arguments, self.claim_s)
        if got is True:
            self.queued += 1
            await self.store.count_tools("queued")
        elif not again:
            self.shared += 1
            await self.store.count_tools("shared")
        return got if isinstance(got, ToolAnswer) else None

    async def answers(self, calls: Sequence[tuple[str, str, str]]) -> list[ToolAnswer | None]:
        """The answers of ``calls`` (``(key, name, arguments)``), None where none is in yet. A
        call not answered is asked again when its claim is gone (its answer kept no longer,
        say) and every quarter of a claim's time (see ``_asked_at``)."""
        found = await self.store.tool_answers([k for k, _, _ in calls])
        missing = [i for i, a in enumerate(found) if a is None]
        held = await self.store.in_hand([calls[i][0] for i in missing])
        now = time.monotonic()
        self._forget(now)
        for i, claimed in zip(missing, held, strict=True):
            asked = self._asked_at.setdefault(calls[i][0], now)  # (by an earlier pump: now)
            if not claimed or now - asked >= self.claim_s / 4:
                found[i] = await self._ask(*calls[i], again=True)
        return found

    def _forget(self, now: float) -> None:
        """Forget the calls asked longer ago than a claim lasts (answered or gone)."""
        for key in [k for k, at in self._asked_at.items() if now - at > self.claim_s]:
            del self._asked_at[key]
