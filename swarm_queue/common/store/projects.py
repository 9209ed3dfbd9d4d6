"""Projects as the fleet shares them: each one's cap (the most lines its jobs may have in
flight at once, across the fleet) and how many they have now."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.keys import GROUP, validate_job_name
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors

__all__ = ["Projects"]


class Projects(StoreBase):
    """Caps on projects' lines in flight (set by an operator: ``swarm-jobs --cap``)."""

    async def project_caps(self) -> dict[str, int]:
        """Every capped project's cap (lines in flight); a value that is no positive count
        (another tool's write) is no cap."""
        async with redis_errors(self.url, "", self.keys.project_caps):
            raw = await self.redis.hgetall(self.keys.project_caps)
        caps = {}
        for name, value in raw.items():
            if value.isdigit() and int(value) > 0:
                caps[name.decode(errors="replace")] = int(value)
        return caps

    async def set_project_cap(self, project: str, lines: int | None) -> None:
        """Cap ``project``'s lines in flight at ``lines`` (None: no cap). A cap of 0 would
        keep its jobs from ever ending, so it is refused."""
        validate_job_name(project)
        if lines is not None and lines < 1:
            raise ConfigError(
                f"a cap of {lines} lines would keep project {project!r}'s jobs from ever "
                "ending: give at least 1, or cancel its jobs (swarm-cancel)"
            )
        async with redis_errors(self.url, "", self.keys.project_caps):
            if lines is None:
                await self.redis.hdel(self.keys.project_caps, project)
            else:
                await self.redis.hset(self.keys.project_caps, project, str(lines))

    async def in_flight(self, jobs: Mapping[str, int]) -> int:
        """The lines of ``jobs`` (each with its prompts an entry: its chunk) taken by the fleet
        and not yet finished: their consumer groups' pending entries (in workers' hands, or
        waiting in an endpoint's lane), a chunk counted whole."""

        async def pending(job: str, chunk: int) -> int:
            async with redis_errors(self.url, job):
                n, *_ = await self.scripts.backlog(keys=[self.keys.stream(job)], args=[GROUP])
            return int(n) * chunk

        # (each job is its own slot on a Cluster: one script each, all at once)
        return sum(await asyncio.gather(*(pending(j, k) for j, k in jobs.items())))
