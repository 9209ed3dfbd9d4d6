"""Tools the agent tests register with their tool runner (SWARM_TOOLS=tests.agent_tools:*).
Each run is written to the file SWARM_TEST_TOOL_LOG names, so a test counts runs."""

from __future__ import annotations

import asyncio
import os
import time


def _ran(name: str) -> None:
    with open(os.environ["SWARM_TEST_TOOL_LOG"], "a") as log:
        log.write(f"{name}\n")


async def slow_add(a: int, b: int) -> int:
    """Adds, slowly (every agent waiting on it meanwhile shares this one run)."""
    _ran("slow_add")
    await asyncio.sleep(0.3)
    return a + b


def boom(record: str) -> str:
    _ran("boom")
    raise ValueError(f"no such record {record}")


def forever() -> str:
    _ran("forever")
    time.sleep(5)
    return "late"


def hold(flag: str) -> str:
    """Runs while the file ``flag`` exists (a test kills its runner meanwhile)."""
    _ran("hold")
    while os.path.exists(flag):  # another process removes it
        time.sleep(0.05)
    return "released"


def fetch(url: str) -> str:
    _ran("fetch")
    return f"<page {url}>"


fetch.swarm_cache_s = 60  # type: ignore[attr-defined]


# Set by a test, in its own event loop (the Python API runs its tools in-process).
GATE: asyncio.Event | None = None


async def wait_gate(topic: str) -> str:
    """Answers only once the test opens the gate."""
    _ran("wait_gate")
    assert GATE is not None
    await GATE.wait()
    return f"opened {topic}"


async def two_at_once(n: int) -> int:
    """Runs at most two at a time in a runner; its log shows each start (+) and end (-)."""
    _ran("two_at_once+")
    await asyncio.sleep(0.2)
    _ran("two_at_once-")
    return n


two_at_once.swarm_max_concurrent = 2  # type: ignore[attr-defined]


def one_a_second(n: int) -> int:
    """At most one call a second across runners: its log shows when each started."""
    _ran(f"one_a_second@{time.time():.3f}")
    return n


one_a_second.swarm_rate_per_s = 1  # type: ignore[attr-defined]


def big(n: int) -> str:
    """An answer of ``n`` bytes (what SWARM_TOOL_MAX_BYTES cuts)."""
    _ran("big")
    return "x" * n
