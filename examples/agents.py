"""Agents on swarm-queue, on one machine with nothing set up: a private Redis (the embedded
default), simulated vLLM endpoints that call tools as vLLM's tool parsers do, the tools run
in this process. Each agent searches a shared catalogue (one search for all of them), fetches
its own paper, and answers as JSON of a schema.

    python examples/agents.py

On a real fleet: `swarm-enqueue papers.jsonl --job papers --task task.txt --tools
search,fetch --schema schema.json`, workers on the GPU nodes, `swarm-tools` wherever the
tools can run (PYTHONPATH=examples SWARM_TOOLS=agent_tools:*), and `swarm-collect papers
--out papers.jsonl --wait`.
"""

from __future__ import annotations

import asyncio

from agent_tools import fetch, search  # beside this script

from swarm_queue import Swarm
from swarm_queue.common.embedded import free_port
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet

TASK = (
    'Summarise paper {n}. CALL search({{"query": "enzymes"}}) then CALL fetch({{"url": "doc{n}"}})'
)
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}


async def main() -> None:
    fast = EngineConfig(step_base_ms=2.0, step_per_seq_ms=0.0)
    async with (
        SimFleet([SimEndpoint(free_port(), fast, tool_parser="hermes") for _ in range(2)]) as fleet,
        Swarm(endpoints=fleet.urls, poll_ms=50) as swarm,
    ):
        ok = turns = 0
        async for agent in swarm.agents(
            task=TASK,
            inputs=[{"n": i} for i in range(50)],
            tools=[search, fetch],
            output_schema=SCHEMA,
            system="You are a careful research assistant.",
            max_turns=3,
            max_tokens=64,
        ):
            ok += agent.ok
            turns += agent.turns
            if agent.index == 0:
                print(f"agent 0     {agent.output} after {agent.turns} turns")
        hits = sum(e.prefix.hits for e in fleet.endpoints)
        queries = sum(e.prefix.queries for e in fleet.endpoints)
        print(f"agents      {ok}/50 answered as data, {turns} turns")
        print(f"prefix      {hits / queries:.0%} of prompt tokens from the engines' prefix cache")


if __name__ == "__main__":
    asyncio.run(main())
