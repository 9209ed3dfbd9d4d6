"""Usage, line by line: what vLLM reports for each prompt's request alone, however prompts
were batched; unknown is null, never a 0 that reads as a count; a job's status sums them."""

from __future__ import annotations

import io
from collections.abc import Callable

import aiohttp
import msgspec

from swarm_queue.common.embedded import free_port
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.models import Chat, JobSpec, Result, SamplingParams, Usage
from swarm_queue.common.request import Route
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue, enqueue_prompts
from swarm_queue.producer.gateway.asjob import usage_of
from swarm_queue.producer.openai_batch import openai_line
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet
from swarm_queue.sim.text import count_tokens, sample_for
from swarm_queue.worker.replies import Choice
from swarm_queue.worker.usage import choices_usage
from tests.helpers import collect_lines, prompts, run_engine

FAST = EngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0)


async def test_a_list_batched_line_says_null_usage_and_the_job_the_exact_total(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Sixteen prompts to a request, three samples each: vLLM reports a list's total only, so
    a line's usage is null (asking for every prompt's token ids cost a third of the throughput
    at large batches), never a guess; the job's status says the servers' exact sums."""
    n, params = 60, SamplingParams(max_tokens=12, temperature=1.0, n=3)
    await enqueue_prompts(store, JobSpec(job="u", params=params), prompts(n))
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(batch_size=16, speculate=False), store, fleet.urls)
        served = sum(e.prompt_tokens_total for e in fleet.endpoints)
    lines = await collect_lines(store, "u")
    assert [x["usage"] for x in lines] == [None] * n
    status = await store.status("u")
    completion = sum(sample_for(p, 12, j)[1] for p, _ in prompts(n) for j in range(3))
    assert (status.prompt_tokens, status.completion_tokens) == (served, completion)
    assert served == sum(count_tokens(p) for p, _ in prompts(n))


async def test_a_line_usage_job_says_each_prompts_own_usage_however_it_was_batched(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Asked for (--line-usage; every gateway batch): list completions ask the server for
    token ids, so each line's usage is what the server counts for that prompt alone (its
    prompt's tokens once, every sample's answer), and the lines add up to the job's total."""
    n, params = 60, SamplingParams(max_tokens=12, temperature=1.0, n=3)
    job = JobSpec(job="u", params=params, line_usage=True)
    await enqueue_prompts(store, job, prompts(n))
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(batch_size=16, speculate=False), store, fleet.urls)
    lines = await collect_lines(store, "u")
    assert [x["usage"] for x in lines] == [
        {"prompt_tokens": count_tokens(p), "completion_tokens": sum(sample_for(p, 12, j)[1]
                                                                    for j in range(3))}
        for p, _ in prompts(n)
    ]  # fmt: skip
    status = await store.status("u")
    assert status.prompt_tokens == sum(x["usage"]["prompt_tokens"] for x in lines)
    assert status.completion_tokens == sum(x["usage"]["completion_tokens"] for x in lines)


async def test_a_line_usage_embeddings_job_counts_each_input_alone(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """Embeddings: vLLM counts a list's total only, so a line_usage job sends each input
    alone; every line says its input's count, in JSON Lines and OpenAI's batch lines."""
    texts = [f"text number {i} " * (1 + i % 3) for i in range(20)]
    options = JobOptions(model="embedder", embed=True, line_usage=True)
    embed, _ = build_spec("e", options, source="t")
    await enqueue_prompts(store, embed, [(t, None) for t in texts])
    endpoint = SimEndpoint(free_port(), FAST, model="embedder")
    async with SimFleet([endpoint]):
        await run_engine(make_settings(batch_size=16, speculate=False), store, [endpoint.url])
    lines = await collect_lines(store, "e")
    assert [x["usage"] for x in lines] == [
        {"prompt_tokens": count_tokens(t), "completion_tokens": 0} for t in texts
    ]
    bodies = [x["response"]["body"] for x in await collect_lines(store, "e", "openai")]
    assert [b["usage"]["prompt_tokens"] for b in bodies] == [count_tokens(t) for t in texts]
    assert (await store.status("e")).prompt_tokens == sum(map(count_tokens, texts))


def test_a_prompts_usage_is_read_from_its_choices_token_ids_where_a_server_gives_them() -> None:
    """vLLM's return_token_ids (swarm-sim answers it too): a prompt's usage is its prompt's
    ids once and every sample's answer ids; without them it is unknown."""
    three = [
        Choice(index=j, text="x", prompt_token_ids=[1, 2, 3, 4], token_ids=[7] * (j + 2))
        for j in range(3)
    ]
    assert choices_usage(three) == Usage(4, 2 + 3 + 4)
    assert choices_usage([Choice(index=0, text="x")]) is None
    assert choices_usage([Choice(index=0, text="x", token_ids=[1])]) is None


async def test_an_embedding_line_whose_count_is_unknown_says_null_never_zero(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """A list's usage is its total only: its lines say null, here and in OpenAI's batch lines,
    never a 0 that reads as a count (nor counted by /tokenize, one request an input, which
    cost 0.21x the throughput); a request of one input is counted exactly."""
    texts = [f"text {i}" for i in range(17)]
    embed, _ = build_spec("e", JobOptions(model="embedder", embed=True), source="t")
    await enqueue_prompts(store, embed, [(t, None) for t in texts])
    endpoint = SimEndpoint(free_port(), FAST, model="embedder")
    async with SimFleet([endpoint]):
        await run_engine(make_settings(batch_size=16, speculate=False), store, [endpoint.url])
    lines = await collect_lines(store, "e")
    assert [x["usage"] for x in lines[:16]] == [None] * 16
    assert lines[16]["usage"] == {"prompt_tokens": count_tokens(texts[16]), "completion_tokens": 0}
    bodies = [x["response"]["body"] for x in await collect_lines(store, "e", "openai")]
    assert bodies[0]["usage"] is None
    assert bodies[16]["usage"] == {
        "prompt_tokens": count_tokens(texts[16]),
        "total_tokens": count_tokens(texts[16]),
    }


async def test_swarm_sim_answers_return_token_ids_as_vllm_does() -> None:
    """Each choice carries its prompt's token ids and its own, their numbers what the
    request's usage adds up (a prompt's counted once however many samples)."""
    endpoint = SimEndpoint(free_port(), FAST)
    texts = ["a short prompt", "a somewhat longer prompt than the first one"]
    body = {"model": "swarm-sim", "prompt": texts, "max_tokens": 8, "n": 2, "temperature": 1.0,
            "return_token_ids": True}  # fmt: skip
    url = f"{endpoint.url}/v1/completions"
    async with (
        SimFleet([endpoint]),
        aiohttp.ClientSession() as http,
        http.post(url, json=body) as r,
    ):
        answer = await r.json()
    choices = answer["choices"]
    assert [len(c["prompt_token_ids"]) for c in choices] == [
        count_tokens(t) for t in texts for _ in range(2)
    ]
    assert answer["usage"]["prompt_tokens"] == sum(map(count_tokens, texts))
    assert answer["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)


async def test_cached_prompt_tokens_the_engine_reports_reach_each_line_the_job_and_the_batch(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """An engine that says which prompt tokens it found in its prefix cache (vLLM's
    --enable-prompt-tokens-details): each chat line carries its request's count, the job's
    status sums them to the engine's own total of hits, and a batch's usage and output lines
    say them as OpenAI writes them."""
    system = "You are a careful reader of long documents. " * 8
    lines = [
        msgspec.json.encode(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"Question {i}?"},
                    ]
                },
            }
        )
        for i in range(12)
    ]
    spec = JobSpec(job="c", params=SamplingParams(max_tokens=8), request=Chat())
    stream = io.BytesIO(b"\n".join(lines) + b"\n")
    assert (await enqueue(make_settings(), spec, "c.jsonl", stream)).total == 12
    async with sim_fleet(1, prompt_tokens_details=True) as fleet:
        await run_engine(make_settings(batch_size=4), store, fleet.urls)
        hits = fleet.endpoints[0].prefix.hits
    cached = [x["usage"]["cached_tokens"] for x in await collect_lines(store, "c")]
    # The first question computes the shared system prompt; every later one finds it.
    assert sorted(cached)[0] == 0 and len(set(cached[1:] if cached[0] == 0 else cached)) == 1
    assert sum(cached) == hits > 0
    status = await store.status("c")
    assert status.cached_tokens == hits and status.reasoning_tokens == 0
    usage = usage_of(status)
    assert usage.input_tokens_details.cached_tokens == hits
    assert usage.output_tokens_details.reasoning_tokens == 0
    line = Result(index=0, text="x", usage=Usage(10, 2, cached_tokens=8))
    body = msgspec.json.decode(openai_line("c", line, route=Route.CHAT))["response"]["body"]
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert body["usage"]["completion_tokens_details"] is None  # not said: null, as vLLM
