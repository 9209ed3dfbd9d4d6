"""swarm-sim for agents: tool calls in vLLM's format, a schema's object, and automatic prefix
caching with vLLM's counters."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

import msgspec
import openai

from swarm_queue.common.models import Chat, JobSpec, PromptItem, SamplingParams
from swarm_queue.common.request import render, request_key
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.prefix import BLOCK_CHARS, PrefixCache
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import count_tokens
from tests.helpers import run_engine

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("lookup", "fetch")
]
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}
SCHEMA_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
TASK = 'Find the paper. CALL lookup({"id": 3}) then CALL fetch({"url": "doi:10/x"})'


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{"))


async def test_an_agents_turns_call_each_tool_then_answer_the_schema(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        calls = []
        for turn in range(3):
            # The schema only at the last turn: under "auto" it holds the whole answer to it.
            guided = {"response_format": SCHEMA_FORMAT} if turn == 2 else {}
            r = await client.chat.completions.create(
                model="swarm-sim", messages=messages, tools=TOOLS, max_tokens=64, **guided
            )
            choice = r.choices[0]
            if choice.finish_reason != "tool_calls":
                break
            call = (choice.message.tool_calls or [])[0]
            calls.append((call.function.name, json.loads(call.function.arguments)))
            messages.append(choice.message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "found"})
        await client.close()
    assert calls == [("lookup", {"id": 3}), ("fetch", {"url": "doi:10/x"})]
    assert choice.finish_reason == "stop" and choice.message.tool_calls in (None, [])
    answer = json.loads(choice.message.content or "")
    assert set(answer) == {"title", "year"} and isinstance(answer["year"], int)


async def test_a_tool_not_offered_is_not_called(sim_fleet: Callable[..., SimFleet]) -> None:
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
        r = await client.chat.completions.create(
            model="swarm-sim",
            messages=[{"role": "user", "content": 'CALL search({"q": 1})'}],
            tools=TOOLS,
            max_tokens=8,
        )
        await client.close()
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content


async def test_a_repeated_prefix_is_a_cache_hit_on_vllms_counters(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    shared = "You are a careful reviewer. " * 20  # 560 characters: 8 whole blocks
    async with sim_fleet(1, tool_parser="hermes") as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
        for tail in ("first paper", "second paper"):
            await client.completions.create(model="swarm-sim", prompt=shared + tail, max_tokens=4)
        await client.close()
        # (In a thread: the simulator answers on this test's own event loop.)
        queries = await asyncio.to_thread(
            _counter, fleet.urls[0], "vllm:prefix_cache_queries_total"
        )
        hits = await asyncio.to_thread(_counter, fleet.urls[0], "vllm:prefix_cache_hits_total")
    assert queries == count_tokens(shared + "first paper") + count_tokens(shared + "second paper")
    assert hits == 8 * BLOCK_CHARS // 4  # the second prompt's 8 shared blocks


def test_the_prefix_cache_forgets_its_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity=4)
    a, b = "a" * 4 * BLOCK_CHARS, "b" * 4 * BLOCK_CHARS
    assert cache.lookup(a) == count_tokens(a)  # nothing cached yet
    assert cache.lookup(a) == 0  # every block cached
    assert cache.lookup(b) == count_tokens(b)  # b's blocks push a's out
    assert cache.lookup(a) == count_tokens(a)
    assert (cache.queries, cache.hits) == (4 * count_tokens(a), count_tokens(a))


async def test_a_chat_job_offered_tools_keeps_the_calls_an_answer_asks_for(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    spec = JobSpec(job="t", request=Chat(tools=TOOLS), params=SamplingParams(max_tokens=16))
    texts = [TASK if i % 2 else f"plain question {i}" for i in range(40)]
    await enqueue_prompts(store, spec, [(t, None) for t in texts])
    async with sim_fleet(2, tool_parser="hermes") as fleet:
        await run_engine(settings, store, fleet.urls)
    results = await store.read_results("t", 40)
    for i, r in enumerate(results):
        assert r.ok, r
        if i % 2:
            assert r.text is None and r.finish_reason == "tool_calls"
            assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls or []] == [
                ("lookup", {"id": 3})
            ]
        else:
            assert r.text and r.tool_calls is None
    # Tools are part of what is asked: their request's key is another.
    item = PromptItem.of(0, TASK, None)
    without = msgspec.structs.replace(spec, request=Chat())
    assert request_key(render(spec, item)) != request_key(render(without, item))
    assert render(spec, item).tools == TOOLS and render(without, item).tools is None
