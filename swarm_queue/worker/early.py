"""Answers of a batch committed as they come, not all at the batch's end: for a job whose
answers move on (a later step, an agent's next turn) and whose batch is one request per prompt
(chat), so an answer's next step starts without waiting for the batch's longest answer. Each
commit is the usual atomic "write results + ack" (first write wins); the answers that arrive
while one is under way go together in the next, so there is at most one commit in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from swarm_queue.common.models import Result
from swarm_queue.common.store import Commit
from swarm_queue.worker.deliveries import Decoded

__all__ = ["EarlyCommits"]

# (entry ID, result, the entry's payload), as a commit takes them.
Written = tuple[bytes, Result, bytes | None]
CommitFn = Callable[[list[Written]], Awaitable[Commit]]


class EarlyCommits:
    """The answers of one batch's ``items``, each committed through ``commit`` as it comes
    (``shape`` first: the per-prompt measure, the schema check), then ``committed`` told."""

    def __init__(
        self,
        items: list[Decoded],
        commit: CommitFn,
        shape: Callable[[Result], Result],
        committed: Callable[[Commit], None],
    ) -> None:
        self._where: dict[int, list[Decoded]] = {}
        for d in items:
            self._where.setdefault(d[2].index, []).append(d)
        self._commit, self._shape, self._committed = commit, shape, committed
        self._waiting: list[Written] = []
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self.ids: set[bytes] = set()  # entries whose answers are committed
        self.shaped: dict[bytes, Result] = {}  # each answer as shaped, by entry

    def add(self, result: Result) -> None:
        """One prompt's answer (or its failure alone), committed soon."""
        found = self._where.get(result.index)
        if not found:
            return  # not one of this batch's (cannot happen: the runner answers its items)
        eid, payload, _ = found.pop()
        self.shaped[eid] = shaped = self._shape(result)
        self._waiting.append((eid, shaped, payload))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._waiting and self._error is None:
            part, self._waiting = self._waiting, []
            try:
                commit = await self._commit(part)  # (each result carries its usage)
            except Exception as exc:  # the job gone, a bad record: the batch's end says so
                self._error = exc
                return
            self.ids.update(eid for eid, _, _ in part)
            self._committed(commit)

    async def settle(self) -> None:
        """Wait for the commits under way; raise what one of them raised."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self._error is not None:
            raise self._error
