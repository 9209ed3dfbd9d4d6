"""The tools of examples/agents.py: plain functions a tool runner is allowed to run
(PYTHONPATH=examples SWARM_TOOLS=agent_tools:*), or given to Swarm.agents as functions."""

from __future__ import annotations

import asyncio

CATALOGUE = {
    f"doc{i}": f"Paper {i}: a study of enzyme E{i % 7}, published {2000 + i % 25}."
    for i in range(100)
}


async def search(query: str) -> str:
    """Search the shared catalogue (every agent asks the same: it runs once)."""
    await asyncio.sleep(0.2)
    return f"{len(CATALOGUE)} papers match {query!r}"


def fetch(url: str) -> str:
    """Fetch one document of the catalogue."""
    return CATALOGUE.get(url, f"no document {url}")


fetch.swarm_cache_s = 600  # type: ignore[attr-defined]  # a document does not change: keep it
