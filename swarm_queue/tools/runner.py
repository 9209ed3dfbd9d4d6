"""The tool runner (``swarm-tools``): runs agents' tool calls, on any machine. It runs only
the functions its own ``SWARM_TOOLS`` lists (``package.module:function`` or
``package.module:*``): a job names a tool, the runner decides what code that is.

It drains its tools' call streams as a worker drains prompts: it takes calls through the
workers' consumer group, says it still runs each (a third of ``SWARM_CLAIM_IDLE_MS``) so that
no other runner takes it over, and takes over the calls of runners that died. A call is cut
at ``SWARM_TOOL_TIMEOUT_S``; a tool that raises or times out answers with its error, as
OpenAI's API hands a tool's failure to the model, and the runner goes on. The answer is kept
for the callers that wait on it (see :mod:`common.toolcall`), as a cache for ``swarm_cache_s``
seconds when the function has that attribute; its limits, if it declares any, are kept as
:mod:`tools.limits` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from swarm_queue.common.cli import Parser, add_redis_arg, run
from swarm_queue.common.errors import ConfigError, StoreUnavailable
from swarm_queue.common.keys import validate_tool_name
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore, ToolCall
from swarm_queue.common.toolcall import HAND_OVER_S, MAX_RUNS, ToolAnswer, claim_s, cut
from swarm_queue.tools.limits import ToolBusy, ToolLimit, check_limits

__all__ = ["SessionTools", "ToolDrain", "ToolRunner", "allowed_tools"]

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

    async def run(self, name: str, arguments: str, key: str) -> tuple[ToolAnswer, float]:
        """Run the call; returns its answer and how long to keep it (s)."""
        t0 = time.monotonic()
        fn = self.tools.get(name)
        if fn is None:
            answer = ToolAnswer(
                error=f"tool {name!r} is not among this runner's SWARM_TOOLS",
                runner=self.label,
                refused=True,
            )
            return answer, HAND_OVER_S
        runs = await self.store.count_run(key, claim_s(self.settings.tool_timeout_s))
        if runs > MAX_RUNS:
            why = f"{name} was run {MAX_RUNS} times by runners that died running it; not again"
            return ToolAnswer(error=why, runner=self.label, runs=MAX_RUNS), HAND_OVER_S
        try:
            async with self.limits[name].turn():
                self.runs += 1
                await self.store.count_tools("runs")
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
        return answer, max(keep, HAND_OVER_S)

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


# How often a runner says again which tools it serves, and for how long each saying holds.
SERVE_EVERY_S = 2.0
SERVE_TTL_MS = 10_000
# How long one read waits for new calls, and after Redis trouble before the next.
TAKE_BLOCK_MS = 1000
TROUBLE_REST_S = 1.0


class ToolDrain:
    """A runner's drain loop over its tools' call streams: at most ``SWARM_TOOL_CONCURRENCY``
    calls of each tool at once; runs until cancelled, then lets go of the calls it holds."""

    def __init__(self, settings: Settings, store: JobStore) -> None:
        self.settings, self.store = settings, store
        self.runner = ToolRunner(settings, store)
        self.label = self.runner.label
        self.names = sorted(self.runner.tools)
        self.idle_ms = settings.claim_idle_ms
        self.running: dict[asyncio.Task[None], ToolCall] = {}
        self._take_over_at = 0.0

    async def run(self) -> None:
        serving = asyncio.create_task(self._serve())
        try:
            await self.store.open_tool_calls(self.names)
            while True:
                try:
                    await self._step()
                except StoreUnavailable as exc:
                    log.warning("tool runner %s: %s", self.label, exc)
                    await asyncio.sleep(TROUBLE_REST_S)
        finally:
            serving.cancel()
            await self._stop()

    def _free(self) -> dict[str, int]:
        """How many more calls of each tool may run now."""
        busy = [call[0] for call in self.running.values()]
        return {t: self.settings.tool_concurrency - busy.count(t) for t in self.names}

    async def _step(self) -> None:
        free = {t: n for t, n in self._free().items() if n > 0}
        if not free:
            await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
            return
        calls: list[ToolCall] = []
        if time.monotonic() >= self._take_over_at:  # calls whose runner died
            self._take_over_at = time.monotonic() + self.idle_ms / 4000
            for tool, n in free.items():
                calls += await self.store.take_over_tool_calls(tool, self.label, self.idle_ms, n)
        if not calls:
            count = min(free.values())
            calls = await self.store.take_tool_calls(list(free), self.label, count, TAKE_BLOCK_MS)
        for call in calls:
            task = asyncio.create_task(self._one(call))
            self.running[task] = call
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("tool runner %s: a call failed: %s", self.label, exc)

    async def _one(self, call: ToolCall) -> None:
        """Run one call, saying it still runs it, and keep its answer."""
        tool, entry_id, key, arguments = call
        holding = asyncio.create_task(self._hold(call))
        try:
            answer, keep_s = await self.runner.run(tool, arguments, key)
            await self.store.answer_tool_call(tool, entry_id, key, answer, keep_s)
        finally:
            holding.cancel()

    async def _hold(self, call: ToolCall) -> None:
        """Every third of the claim idle time, say the call is still this runner's."""
        tool, entry_id, key, _ = call
        ttl_s = claim_s(self.settings.tool_timeout_s)
        while True:
            await asyncio.sleep(self.idle_ms / 3000)
            with contextlib.suppress(StoreUnavailable):  # the next saying may get through
                if not await self.store.hold_tool_call(tool, entry_id, self.label, key, ttl_s):
                    log.warning("tool call %s: taken over by another runner", key)
                    return

    async def _serve(self) -> None:
        """Say, every few seconds, which tools this runner serves (what agents' waits and
        ``swarm-status`` read); Redis away only delays the next saying."""
        while True:
            try:
                await self.store.serve_tools(self.label, self.names, SERVE_TTL_MS)
            except StoreUnavailable as exc:
                log.warning("tool runner %s: cannot say what it serves: %s", self.label, exc)
            await asyncio.sleep(SERVE_EVERY_S)

    async def _stop(self) -> None:
        """Cut the calls it runs short and let them go to the other runners at once."""
        held = dict(self.running)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        with contextlib.suppress(StoreUnavailable):
            for tool in self.names:
                ids = [eid for t, eid, _, _ in held.values() if t == tool]
                await self.store.let_go_tool_calls(tool, self.label, ids)
            await self.store.serve_tools(self.label, self.names, 0)


class SessionTools:
    """A tool runner inside a Python session, for that session's own tool functions: one
    drain loop over their streams, started again with the wider set when more are added."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.store: JobStore | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self, settings: Settings, entries: Sequence[str]) -> None:
        """Run ``entries`` (``module:function``) too, beside those already run."""
        wanted = sorted(set(entries) | set(self.entries))
        if wanted == self.entries:
            return
        await self.stop()
        self.entries = wanted
        runs = msgspec.structs.replace(settings, tools=tuple(wanted))
        self.store = JobStore.from_settings(runs)
        drain = ToolDrain(runs, self.store)
        self.task = asyncio.create_task(drain.run(), name="swarm-tools")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.store is not None:
            await self.store.close()
        self.store = self.task = None


def _drain(settings: Settings) -> ToolDrain:
    """The runner of ``settings``, its tools checked (ConfigError naming what is wrong)."""
    if not settings.tools:
        raise ConfigError("no tools to run: set SWARM_TOOLS=package.module:function,...")
    check_limits(allowed_tools(settings.tools))
    return ToolDrain(settings, JobStore.from_settings(settings))


async def _serve_until_stopped(drain: ToolDrain) -> int:
    """Run ``drain`` until SIGINT or SIGTERM; 0 then."""
    await drain.store.ping()  # an unreachable Redis is one clear line within seconds
    log.info(
        "tool runner %s: %s; Redis %s%s",
        drain.label,
        ", ".join(drain.names),
        drain.settings.redis_url_masked,
        " (the default: SWARM_REDIS_URL is not set)" if drain.settings.redis_defaulted else "",
    )
    task = asyncio.create_task(drain.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        await drain.store.close()
    return 0


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
    try:
        drain = _drain(Settings.from_env(os.environ, redis_url=args.redis))
    except ConfigError as exc:
        print(f"swarm-tools: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    raise SystemExit(run("swarm-tools", _serve_until_stopped(drain)))


if __name__ == "__main__":
    main()
