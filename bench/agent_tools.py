"""The tool of the agents benchmark (bench/agents.py): a lookup that takes 200 ms, counted
per run in the file BENCH_TOOL_LOG names (both systems run it, each its own way)."""

from __future__ import annotations

import asyncio
import os


async def lookup(key: str) -> str:
    """Look a key up (200 ms)."""
    with open(os.environ["BENCH_TOOL_LOG"], "a") as log:
        log.write(f"{key}\n")
    await asyncio.sleep(0.2)
    return f"the value of {key}"
