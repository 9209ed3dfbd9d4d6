"""Usage, line by line: what vLLM reports for each prompt's request alone, however prompts
were batched; unknown is null, never a 0 that reads as a count; a job's status sums them."""

from __future__ import annotations

from collections.abc import Callable

from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import count_tokens, sample_for
from tests.helpers import collect_lines, prompts, run_engine


async def test_each_list_batched_completion_line_says_its_own_prompts_usage(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Sixteen prompts to a request, three samples each: every line's usage is its prompt's
    tokens once and its three answers' tokens, as the server counts that prompt alone; the
    lines add up to what the servers counted, and the job's status says the same sums."""
    n, params = 60, SamplingParams(max_tokens=12, temperature=1.0, n=3)
    await enqueue_prompts(store, JobSpec(job="u", params=params), prompts(n))
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(batch_size=16, speculate=False), store, fleet.urls)
        served = sum(e.prompt_tokens_total for e in fleet.endpoints)
    lines = await collect_lines(store, "u")
    want = [
        {
            "prompt_tokens": count_tokens(p),
            "completion_tokens": sum(sample_for(p, 12, j)[1] for j in range(3)),
        }
        for p, _ in prompts(n)
    ]
    assert [x["usage"] for x in lines] == want
    assert sum(x["usage"]["prompt_tokens"] for x in lines) == served
    status = await store.status("u")
    assert (status.prompt_tokens, status.completion_tokens) == (
        served,
        sum(w["completion_tokens"] for w in want),
    )
