"""Asking for tool calls on behalf of agents: each call named by its key (the tool and its
arguments), answered from what Redis keeps, or claimed and queued once for the tool runners
while others who ask the same wait for that one answer (see :mod:`common.tools`)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Sequence

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix

from swarm_queue.common.errors import StoreUnavailable
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import FlowStore, redis_errors
from swarm_queue.common.tools import (
    BEGUN,
    CLAIM_UNQUEUED_S,
    START_GRACE_S,
    ToolAnswer,
    claim_s,
    tool_key,
)

__all__ = ["ToolCaller"]

log = logging.getLogger("swarm.pump")


class ToolCaller:
    """Tool calls through the runners of one Redis; counts what it ran and what it shared."""

    def __init__(self, store: FlowStore, pool: ArqRedis, settings: Settings) -> None:
        self.store, self.pool, self.settings = store, pool, settings
        self.claim_s = claim_s(settings.tool_timeout_s)
        self.queued = 0  # calls this caller handed to the runners
        self.shared = 0  # calls answered by a run another asker (or an earlier one) started
        self.start_grace_s = START_GRACE_S
        # Tries looked at for loss: call key and claim -> (first seen, next look (monotonic),
        # whether the last look found it lost).
        self._unbegun: dict[str, tuple[float, float, bool]] = {}
        # Calls asked again for a try taken and never begun: key -> when (monotonic).
        self._asked_again: dict[str, float] = {}

    async def ask(self, name: str, arguments: str) -> str:
        """Ask for a call; returns its key, to look its answer up with :meth:`answers`."""
        return (await self.ask_all([(name, arguments)]))[0]

    async def ask_all(self, calls: Sequence[tuple[str, str]]) -> list[str]:
        """Ask for ``calls`` (``(name, arguments)``) at once; returns their keys in order. Each
        distinct call is claimed once, all of them together (a round of an agents' flow asks
        for hundreds: one after another, they held the next turns back); the repeats share
        its run."""
        keys = [tool_key(name, arguments) for name, arguments in calls]
        distinct = dict(zip(keys, calls, strict=True))
        await asyncio.gather(*(self._start(k, *call) for k, call in distinct.items()))
        if repeats := len(keys) - len(distinct):
            self.shared += repeats
            await self.store.count_tools("shared", repeats)
        return keys

    async def _start(
        self, key: str, name: str, arguments: str, again: bool = False
    ) -> ToolAnswer | None:
        """Claim and queue a call unless it is answered or held; returns its answer if in.
        Asked ``again`` (the same call, found neither answered nor held a moment before), an
        answer that landed in between is this asker's own, not counted as shared."""
        # Claimed for a moment, and for the call's whole time once its try is queued: a try
        # never queued (Redis lost in between, or restarted without it) leaves a claim that
        # ends in seconds, and the call is asked again, not waited on for minutes (seen:
        # agents parked for good on a call whose claim outlived its lost try).
        got = await self.store.claim_tool(key, CLAIM_UNQUEUED_S)
        if isinstance(got, ToolAnswer) or not got:  # answered, or in another's hands
            if not again:
                self.shared += 1
                await self.store.count_tools("shared")
            return got if isinstance(got, ToolAnswer) else None
        await self._queue(key, name, arguments)
        return None

    async def _queue(self, key: str, name: str, arguments: str) -> None:
        """Queue a try of the call this asker has just claimed, and hold the claim for the
        call's whole time, naming the try."""
        try_id = self.settings.keys.tool_job_id(key, uuid.uuid4().hex)
        async with redis_errors(self.settings.redis_url):  # arq's client: its errors ours
            await self._enqueue(name, arguments, key, try_id)
        await self.store.hold_claim(key, self.claim_s, try_id)
        self.queued += 1
        await self.store.count_tools("queued")

    async def _enqueue(self, name: str, arguments: str, key: str, try_id: str) -> None:
        keys = self.settings.keys
        queued = await self.pool.enqueue_job(
            "run_tool",
            name,
            arguments,
            key,
            # The tool's own queue: only runners that allow the tool take from it.
            _queue_name=keys.tool_queue(name),
            _job_id=try_id,
            # A try not started within its claim is stale: its asker asks again by then.
            _expires=self.claim_s,
        )
        if queued is None:
            # The ID is new, so arq refused nothing: it returns None when its transaction's
            # WATCH broke, and redis-py breaks it when the connection is lost mid-transaction
            # (a Redis restarting). The try is not queued; its claim must not be held for the
            # call's whole time (seen: an agent parked for good after a restart).
            raise StoreUnavailable(
                f"Redis at {mask_url(self.settings.redis_url)} unavailable: the {name!r} try "
                "was not queued (the connection was lost while queuing it)"
            )

    async def answers(self, calls: Sequence[tuple[str, str, str]]) -> list[ToolAnswer | None]:
        """The answers of ``calls`` (``(key, name, arguments)``), None where none is in yet. A
        call neither answered nor in a runner's hands (its runner died, its claim expired, or
        its answer was kept no longer) is asked for again, and so is one whose try was lost:
        marked taken by arq and begun by no runner, or begun by a runner that is gone
        (:meth:`_lost`)."""
        found = await self.store.tool_answers([k for k, _, _ in calls])
        missing = [i for i, a in enumerate(found) if a is None]
        claims = await self.store.claims([calls[i][0] for i in missing])
        self._forget_unbegun()
        for i, claim in zip(missing, claims, strict=True):
            if claim is None:  # its runner finished between the two reads, or died
                found[i] = await self._start(*calls[i], again=True)
            elif claim != b"1" and await self._lost(calls[i], claim):
                key, name, arguments = calls[i]
                if await self.store.retake_claim(key, claim, CLAIM_UNQUEUED_S):
                    why = "its runner is gone" if claim.startswith(BEGUN) else "no runner took it"
                    log.warning("tool call %s: %s; asked again", key, why)
                    self._asked_again[key] = time.monotonic()
                    await self._queue(key, name, arguments)
        return found

    async def _lost(self, call: tuple[str, str, str], claim: bytes) -> bool:
        """Whether the try ``claim`` names was lost, seen so at two looks
        :attr:`start_grace_s` apart (one could fall between a runner's taking a try and its
        beginning it): queued and marked taken by arq yet begun by no runner, or begun by a
        runner that no longer serves the tool (see ``START_GRACE_S``). A try waiting its turn
        in the queue, or running on a live runner, is not lost."""
        key, name, _ = call
        now = time.monotonic()
        if not claim.startswith(BEGUN) and now - self._asked_again.get(key, -math.inf) < (
            self.claim_s
        ):
            # Asked again once for an unbegun try: a runner of an earlier version, which
            # never says it began, may hold this one too; its claim's time is the bound.
            return False
        seen = key + "\0" + claim.decode()
        first, look, lost_before = self._unbegun.setdefault(
            seen, (now, now + self.start_grace_s, False)
        )
        if now < look:
            return False
        if claim.startswith(BEGUN):
            label = claim[len(BEGUN) :].decode()
            lost = not await self.store.runner_serves(name, label)
        else:
            async with redis_errors(self.settings.redis_url):
                lost = bool(await self.pool.exists(in_progress_key_prefix + claim.decode()))
        self._unbegun[seen] = (first, now + self.start_grace_s, lost)
        return lost and lost_before

    def _forget_unbegun(self) -> None:
        """Forget the tries looked at longer ago than a claim lasts (answered or gone)."""
        old = time.monotonic() - self.claim_s
        for try_id in [t for t, (first, _, _) in self._unbegun.items() if first < old]:
            del self._unbegun[try_id]
        for key in [k for k, at in self._asked_again.items() if at < old]:
            del self._asked_again[key]
