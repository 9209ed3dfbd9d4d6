"""The toy workflow's flow: each answer of job ``J``, its words in reverse order, is queued as a
prompt of ``J:s1``, which is sealed once ``J`` has finished and every answer has moved on.
Written against the flows' seam and the store's flow operations alone."""

from __future__ import annotations

from swarm_queue.common.keys import step_name, step_of
from swarm_queue.common.models import FlowRef, JobSpec, PromptItem, decode_item, decode_result
from swarm_queue.common.store.steps import Move
from swarm_queue.flows.flow import Flow

KIND = "reverse"


def reverse_specs(job: str) -> list[JobSpec]:
    """The toy workflow's two jobs: ``job``, whose answers go on, and the step they go into."""
    return [JobSpec(job=job, flow=FlowRef(kind=KIND)), JobSpec(job=step_name(job, 1))]


def reversed_words(text: str) -> str:
    return " ".join(reversed(text.split()))


class ReverseFlow(Flow):
    """Its work: each step ``J:s1`` not yet sealed whose job ``J`` is of this kind."""

    name = KIND

    async def find(self) -> dict[str, JobSpec]:
        steps = {n: s[0] for n in await self.store.list_jobs() if (s := step_of(n)) is not None}
        befores = {n: steps[n] for n in await self.store.unfinished(list(steps))}
        sources = await self.current_specs(list(befores.values()))
        return {
            name: sources[before]
            for name, before in befores.items()
            if before in sources and (sources[before].flow or FlowRef(kind="")).kind == KIND
        }

    async def advance(self, name: str, spec: JobSpec) -> bool:
        if not await self.lock(name):
            return False
        target = await self.spec(name)
        landed = await self.take(spec.job, spec.generation)
        if landed:
            raws = await self.store.results_at(spec.job, [x.index for x in landed])
            first = await self.store.enqueued_count(name)
            moves = []
            for x, raw in zip(landed, raws, strict=True):
                item = decode_item(x.payload or b"")
                text = decode_result(raw).text if raw is not None else None
                if text is None:
                    moves.append(Move(item.index, reason="no answer"))
                    continue
                at = first + sum(1 for m in moves if m.item is not None)
                moves.append(Move(item.index, item=PromptItem(at, reversed_words(text))))
            acked = [x.entry_id for x in landed]
            await self.store.move_on(spec.job, name, first, moves, acked, gen=target.generation)
            return True
        status = await self.store.status(spec.job, rate=False)
        if not status.finished or await self.store.landed_backlog(spec.job):
            return False
        await self.store.seal(name, await self.store.enqueued_count(name), gen=target.generation)
        await self.store.release_producer_lock(name, self.token)
        self.work.pop(name, None)
        return True
