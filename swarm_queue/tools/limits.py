"""The limits a tool declares on its function, kept by the runners: ``swarm_max_concurrent``
(runs at once in one runner) and ``swarm_rate_per_s`` (runs a second across every runner of
the Redis: each run takes a turn kept in Redis, by Redis's clock). A call waits for its turn
at most ``SWARM_TOOL_TIMEOUT_S``; one that would wait longer answers with that reason, as a
tool's failure answers the model."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.store import JobStore

__all__ = ["ToolBusy", "ToolLimit", "check_limits"]


class ToolBusy(Exception):
    """The tool's limits leave no turn for this call within the wait allowed."""


class ToolLimit:
    """One tool's limits in one runner (none declared: every call runs at once)."""

    def __init__(self, name: str, fn: Callable[..., Any], store: JobStore, max_wait_s: float):
        self.name, self.store, self.max_wait_s = name, store, max_wait_s
        self.max_concurrent = _positive(fn, "swarm_max_concurrent", int)
        self.rate_per_s = _positive(fn, "swarm_rate_per_s", float)
        self._slots = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else None

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the tool's runs for the block; :class:`ToolBusy` if none comes in
        time."""
        waited_s = 0.0  # for a free run: the wait allowed left is what a turn may take
        if self._slots is not None:
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.max_wait_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise ToolBusy(
                    f"{self.name} had no free run within {self.max_wait_s:g} s "
                    f"(at most {self.max_concurrent} at once)"
                ) from None
            waited_s = time.monotonic() - t0
        try:
            if self.rate_per_s:
                # (Not the time since this call began: calls taken together would each lose
                # the moments the others took to ask, and a turn exactly the wait away, due,
                # be refused: seen, of four calls at 1/s with 1 s allowed, one ran.)
                left = max(0.0, self.max_wait_s - waited_s)
                wait_s = await self.store.tool_turn(self.name, self.rate_per_s, left)
                if wait_s is None:
                    raise ToolBusy(
                        f"{self.name} is limited to {self.rate_per_s:g} calls/s: its turn "
                        f"would come after more than {self.max_wait_s:g} s"
                    )
                await asyncio.sleep(wait_s)
            yield
        finally:
            if self._slots is not None:
                self._slots.release()


def check_limits(tools: Mapping[str, Callable[..., Any]]) -> None:
    """Refuse, naming it, a tool whose declared limits are no positive numbers."""
    for fn in tools.values():
        _positive(fn, "swarm_max_concurrent", int)
        _positive(fn, "swarm_rate_per_s", float)


def _positive(fn: Callable[..., Any], attr: str, kind: type[int] | type[float]) -> Any:
    """The function's limit ``attr``, None when it declares none; ConfigError naming it when
    it is no positive number."""
    value = getattr(fn, attr, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{fn.__name__}.{attr} must be a positive number, got {value!r}")
    if kind is int and value != int(value):
        raise ConfigError(f"{fn.__name__}.{attr} must be a whole number, got {value!r}")
    return kind(value)
