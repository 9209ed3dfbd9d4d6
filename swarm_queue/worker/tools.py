"""The tool runner: an arq worker (``swarm-tools``, or ``arq swarm_queue.worker.ToolSettings``)
that runs agents' tool calls, on any machine. It runs only the functions its own
``SWARM_TOOLS`` lists (``package.module:function`` or ``package.module:*``): a job names a
tool, the runner decides
what code that is. A call is cut at ``SWARM_TOOL_TIMEOUT_S``; a tool that raises or times out
answers with its error, as OpenAI's API hands a tool's failure to the model, and the runner
goes on. The answer is kept for the callers that wait on it (see :mod:`common.tools`), as a
cache for ``swarm_cache_s`` seconds when the function has that attribute; its limits, if it
declares any, are kept as :mod:`worker.toollimits` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from arq.worker import Worker, func
from redis.exceptions import RedisError

from swarm_queue.common.arqconf import arq_connection, job_deserializer, job_serializer
from swarm_queue.common.cli import Parser, add_redis_arg, run
from swarm_queue.common.errors import ConfigError, StoreUnavailable
from swarm_queue.common.keys import validate_tool_name
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.tools import HAND_OVER_S, ToolAnswer, claim_s, cut, runner_hold_s
from swarm_queue.worker.toollimits import ToolBusy, ToolLimit, check_limits

__all__ = ["SessionTools", "ToolRunner", "load_tool_settings", "tool_settings"]

log = logging.getLogger("swarm.tools")


class ToolRunner:
    """The tools this runner may run, by name, and running one call of them."""

    def __init__(self, settings: Settings, store: JobStore) -> None:
        self.settings, self.store = settings, store
        self.label = f"{settings.worker_name or socket.gethostname()}:{os.getpid()}"
        self.tools = allowed_tools(settings.tools)
        self.limits = {
            name: ToolLimit(name, fn, store, settings.tool_timeout_s)
            for name, fn in self.tools.items()
        }
        self.runs = 0

    async def run(self, name: str, arguments: str, key: str) -> ToolAnswer:
        """Run the call, keep its answer for its waiters, and return it."""
        t0 = time.monotonic()
        fn = self.tools.get(name)
        if fn is None:
            answer = ToolAnswer(
                error=f"tool {name!r} is not among this runner's SWARM_TOOLS",
                runner=self.label,
                refused=True,
            )
        else:
            runs = 0
            # Said on its claim before any wait for the tool's limits: a try taken and not
            # begun is what its asker takes for lost (see common.tools.START_GRACE_S).
            await self.store.begin_try(key, self.label)
            try:
                async with self.limits[name].turn():
                    self.runs += 1
                    await self.store.count_tools("runs")
                    runs = await self.store.count_run(key, claim_s(self.settings.tool_timeout_s))
                    answer = await self._call(fn, name, arguments)
            except ToolBusy as exc:
                answer = ToolAnswer(error=str(exc))
            content, size = cut(answer.content, self.settings.tool_max_bytes)
            answer = ToolAnswer(
                content,
                answer.error,
                self.label,
                round(time.monotonic() - t0, 3),
                truncated_bytes=size,
                runs=runs,
            )
        # Kept for its waiters at least (a slow pump reads it late), and as a cache if asked.
        keep = float(getattr(fn, "swarm_cache_s", 0) or 0) if answer.ok else 0.0
        await self.store.put_tool_answer(key, answer, max(keep, HAND_OVER_S))
        return answer

    async def _call(self, fn: Callable[..., Any], name: str, arguments: str) -> ToolAnswer:
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return ToolAnswer(error=f"arguments of {name} are not JSON: {exc}")
        if not isinstance(args, dict):
            return ToolAnswer(error=f"arguments of {name} must be a JSON object")
        try:
            async with asyncio.timeout(self.settings.tool_timeout_s):
                if inspect.iscoroutinefunction(fn):
                    value = await fn(**args)
                else:
                    value = await asyncio.to_thread(fn, **args)
        except TimeoutError:
            return ToolAnswer(error=f"{name} took longer than {self.settings.tool_timeout_s:g} s")
        except Exception as exc:  # the operator's code: its failure is the tool's answer
            return ToolAnswer(error=f"{name} raised {type(exc).__name__}: {exc}")
        return ToolAnswer(content=value if isinstance(value, str) else json.dumps(value))


def allowed_tools(entries: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """The functions ``entries`` (``SWARM_TOOLS``) name, by tool name, imported; ConfigError
    naming an entry that cannot be imported."""
    out: dict[str, Callable[..., Any]] = {}
    for entry in entries:
        module_name, _, attr = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"SWARM_TOOLS: cannot import {module_name}: {exc}") from None
        if attr == "*":
            for name, fn in vars(module).items():
                # The module's own public functions, not what it imported.
                own = inspect.isfunction(fn) and fn.__module__ == module.__name__
                if own and not name.startswith("_"):
                    out.setdefault(name, fn)
            continue
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ConfigError(f"SWARM_TOOLS: {module_name} has no function {attr!r}")
        out.setdefault(attr, fn)
    for name in out:
        validate_tool_name(name)
    return out


async def run_tool(ctx: dict[str, Any], name: str, arguments: str, key: str) -> str:
    """arq's job: one tool call (its answer goes to Redis, where its callers look)."""
    runner: ToolRunner = ctx["runner"]
    answer = await runner.run(name, arguments, key)
    return "ok" if answer.ok else "error"


# How often a runner says again which tools it serves, and for how long each saying holds.
SERVE_EVERY_S = 2.0
SERVE_TTL_MS = 10_000


def _worker_args(settings: Settings, tool: str) -> dict[str, Any]:
    """arq's worker arguments for the queue of ``tool``'s calls."""
    hold_s = runner_hold_s(settings.tool_timeout_s)
    return {
        # keep_result=0: the answer lives in its own key (common/tools.py), not arq's.
        "functions": [func(run_tool, keep_result=0, max_tries=3, timeout=hold_s)],
        **arq_connection(settings),
        "queue_name": settings.keys.tool_queue(tool),
        "health_check_key": settings.keys.tool_health_check(tool),
        "health_check_interval": 5,
        "job_serializer": job_serializer,
        "job_deserializer": job_deserializer,
        "max_jobs": settings.tool_concurrency,
        "poll_delay": 0.05,
    }


async def _serve(store: JobStore, label: str, tools: list[str]) -> None:
    """Say, every few seconds, which tools this runner serves (what agents' waits and
    ``swarm-status`` read); Redis away only delays the next saying."""
    while True:
        try:
            await store.serve_tools(label, tools, SERVE_TTL_MS)
        except StoreUnavailable as exc:
            log.warning("tool runner %s: cannot say what it serves: %s", label, exc)
        await asyncio.sleep(SERVE_EVERY_S)


async def _startup(ctx: dict[str, Any]) -> None:
    """The runner, and beside the queue arq runs for its first tool, one arq worker for the
    queue of each other tool it allows (each queue is one tool's, so that no call reaches a
    runner that would refuse it)."""
    settings: Settings = ctx["settings"]
    store = JobStore.from_settings(settings)
    runner = ToolRunner(settings, store)
    ctx.update(store=store, runner=runner)
    names = sorted(runner.tools)
    shared = {"settings": settings, "store": store, "runner": runner}

    def sibling(name: str) -> Callable[[], Worker]:
        return lambda: Worker(**_worker_args(settings, name), handle_signals=False, ctx=shared)

    siblings = [_Sibling(name, sibling(name)) for name in names[1:]]
    ctx["siblings"] = siblings
    ctx["sibling_tasks"] = [asyncio.create_task(w.run()) for w in siblings]
    await store.serve_tools(runner.label, names, SERVE_TTL_MS)
    ctx["serving"] = asyncio.create_task(_serve(store, runner.label, names))
    log.info(
        "tool runner %s: %s; Redis %s%s",
        runner.label,
        ", ".join(names),
        settings.redis_url_masked,
        " (the default: SWARM_REDIS_URL is not set)" if settings.redis_defaulted else "",
    )


# A sibling worker that lost Redis is started again after this long.
SIBLING_RESTART_S = 1.0


class _Sibling:
    """The arq worker of one more tool's queue, beside the one arq's command runs: started
    again when its polling dies of Redis trouble (a primary killed in a failover, a restart),
    which arq's poll loop does not survive, and which would otherwise leave that tool's calls
    unanswered, said by nothing (seen: an agent job stalled after a Redis Cluster failover)."""

    def __init__(self, name: str, make: Callable[[], Worker]) -> None:
        self.name, self.make = name, make
        self.worker = make()

    async def run(self) -> None:
        while True:
            try:
                await self.worker.main()
                return
            except (RedisError, OSError) as exc:
                log.warning(
                    "tool runner: the %s queue's worker lost Redis (%s: %s); starting it again",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
            await _close_worker(self.worker)
            await asyncio.sleep(SIBLING_RESTART_S)
            self.worker = self.make()


async def _shutdown(ctx: dict[str, Any]) -> None:
    serving: asyncio.Task[None] | None = ctx.get("serving")
    if serving is not None:
        serving.cancel()
    for sibling, task in zip(ctx.get("siblings", []), ctx.get("sibling_tasks", []), strict=True):
        await _stop_worker(sibling, task)
    store: JobStore | None = ctx.get("store")
    if store is not None:
        runner: ToolRunner = ctx["runner"]
        with contextlib.suppress(StoreUnavailable):
            await store.serve_tools(runner.label, sorted(runner.tools), 0)
        await store.close()


async def _stop_worker(sibling: _Sibling, task: asyncio.Task[None]) -> None:
    """Stop a sibling worker as arq stops its own on a signal: its polling ended, the calls
    it runs cancelled (arq runs each again later, elsewhere), its connections closed."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _close_worker(sibling.worker)


async def _close_worker(worker: Worker) -> None:
    """Cancel the calls ``worker`` runs and close its connections. (Not arq's
    ``Worker.close()``: it calls redis-py's deprecated ``close()``.)"""
    for running in worker.tasks.values():
        running.cancel()
    await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
    if worker.pool is not None:
        with contextlib.suppress(RedisError, OSError):
            await worker.pool.aclose()


def tool_settings(settings: Settings) -> dict[str, Any]:
    """arq's worker arguments for a tool runner of ``settings``: the queue of its first tool
    (by name); its startup runs a worker for each other tool's queue beside it."""
    if not settings.tools:
        raise ConfigError("no tools to run: set SWARM_TOOLS=package.module:function,...")
    # Fails here, naming the entry, rather than on a call.
    tools = allowed_tools(settings.tools)
    check_limits(tools)
    return {
        **_worker_args(settings, min(tools)),
        "on_startup": _startup,
        "on_shutdown": _shutdown,
        "ctx": {"settings": settings},
    }


class SessionTools:
    """A tool runner inside a Python session, for that session's own tool functions: one arq
    worker over their queues, started again with the wider set when more are added."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.worker: Worker | None = None
        self.task: asyncio.Task[Any] | None = None

    async def run(self, settings: Settings, entries: Sequence[str]) -> None:
        """Run ``entries`` (``module:function``) too, beside those already run."""
        wanted = sorted(set(entries) | set(self.entries))
        if wanted == self.entries:
            return
        await self.stop()
        self.entries = wanted
        runs = msgspec.structs.replace(settings, tools=tuple(wanted))
        self.worker = Worker(**tool_settings(runs), handle_signals=False)
        self.task = asyncio.create_task(self.worker.async_run(), name="swarm-tools")

    async def stop(self) -> None:
        if self.worker is not None and self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            worker = self.worker
            if worker.on_shutdown is not None:
                await worker.on_shutdown(worker.ctx)
            await _close_worker(worker)
        self.worker = self.task = None


async def _reach_redis(redis_url: str | None) -> int:
    """0 once Redis answers (an unreachable one is one clear line within seconds)."""
    store = JobStore.from_settings(Settings.from_env(os.environ, redis_url=redis_url))
    try:
        await store.ping()
    finally:
        await store.close()
    return 0


def load_tool_settings(redis_url: str | None = None) -> dict[str, Any]:
    """``worker.ToolSettings`` as arq's CLI reads it, from the environment of that moment
    (``redis_url``: the command line's ``--redis``, over ``SWARM_REDIS_URL``)."""
    try:
        return tool_settings(Settings.from_env(os.environ, redis_url=redis_url))
    except ConfigError as exc:
        print(f"swarm-tools: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> None:
    """``swarm-tools``: a tool runner, Redis and the tools checked first."""
    p = Parser(
        prog="swarm-tools",
        description="A tool runner: runs the tool calls that its SWARM_TOOLS allows "
        "(package.module:function or package.module:*, comma-separated; the modules importable "
        "here), taken from the Redis of SWARM_REDIS_URL (and SWARM_PREFIX). Each call runs at "
        "most SWARM_TOOL_TIMEOUT_S, SWARM_TOOL_CONCURRENCY at a time. Ctrl-C or SIGTERM stops "
        "it; a call it was running is run again elsewhere.",
    )
    add_redis_arg(p)
    args = p.parse_args(argv)
    settings_map = load_tool_settings(args.redis)
    # Redis reached first, with swarm-queue's client: arq's own connection loop waits on an
    # unreachable one in silence.
    status = run("swarm-tools", _reach_redis(args.redis))
    if status:
        raise SystemExit(status)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from arq.worker import run_worker

    run_worker(settings_map)
