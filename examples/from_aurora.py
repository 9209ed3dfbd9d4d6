"""Every Aurora-Swarm pattern, run on swarm-queue, on one machine with nothing set up: a private
Redis (the embedded default) and simulated vLLM endpoints (two serving a generation model,
one an embeddings model), drained in this process.

    python examples/from_aurora.py

Each pattern prints one line; the uncertainty measures need numpy (``pip install
'swarm-queue[uq]'``) and say so when it is missing. On a real fleet, give ``Swarm`` your
Redis URL instead of endpoints, and run workers on the compute nodes.
"""

from __future__ import annotations

import asyncio
import importlib.util

from swarm_queue import Step, Swarm, TreeReduce, scatter_gather
from swarm_queue.common.embedded import free_port
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet

QUESTIONS = [f"What does gene G{i:03d} do?" for i in range(40)]


def _fleet() -> SimFleet:
    fast = EngineConfig(step_base_ms=2.0, step_per_seq_ms=0.0)
    return SimFleet(
        [SimEndpoint(free_port(), fast, model=m) for m in ("writer", "writer", "embedder")]
    )


async def main() -> None:
    async with _fleet() as fleet:
        urls = fleet.urls
        # scatter_gather(pool, prompts): prompts in, answers out, in order.
        results = await scatter_gather(QUESTIONS, urls[:2], model="writer", max_tokens=16)
        print(f"scatter_gather        {len(results)} answers in order, {results[0].text!r:.40}")

        async with Swarm(endpoints=urls, poll_ms=50) as swarm:
            # broadcast(pool, prompt): one prompt to every agent.
            answers = await swarm.broadcast(
                "Name a kinase.", 8, model="writer", max_tokens=8, temperature=0.9
            )
            print(f"broadcast             {len(answers)} answers to one prompt")

            # tree_reduce / broadcast_and_reduce: the answers reduced by the fleet itself.
            job = await swarm.submit(
                QUESTIONS,
                model="writer",
                max_tokens=16,
                reduce=TreeReduce("Merge these findings:\n{responses}", fanin=8),
            )
            final = await swarm.final(job)
            print(f"tree_reduce           one answer from {final.used if final else 0} inputs")

            # pipeline / fan_out_fan_in: each answer goes on the moment it is committed.
            job = await swarm.pipeline(
                QUESTIONS,
                [
                    Step("Check this answer: {answer}\nQuestion: {prompt}", max_tokens=12),
                    Step("Summarise: {answer}", max_tokens=8),
                ],
                model="writer",
                max_tokens=16,
            )
            chains = [c async for c in swarm.chains(job)]
            through = sum(1 for c in chains if c.ok)
            print(f"pipeline              {through}/{len(chains)} inputs through 3 steps")

            # blackboard: rounds of roles on a shared board kept in Redis.
            board = await swarm.blackboard(
                "study",
                ["hypotheses", "critiques"],
                lambda role, s: f"Board: {s}\nAs the {role}, add one entry.",
                max_rounds=3,
                agents={"hypotheses": 2, "critiques": 1},
                model="writer",
                max_tokens=12,
            )
            sizes = {k: len(v) for k, v in board.sections.items()}
            print(f"blackboard            {board.rounds} rounds, board {sizes}")

            # scatter_gather_embeddings: /v1/embeddings on the embeddings model's endpoints.
            job = await swarm.submit(QUESTIONS, embed=True, model="embedder")
            vectors = [r for r in await swarm.gather(job) if r.embedding]
            print(f"embeddings            {len(vectors)} vectors")

            # uq: several samples per question, and what they agree on.
            job = await swarm.submit(
                QUESTIONS[:10],
                model="writer",
                max_tokens=8,
                samples=5,
                temperature=0.8,
                per_prompt="vote",
            )
            shares = [r.value["share"] for r in await swarm.gather(job) if r.value]
            print(f"self-consistency      mean majority share {sum(shares) / len(shares):.2f}")
            if importlib.util.find_spec("numpy") is None:
                print("semantic_entropy      needs numpy: pip install 'swarm-queue[uq]'")
                return
            job = await swarm.submit(
                QUESTIONS[:10],
                model="writer",
                max_tokens=8,
                samples=5,
                temperature=0.8,
                per_prompt="semantic-entropy",
                per_prompt_model="embedder",
            )
            entropies = [c.steps[-1].value["entropy"] async for c in swarm.chains(job) if c.ok]
            print(f"semantic_entropy      {len(entropies)} prompts, max {max(entropies):.3f} nats")


if __name__ == "__main__":
    asyncio.run(main())
