"""One step of a job's reduce: what the reduce flow (:mod:`flows.reduce.flow`) runs once a
job's current stage has finished.

:meth:`Reducer.advance` either writes the final output or, for a tree reduce, queues the next
level of supervisor prompts as a new stage ``job:rN`` that the same workers drain. The next
stage's lock is taken first: one worker groups and queues a level, the others find it busy and
look again at their next sweep.

Each step is idempotent, so a worker dying anywhere in it costs nothing but a rerun: the next
stage's prompts are a pure function of the finished stage's results (grouped in index order,
token counts from the endpoint), queuing resumes after what is already queued, and the final
output is written once. No client needs to be attached for a job to go from map to answer, and
no step waits for ever: one that takes longer than its time ends the reduce with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Protocol

import msgspec

from swarm_queue.common.abilities import Abilities, lacking, needs
from swarm_queue.common.errors import (
    ConfigError,
    EndpointError,
    EndpointRetryable,
    JobGoneError,
    ProducerBusyError,
    StoreUnavailable,
    SwarmError,
)
from swarm_queue.common.feed import enqueue_prompts, take_lock
from swarm_queue.common.final import LevelInfo, ReduceOutput
from swarm_queue.common.keys import group_of, stage_name
from swarm_queue.common.models import JobSpec, ReduceSpec, Result, timestamp_s
from swarm_queue.common.reduce import aggregate, failures, load_function, render
from swarm_queue.common.reducekinds import FUNCTION, REDUCE_KINDS, TREE
from swarm_queue.common.store import FlowStore, producer_token
from swarm_queue.common.vocab import Meta

__all__ = ["Reducer", "Sizer", "StageBusy", "estimate_tokens", "supervisor_max_tokens"]

log = logging.getLogger("swarm.reduce")

# Token counts requested from the endpoint at once while grouping a level.
_TOKENIZE_CONCURRENCY = 16


def estimate_tokens(text: str) -> int:
    """A deliberately high token count for servers without ``/tokenize``: a byte in three
    (English runs at about four characters a token; CJK at about one character, three bytes)."""
    return len(text.encode("utf-8")) // 3 + 1


def supervisor_max_tokens(spec: JobSpec, reduce: ReduceSpec) -> int:
    """Tokens a supervisor prompt may generate: the reduce's own, or twice the job's."""
    return reduce.max_tokens or 2 * spec.params.max_tokens


class Model(Protocol):
    """A model as an endpoint lists it."""

    @property
    def id(self) -> str: ...
    @property
    def max_model_len(self) -> int | None: ...


class Sizer(Protocol):
    """What a tree reduce asks of an endpoint (a worker's :class:`worker.backend.Backend`):
    its models' context lengths, and a prompt's exact token count (None: it cannot say)."""

    @property
    def label(self) -> str: ...
    async def models(self, timeout_s: float = 30.0) -> Sequence[Model]: ...
    async def tokenize(self, prompt: str, model: str, timeout_s: float = 30.0) -> int | None: ...


class StageBusy(SwarmError):
    """Another worker is queuing this stage right now (or died doing so: its lock expires)."""


class _Grouping(msgspec.Struct):
    groups: list[list[Result]]
    split: int = 0
    truncated: int = 0


class Reducer:
    """Advances jobs' reduce stages; talks to the endpoints only to size supervisor prompts."""

    def __init__(
        self, store: FlowStore, clients: Sequence[Sizer], allowed: set[str], *, numpy: bool
    ) -> None:
        self.store = store
        self.clients = list(clients)
        # The user aggregators this worker may import (SWARM_REDUCE_FUNCTIONS, and a Python
        # session's own): the set the flows share, so that one added later counts here too.
        self.allowed = allowed
        self.numpy = numpy

    def lacks(self, spec: JobSpec) -> str | None:
        """What this worker lacks to run ``spec``'s reduce (None: nothing): a function its
        settings do not allow, or one that cannot be imported here."""
        missing = [n for n in lacking(needs(spec), self.abilities) if n.kind == "reduce"]
        if missing:
            return ", ".join(n.describe() for n in missing)
        if spec.reduce is not None and spec.reduce.kind == FUNCTION:
            try:
                load_function(spec.reduce.function or "")
            except ConfigError as exc:
                return f"{exc} (it cannot be imported on this worker)"
        return None

    @property
    def abilities(self) -> Abilities:
        return Abilities(frozenset(self.allowed), self.numpy)

    def runs(self, spec: JobSpec) -> bool:
        """Whether this worker can run ``spec``'s reduce: one it lacks is left to a worker that
        has what it needs, said once (never a failure recorded for it)."""
        why = self.lacks(spec)
        if why is not None:
            what = f"the reduce of job {spec.job}"
            self.store.warn_once(what, f"left to a worker that has {why}")
        return why is None

    async def advance(self, job: str, level: int, timeout_s: float | None = None) -> str:
        """Move ``job`` on from its finished stage ``level``; returns what was done. Safe to
        run twice, or concurrently with itself.

        Redis being unreachable, or another worker advancing the same stage, raise (a later
        sweep runs it again); a step past ``timeout_s`` and any other failure are final and
        become the output's ``error``, so a job never waits forever on a reduce that cannot
        run. Every write carries the generation of the job as read first: a job deleted and
        queued again under its name meanwhile gets nothing of this one's reduce.
        """
        spec = await self.store.load_spec(job)
        if not self.runs(spec):
            return "left to another worker"
        limit = asyncio.timeout(timeout_s)
        try:
            async with limit:
                return await self._advance(spec, level)
        except (StoreUnavailable, EndpointRetryable, StageBusy):
            raise
        except TimeoutError:
            if not limit.expired():
                raise
            log.error("job %s: the reduce step at stage %d took over %g s", job, level, timeout_s)
            why = f"reduce step at stage {level} took over {timeout_s:g} s (SWARM_REDUCE_TIMEOUT_S)"
            return await self.fail(spec, why)
        except JobGoneError:
            log.warning("job %s: gone while its reduce ran; nothing written", job)
            return "gone"
        except Exception as exc:
            log.exception("job %s: the reduce failed at stage %d", job, level)
            return await self.fail(spec, f"reduce failed at stage {level}: {exc}")

    async def fail(self, spec: JobSpec, error: str) -> str:
        """End the reduce of ``spec``'s job with ``error`` as its output."""
        kind = spec.reduce.kind if spec.reduce else "?"
        output = ReduceOutput.failure(spec.job, kind, error)
        await self.store.write_final(spec.job, output, gen=spec.generation)
        return "failed"

    async def _advance(self, spec: JobSpec, level: int) -> str:
        job = spec.job
        reduce = spec.reduce
        if reduce is None:
            return "no reduce stage"
        if await self.store.read_final(job) is not None:
            return "already reduced"
        meta = await self.store.meta(job)
        if Meta.CANCELLED_S in meta:
            return "cancelled"
        current = int(meta.get(Meta.STAGE, b"0"))
        if level != current:
            return f"stale: the job is at stage {current}"
        name = stage_name(job, level)
        status = await self.store.status(name)
        if not status.finished or status.total is None:
            return f"stage {level} not finished"
        results = await self._in_input_order(
            spec, name, await self.store.read_results(name, status.total)
        )
        if not REDUCE_KINDS[reduce.kind].fleet:
            output = aggregate(job, reduce, results, self.allowed)
            await self.store.write_final(job, output, gen=spec.generation)
            log.info("job %s: %s reduce written", job, reduce.kind)
            return "reduced"
        answers = [r for r in results if r.ok]
        if len(answers) <= 1:  # one answer remains (or none): that is the tree's output
            return await self._finish_tree(spec, level, answers)
        return await self._next_level(spec, reduce, level, answers)

    async def _in_input_order(
        self, spec: JobSpec, name: str, results: list[Result]
    ) -> list[Result]:
        """A workflow's later step's results under their inputs' indices, in input order,
        with a failure for each input that stopped before it (a job of its own's: as they
        are)."""
        first, place = group_of(spec.job)
        if name != spec.job or not place:  # a tree's level, or a job of its own
            return results
        inputs = (await self.store.status(first)).total or 0
        origins = await self.store.step_origins(name)
        by_input = {
            origins[r.index]: msgspec.structs.replace(r, index=origins[r.index])
            for r in results
            if r.index in origins
        }
        why = "stopped before this step (failed or filtered at an earlier one: see its line)"
        return [by_input.get(i) or Result(index=i, error=why) for i in range(inputs)]

    async def _finish_tree(self, spec: JobSpec, level: int, answers: list[Result]) -> str:
        job = spec.job
        failed, levels = [], []
        used = 0
        for lv in range(level + 1):
            name = stage_name(job, lv)
            status = await self.store.status(name)
            total = status.total or 0
            failed += failures(
                [r for r in await self.store.read_results(name, total) if not r.ok], lv
            )
            if lv == 0:
                used = total - status.failed
            else:
                info = await self.store.meta(name)
                levels.append(
                    LevelInfo(
                        lv,
                        total,
                        status.failed,
                        int(info.get("split_groups", b"0")),
                        int(info.get("truncated", b"0")),
                    )
                )
        error = None if answers else f"no answer left to reduce at level {level}"
        output = ReduceOutput(
            job=job,
            kind=TREE,
            value=(answers[0].text or "").strip() if answers else None,
            used=used,
            failed=failed,
            levels=levels,
            error=error,
            finished_s=timestamp_s(),
        )
        await self.store.write_final(job, output, gen=spec.generation)
        log.info("job %s: tree reduce finished after %d level(s)", job, level)
        return "reduced"

    async def _next_level(
        self, spec: JobSpec, reduce: ReduceSpec, level: int, answers: list[Result]
    ) -> str:
        job, nxt = spec.job, level + 1
        # The next stage's lock, with a writer token of its own, before any prompt is sized:
        # a second advance of the same stage, in this process or another, finds it busy
        # instead of asking the endpoints to count every group again.
        token = f"{producer_token()}/{uuid.uuid4().hex[:12]}"
        try:
            await take_lock(self.store, stage_name(job, nxt), token)
        except ProducerBusyError as exc:
            raise StageBusy(str(exc)) from None
        max_tokens = supervisor_max_tokens(spec, reduce)
        template = reduce.prompt or "{responses}"
        model, budget = await self._budget(spec, max_tokens)
        grouping = await self._group(answers, reduce.fanin, template, nxt, model, budget)
        prompts = (
            (render(template, [r.text or "" for r in g], nxt), f"{g[0].index}-{g[-1].index}")
            for g in grouping.groups
        )
        stage = JobSpec(
            job=stage_name(job, nxt),
            params=msgspec.structs.replace(spec.params, max_tokens=max_tokens),
            model=spec.model,
            created_s=timestamp_s(),
            source=f"tree reduce of {job}, level {nxt}",
            priority=spec.priority,  # a job's reduce is as urgent as the job
        )
        report = await enqueue_prompts(self.store, stage, prompts, token=token)
        await self.store.set_stage(
            job,
            nxt,
            gen=spec.generation,
            split_groups=grouping.split,
            truncated=grouping.truncated,
        )
        log.info(
            "job %s: level %d queued, %d supervisor prompts over %d answers",
            job,
            nxt,
            report.total,
            len(answers),
        )
        return f"level {nxt}: {report.total} prompts"

    async def _budget(self, spec: JobSpec, max_tokens: int) -> tuple[str, int | None]:
        """The model to tokenize for, and the prompt tokens a supervisor prompt may hold:
        the model's context (``max_model_len`` from ``/v1/models``) minus what it generates.
        None when no endpoint says: then only the fan-in bounds a group."""
        for client in self.clients:
            try:
                models = await client.models()
            except EndpointError as exc:
                log.warning("%s: no model list (%s); trying the next endpoint", client.label, exc)
                continue
            for m in models:
                if spec.model is None or m.id == spec.model:
                    if m.max_model_len is None:
                        return m.id, None
                    return m.id, max(1, m.max_model_len - max_tokens)
        return spec.model or "", None

    async def _count(self, prompt: str, model: str) -> int:
        for client in self.clients:
            n = await client.tokenize(prompt, model)
            if n is not None:
                return n
        return estimate_tokens(prompt)

    async def _group(
        self,
        answers: list[Result],
        fanin: int,
        template: str,
        level: int,
        model: str,
        budget: int | None,
    ) -> _Grouping:
        """Consecutive answers, ``fanin`` at a time; a group whose prompt would not fit the
        context is split in halves until it does (an answer too long on its own is cut)."""
        out = _Grouping([])
        chunks = [answers[i : i + fanin] for i in range(0, len(answers), fanin)]
        if budget is None:
            out.groups = chunks
            return out
        gate = asyncio.Semaphore(_TOKENIZE_CONCURRENCY)

        async def fit(group: list[Result]) -> list[list[Result]]:
            async with gate:
                n = await self._count(render(template, [r.text or "" for r in group], level), model)
            if n <= budget:
                return [group]
            if len(group) == 1:
                out.truncated += 1
                return [[await self._truncate(group[0], template, level, model, budget)]]
            mid = len(group) // 2
            out.split += 1
            return await fit(group[:mid]) + await fit(group[mid:])

        for fitted in await asyncio.gather(*(fit(c) for c in chunks)):
            out.groups += fitted
        return out

    async def _truncate(
        self, answer: Result, template: str, level: int, model: str, budget: int
    ) -> Result:
        text = answer.text or ""
        for _ in range(20):
            n = await self._count(render(template, [text], level), model)
            if n <= budget or not text:
                break
            text = text[: int(len(text) * min(0.9, budget / n))]
        return msgspec.structs.replace(answer, text=text)
