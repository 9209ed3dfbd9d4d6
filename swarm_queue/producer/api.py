"""The Python API, for notebooks and scripts: what the CLI does, as calls.

    async with Swarm("redis://login-node:6379") as swarm:       # workers run elsewhere
        job = await swarm.submit(prompts, reduce=TreeReduce(template, fanin=50))
        async for r in swarm.results(job):                         # in input order
            print(r.index, r.text)
        summary = await swarm.final(job)

    results = await scatter_gather(prompts, endpoints=["http://node1:8000"])   # one call

    job = await swarm.pipeline(questions, [Step("Check: {answer}", keep=is_claim),
                                           Step("Summarise: {answer}", max_tokens=64)])
    async for chain in swarm.chains(job):                          # one per input, in order
        print(chain.index, chain.text or chain.error)

With ``endpoints``, a :class:`Swarm` drains its jobs itself, in this process (the same engine
as ``arq worker``: batching, retries, bisection, the adaptive window); without, it only talks
to Redis and the workers on the compute nodes do the work. With no Redis URL it starts a
private, in-memory Redis for the session: fine for a notebook, gone when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

import msgspec

from swarm_queue.common.embedded import EmbeddedRedis
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.final import ReduceOutput
from swarm_queue.common.jobspec import JobSettings, build_spec, options_from
from swarm_queue.common.keys import validate_job_name
from swarm_queue.common.models import Result
from swarm_queue.common.progress import Progress
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStatus, JobStore
from swarm_queue.flows.agents.output import AgentOutput
from swarm_queue.flows.agents.spec import (
    AgentResult,
    AgentSpec,
    agent_prompts,
    build_agents,
    enqueue_agents,
)
from swarm_queue.flows.bestof.flow import build_best_of
from swarm_queue.flows.pipeline.output import ChainLine
from swarm_queue.flows.pipeline.spec import (
    StepOptions,
    build_pipeline,
    enqueue_pipeline,
    link_of,
    needs_steps,
)
from swarm_queue.flows.registry import output_of
from swarm_queue.flows.rounds.blackboard import Blackboard, BoardState
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.frames import prompts_from, results_dataset, results_frame
from swarm_queue.producer.ops import cancel_job
from swarm_queue.producer.output import follow_output, output_for
from swarm_queue.producer.plain import PlainOutput
from swarm_queue.producer.specs import Prompts, pairs, schema_of, tools_of
from swarm_queue.producer.stream import wait_final
from swarm_queue.tools.runner import SessionTools
from swarm_queue.worker.engine import Engine

__all__ = ["Swarm", "scatter_gather"]

log = logging.getLogger("swarm.producer")


class Swarm:
    """A session with one Redis: submit jobs, follow their results, read their reduce output."""

    def __init__(
        self,
        url: str | None = None,
        *,
        endpoints: Sequence[str] = (),
        hostfile: str | None = None,
        prefix: str | None = None,
        api_key: str | None = None,
        env: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> None:
        """Settings as every command reads them: the ``SWARM_*`` variables of ``env`` (None:
        this process's environment), then these arguments. ``url``: Redis (None:
        ``SWARM_REDIS_URL``, else a private in-memory one, which needs endpoints).
        ``endpoints`` (or a ``hostfile``, or ``SWARM_ENDPOINTS``/``SWARM_HOSTFILE``): vLLM
        base URLs to drain jobs from, in this process. ``settings``: any
        :class:`common.settings.Settings` field (``batch_size=16``...)."""
        source = os.environ if env is None else env
        self._env = {k: v for k, v in source.items() if k.startswith("SWARM_")}
        if endpoints or hostfile:
            self._env.pop("SWARM_ENDPOINTS", None)
            self._env.pop("SWARM_HOSTFILE", None)
        if endpoints:
            self._env["SWARM_ENDPOINTS"] = ",".join(endpoints)
        if hostfile:
            self._env["SWARM_HOSTFILE"] = hostfile
        url = url or self._env.get("SWARM_REDIS_URL", "").strip() or None
        drains = any(self._env.get(k, "").strip() for k in ("SWARM_ENDPOINTS", "SWARM_HOSTFILE"))
        if url is None and not drains:
            raise ConfigError(
                "no Redis URL and no endpoints: nothing would answer the prompts. Give the URL "
                "of the Redis your workers use (or set SWARM_REDIS_URL), or endpoints to run "
                "them here."
            )
        self._url = url
        self._overrides: dict[str, Any] = {"prefix": prefix, "api_key": api_key, **settings}
        self._redis: EmbeddedRedis | None = None
        self._store: JobStore | None = None
        self._engine: Engine | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._feeding: dict[str, asyncio.Task[Any]] = {}
        self._tools = SessionTools()
        self.settings: Settings | None = None

    async def __aenter__(self) -> Swarm:
        url = self._url
        if url is None:
            self._redis = await asyncio.to_thread(EmbeddedRedis().start)
            url = self._redis.url
        self.settings = Settings.from_env(self._env, redis_url=url, **self._overrides)
        self._store = JobStore.from_settings(self.settings)
        if self.settings.endpoints:
            self._engine = Engine(self.settings, self._store)
            if self.settings.metrics_port:  # metrics_port=...: the worker's /metrics, here
                await self._engine.start_metrics()
            self._engine_task = asyncio.create_task(self._engine.run(), name="swarm-engine")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tools.stop()
        for task in self._feeding.values():
            task.cancel()
        await asyncio.gather(*self._feeding.values(), return_exceptions=True)
        if self._engine is not None and self._engine_task is not None:
            self._engine.request_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._engine_task, timeout=30)
            await self._engine.close()
        if self._store is not None:
            await self._store.close()
        if self._redis is not None:
            self._redis.close()

    @property
    def store(self) -> JobStore:
        if self._store is None:
            raise RuntimeError("use Swarm inside 'async with'")
        return self._store

    async def submit(
        self,
        prompts: Prompts | Any,
        *,
        job: str | None = None,
        window: int | None = None,
        column: str = "prompt",
        id_column: str | None = None,
        **settings: Unpack[JobSettings],
    ) -> str:
        """Queue ``prompts`` as a job; returns its name. Submitting the same job again resumes
        it. ``prompts``: strings, or ``(prompt, custom_id)`` pairs; or a pandas DataFrame, a
        Hugging Face ``datasets.Dataset`` or a Parquet file's path, whose ``column`` holds
        the prompts (and ``id_column``, if given, their custom ids).

        ``settings``: the job's, as :class:`common.jobspec.JobOptions` names them, the same as
        ``swarm-enqueue``'s flags and checked by the same rules (``max_tokens``,
        ``temperature``, ``model``, ``chat``, ``template``, ``schema``, ``priority``,
        ``reduce``...). With ``cache`` (and a ``model``), prompts answered before, by any job,
        are answered from the response cache: deterministic requests only (``temperature=0``
        or a ``seed``), unless ``cache_sampled``; with ``cache_refresh``, none is answered from
        it: every prompt is asked again and its answer replaces the kept one.

        With ``window``, prompts are fed in the background, at most ``window`` unfinished at a
        time (for inputs too big to queue at once): follow :meth:`results` meanwhile."""
        name = validate_job_name(job) if job else f"job-{uuid.uuid4().hex[:12]}"
        options = options_from(settings)
        if needs_steps(options):  # its measure is a step of its own: follow it with chains()
            return await self.pipeline(prompts, [], job=name, window=window, **settings)
        spec, warnings = build_spec(name, options, source="python", created_s=time.time())
        for warning in warnings:
            log.warning("job %s: %s", name, warning)
        reduce = spec.reduce
        if reduce is not None and reduce.function and self._engine is not None:
            self._engine.pumps.allow([reduce.function])  # this session's own code
        given = pairs(prompts_from(prompts, column=column, id_column=id_column))
        feed = enqueue_prompts(self.store, spec, given, window=window)
        if window is None:
            await feed
        else:
            self._feeding[name] = asyncio.create_task(feed)
        return name

    async def pipeline(
        self,
        prompts: Prompts,
        steps: Sequence[StepOptions],
        *,
        job: str | None = None,
        window: int | None = None,
        **settings: Any,
    ) -> str:
        """Queue ``prompts`` as the first step of a pipeline (``settings``: that step's, as
        :meth:`submit` takes them) whose answers each go on through ``steps`` (see
        :func:`Step`) the moment they are committed; returns its name. Follow it with
        :meth:`chains`. Submitting the same pipeline again resumes it."""
        name = validate_job_name(job) if job else f"pipeline-{uuid.uuid4().hex[:12]}"
        first = options_from(settings)
        specs, warnings = build_pipeline(name, first, steps, source="python")
        for warning in warnings:
            log.warning("pipeline %s: %s", name, warning)
        if self._engine is not None:  # this session's own keep functions
            self._engine.pumps.allow(s.keep_fn for s in steps if s.keep_fn)
        feed = enqueue_pipeline(self.store, specs, pairs(prompts), window=window)
        if window is None:
            await feed
        else:
            self._feeding[name] = asyncio.create_task(feed)
        return name

    async def best_of(
        self,
        prompts: Prompts,
        n: int,
        judge: str,
        *,
        judge_model: str | None = None,
        job: str | None = None,
        **settings: Any,
    ) -> str:
        """Queue ``prompts`` each sampled ``n`` times (``settings`` as :meth:`submit` takes
        them: set a ``temperature``), every candidate scored by ``judge`` (a template with
        ``{answer}`` and ``{prompt}``, see :mod:`flows.bestof.flow`), the best kept; returns its
        name. Follow it with :meth:`lines`. Submitting it again resumes it."""
        name = validate_job_name(job) if job else f"best-of-{uuid.uuid4().hex[:12]}"
        specs, warnings = build_best_of(
            name, options_from(settings), n, judge, judge_model=judge_model, source="python"
        )
        for warning in warnings:
            log.warning("best-of %s: %s", name, warning)
        await enqueue_pipeline(self.store, specs, pairs(prompts))
        return name

    async def chains(self, job: str, *, poll_s: float = 0.2) -> AsyncIterator[ChainLine]:
        """Every input of pipeline ``job``, in input order, once its way through the steps
        has ended: each step's answer, or where and why it stopped (its :meth:`lines`)."""
        async for line in self.lines(job, poll_s=poll_s):
            yield line

    async def lines(self, job: str, *, poll_s: float = 0.2) -> AsyncIterator[Any]:
        """Every input of ``job``, in input order, each once it has ended, as its kind of job
        writes it (see :mod:`common.output`): a pipeline's chain, a best-of input's
        candidates, an agent's end, a plain job's output line."""
        output = await output_for(self.store, await self.store.load_spec(job))
        async for chunk in follow_output(output)(self.store, job, wait=True, poll_s=poll_s):
            self._check_feed(job)
            for row in chunk:
                yield output.line(row)
        self._check_feed(job)

    async def broadcast(self, prompt: str, n: int, **settings: Any) -> list[Result]:
        """``prompt`` answered ``n`` times (sample with ``temperature``), as one job: its
        results, in order. With ``reduce=...``, :meth:`final` of the job named ``job``
        (give one) reduces them, as Aurora-Swarm's ``broadcast_and_reduce`` did."""
        if n < 1:
            raise ConfigError(f"broadcast to n >= 1, got {n}")
        job = await self.submit([(prompt, f"agent-{i}") for i in range(n)], **settings)
        return await self.gather(job)

    async def blackboard(
        self,
        name: str,
        sections: Sequence[str],
        prompt: Callable[[str, dict[str, list[str]]], str],
        *,
        max_rounds: int,
        agents: dict[str, int] | int = 1,
        until: Callable[[dict[str, list[str]]], bool] | None = None,
        **settings: Any,
    ) -> BoardState:
        """Rounds of roles on a shared board kept in Redis (see
        :mod:`flows.rounds.blackboard`): each round, ``prompt(role, sections)`` for every
        role's ``agents``, answered on the fleet as one job (``settings``: its, as
        :meth:`submit` takes them); the answers appended to their sections. Stops after
        ``max_rounds`` or once ``until(sections)`` holds; run it again after a crash and it
        resumes at its last finished round."""
        board = Blackboard(self.store, name, sections, prompt, agents=agents)
        spec, warnings = build_spec(name, options_from(settings), source="python blackboard")
        for warning in warnings:
            log.warning("blackboard %s: %s", name, warning)

        async def answer(job: str, prompts: list[tuple[str, str | None]]) -> list[Result]:
            await enqueue_prompts(self.store, msgspec.structs.replace(spec, job=job), prompts)
            return await self.gather(job)

        return await board.run(answer, max_rounds=max_rounds, until=until)

    async def agents(
        self,
        *,
        task: str,
        inputs: Iterable[dict[str, Any]],
        tools: Sequence[Callable[..., Any] | str] = (),
        output_schema: dict[str, Any] | type | None = None,
        system: str | None = None,
        max_turns: int = 4,
        max_repairs: int = 1,
        tool_choice: str | None = None,
        job: str | None = None,
        in_order: bool = True,
        **settings: Any,
    ) -> AsyncIterator[AgentResult]:
        """Run one agent per input (its fields fill ``task``'s ``{field}``s), each up to
        ``max_turns`` turns on the fleet, calling ``tools`` between them; yields each agent's
        result (its output as data, or its failure and why) as they finish: in input order,
        or with ``in_order=False`` in the order they finish.

        ``tools``: module-level functions (a Swarm that drains its jobs runs them itself, in
        this process) or names of the tools the runners (``swarm-tools``) run;
        ``tool_choice`` as ``swarm-enqueue --tool-choice`` takes it. ``settings``:
        the agents' job settings, as :meth:`submit` takes them (``model``, ``max_tokens``...).
        ``output_schema``: a JSON Schema, or a Pydantic model class, whose instances the
        results' ``output`` then are.
        """
        name = validate_job_name(job) if job else f"agents-{uuid.uuid4().hex[:12]}"
        output_schema, parse = schema_of(output_schema)
        entries, definitions = tools_of(tools)
        if entries:
            if self._engine is None or self.settings is None:
                raise ConfigError(
                    "tools given as functions run in this process, which needs endpoints= (to "
                    "drain here); with remote workers, name the tools their runners run"
                )
            await self._tools.run(self.settings, entries)
        agent = AgentSpec(
            max_turns=max_turns,
            max_repairs=max_repairs,
            output_schema=output_schema,
            tool_choice=tool_choice,
        )
        specs, warnings = build_agents(
            name, options_from(settings), agent, definitions, source="python"
        )
        for warning in warnings:
            log.warning("agents %s: %s", name, warning)
        await enqueue_agents(self.store, specs, agent_prompts(task, inputs, system))
        output = AgentOutput([await self.store.load_spec(name)])
        chunks = (
            follow_output(output)(self.store, name, wait=True, poll_s=0.1)
            if in_order
            else output.in_finish_order(self.store)
        )
        async for chunk in chunks:
            for result in chunk:
                if parse is not None and result.ok:
                    result = msgspec.structs.replace(result, output=parse(result.output))
                yield result

    def _check_feed(self, job: str) -> None:
        task = self._feeding.get(job)
        if task is not None and task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def results(
        self, job: str, *, poll_s: float = 0.2, progress: bool = True
    ) -> AsyncIterator[Result]:
        """Every result of ``job``, in input order, as soon as it (and all before it) is in;
        failures included, with their reason. ``progress``: a bar on stderr (a line every
        30 s where stderr is no terminal: a notebook's or a batch job's log)."""
        spec = await self.store.load_spec(job)
        if link_of(spec) is not None:
            raise ConfigError(
                f"job {job} is a pipeline: its results are chains, every step's answer by "
                "input (swarm.chains(job)); results() would give its first step's alone"
            )
        if (kind := output_of(spec)) is not None:
            raise ConfigError(
                f"job {job} is a {kind.what} job: its results are lines, one by input "
                "(swarm.lines(job)); results() would give its first step's alone"
            )
        bar = Progress("swarm", f"job {job}", "answered", enabled=progress)

        def show(status: JobStatus, _written: int) -> None:
            done = status.done + status.failed
            bar.update(done, status.total or status.enqueued, failed=status.failed)

        try:
            rows = follow_output(PlainOutput([spec]))
            async for chunk in rows(self.store, job, wait=True, poll_s=poll_s, on_status=show):
                self._check_feed(job)
                for result in chunk:
                    yield result
            self._check_feed(job)
        finally:
            bar.close()

    async def gather(self, job: str) -> list[Result]:
        """Every result of ``job`` in input order, once all are in."""
        return [r async for r in self.results(job)]

    async def frame(self, job: str) -> Any:
        """Every result of ``job`` as a pandas DataFrame, once all are in: one row per prompt
        in input order, the columns of ``swarm-collect --format parquet``."""
        return results_frame(await self.gather(job), await self.store.load_spec(job))

    async def dataset(self, job: str) -> Any:
        """Every result of ``job`` as a Hugging Face ``datasets.Dataset``, once all are in:
        the columns of :meth:`frame`."""
        return results_dataset(await self.gather(job), await self.store.load_spec(job))

    async def final(self, job: str, *, wait: bool = True) -> ReduceOutput | None:
        """The reduce output of ``job`` (None if not finished and not ``wait``)."""
        return await wait_final(self.store, job, wait=wait, poll_s=0.2)

    async def status(self, job: str) -> JobStatus:
        return await self.store.status(job)

    async def cancel(self, job: str) -> None:
        """Stop ``job``, as ``swarm-cancel`` does: unanswered prompts are recorded as failed
        (kind ``cancelled``), and a reduce still to come ends with an error output."""
        await cancel_job(self.store, job)


async def scatter_gather(
    prompts: Prompts,
    endpoints: Sequence[str] = (),
    *,
    url: str | None = None,
    max_tokens: int = 256,
    **options: Any,
) -> list[Result]:
    """Prompts in, results out, in the same order: the one-call form.

    ``endpoints`` are drained from this process; ``url`` is a Redis (default: a private one;
    give a real one, and a ``job`` name, and a rerun after a crash resumes where it stopped).
    ``options``: :meth:`Swarm.submit`'s (``job``, ``temperature``, ``model``...).
    """
    async with Swarm(url, endpoints=endpoints) as swarm:
        job = await swarm.submit(prompts, max_tokens=max_tokens, **options)
        return await swarm.gather(job)
