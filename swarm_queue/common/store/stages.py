"""The reduce stage's records: which tree level runs, and its output, written once."""

from __future__ import annotations

from collections.abc import Sequence

from swarm_queue.common.final import ReduceOutput, decode_final, encode_final
from swarm_queue.common.keys import stage_name, step_of
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors, replies
from swarm_queue.common.vocab import Meta

__all__ = ["Stages"]


class Stages(StoreBase):
    """Where each job's reduce stands, as workers advance it level by level."""

    async def reduces_pending(self, names: Sequence[str]) -> list[tuple[str, int, bool]]:
        """For each job among ``names`` whose reduce has not finished (nor been cancelled):
        ``(job, level of its current stage, whether that stage has finished)``."""
        # A job's own reduce, or a pipeline's (on its last step, ``job:sK``).
        parents = [n for n in names if ":" not in n or step_of(n) is not None]
        if not parents:
            return []
        fields = [Meta.REDUCE, Meta.STAGE, Meta.REDUCED_S, Meta.CANCELLED_S]
        async with redis_errors(self.url):
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in parents:
                    pipe.hmget(self.keys.meta(name), fields)
                rows = replies(await pipe.execute(raise_on_error=False))
            todo = []
            for name, row in zip(parents, rows, strict=True):
                if isinstance(row, Exception):  # its meta is no hash: see Registry.unfinished
                    self.skip_unreadable_meta(name)
                    continue
                kind, stage, reduced, cancelled = row
                if kind is not None and reduced is None and cancelled is None:
                    todo.append((name, int(stage or 0)))
            if not todo:
                return []
            async with self.redis.pipeline(transaction=False) as pipe:
                for name, level in todo:
                    pipe.hget(self.keys.meta(stage_name(name, level)), Meta.FINISHED_S)
                finished = replies(await pipe.execute(raise_on_error=False))
        return [
            (n, lv, f is not None)
            for (n, lv), f in zip(todo, finished, strict=True)
            if not isinstance(f, Exception)
        ]

    async def set_stage(self, job: str, level: int, *, gen: str, **info: int) -> None:
        """Record that ``job`` (of generation ``gen``)'s reduce now runs stage ``level``
        (``info``: counts about how it was built, kept in the stage's meta)."""
        keys = [self.keys.meta(job), self.keys.meta(stage_name(job, level))]
        args = [level, gen, *(x for kv in info.items() for x in kv)]
        async with redis_errors(self.url, job):
            await self.scripts.stage(keys=keys, args=args)

    async def write_final(self, job: str, output: ReduceOutput, *, gen: str) -> bool:
        """Store the reduce output of ``job`` (of generation ``gen``), once; False if one was
        there already."""
        keys = [self.keys.final(job), self.keys.meta(job)]
        async with redis_errors(self.url, job):
            written = await self.scripts.final(keys=keys, args=[encode_final(output), gen])
        return bool(written)

    async def read_final(self, job: str) -> ReduceOutput | None:
        async with redis_errors(self.url, job):
            raw = await self.redis.get(self.keys.final(job))
        return None if raw is None else decode_final(raw)
