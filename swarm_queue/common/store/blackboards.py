"""Blackboards: the state of rounds of roles on a shared board, kept after every round so that
a driver that died resumes at its last finished round (see flows/rounds/blackboard.py)."""

from __future__ import annotations

from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors

__all__ = ["Blackboards"]


class Blackboards(StoreBase):
    """A blackboard's state, read and moved on round by round."""

    async def read_overview(self, name: str) -> tuple[int, bytes | None]:
        """``(rounds finished, state)`` of blackboard ``name`` (``(0, None)``: never run)."""
        async with redis_errors(self.url, name):
            rnd, state = await self.redis.hmget(self.keys.board(name), ["round", "state"])
        return int(rnd or 0), state

    async def write_board(self, name: str, read_at: int, state: bytes) -> bool:
        """Record round ``read_at + 1`` finished with ``state``; False (nothing written) when
        the board is no longer at round ``read_at``."""
        async with redis_errors(self.url, name):
            written = await self.scripts.board(
                keys=[self.keys.board(name)], args=[read_at, read_at + 1, state]
            )
        return bool(written)
