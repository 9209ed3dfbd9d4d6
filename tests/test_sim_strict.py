"""swarm-sim refuses what vLLM refuses, with vLLM's message, and honours what vLLM honours
(vLLM 0.32.0, the engine ``bench/interop_vllm.py`` checks): greedy ``n`` > 1, ``tool_choice``
``auto``, ``required`` and a named tool without the server flags they need, ``none``, a
``response_format`` beside tools, a seeded request."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest

from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.tools import AUTO_REFUSED

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": n,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for n in ("lookup", "fetch")
]
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}
ASK = [{"role": "user", "content": 'Go. CALL fetch({"q": "x"})'}]


@pytest.fixture
async def clients(
    sim_fleet: Callable[..., SimFleet],
) -> AsyncIterator[tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]]:
    """A client of a server started without a tool-call parser, and one of a server with."""
    async with sim_fleet(1) as plain, sim_fleet(1, tool_parser="hermes") as parsing:
        made = [
            openai.AsyncOpenAI(base_url=f.urls[0] + "/v1", api_key="x", max_retries=0)
            for f in (plain, parsing)
        ]
        yield made[0], made[1]
        for c in made:
            await c.close()


async def test_greedy_sampling_of_several_answers_is_refused_on_both_routes(
    clients: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    client, _ = clients
    with pytest.raises(
        openai.BadRequestError, match=r"n must be 1 when using greedy sampling, got 3\."
    ):
        await client.completions.create(
            model="swarm-sim", prompt=["a", "b"], n=3, temperature=0, max_tokens=4
        )
    with pytest.raises(
        openai.BadRequestError, match=r"n must be 1 when using greedy sampling, got 2\."
    ):
        await client.chat.completions.create(
            model="swarm-sim", messages=ASK, n=2, temperature=0, max_tokens=4
        )
    sampled = await client.completions.create(
        model="swarm-sim", prompt=["a", "b"], n=3, temperature=0.8, seed=7, max_tokens=4
    )
    assert [c.index for c in sampled.choices] == list(range(6))
    greedy = await client.completions.create(
        model="swarm-sim", prompt="a", n=1, temperature=0, seed=7, max_tokens=4
    )
    assert len(greedy.choices) == 1


async def test_tools_left_to_the_model_need_the_servers_tool_parser(
    clients: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    plain, parsing = clients
    for choice in ({}, {"tool_choice": "auto"}):
        with pytest.raises(openai.BadRequestError) as refused:
            await plain.chat.completions.create(
                model="swarm-sim", messages=ASK, tools=TOOLS, max_tokens=8, **choice
            )
        assert refused.value.status_code == 400
        assert AUTO_REFUSED in str(refused.value)
    r = await parsing.chat.completions.create(
        model="swarm-sim", messages=ASK, tools=TOOLS, max_tokens=8
    )
    call = (r.choices[0].message.tool_calls or [])[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("fetch", {"q": "x"})
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    # Without tools there is nothing to choose: a plain chat request is answered.
    r = await plain.chat.completions.create(model="swarm-sim", messages=ASK, max_tokens=8)
    assert r.choices[0].message.content


async def test_a_required_or_named_tool_needs_the_tool_parser_and_none_never_calls(
    clients: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """As vLLM 0.32 answers (checked on it): every choice but "none" needs --tool-call-parser;
    "required" and a named tool do not need --enable-auto-tool-choice."""
    plain, _ = clients
    named: Any = {"type": "function", "function": {"name": "lookup"}}
    refusals = [
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (named, 'tool_choice=function "lookup" requires --tool-call-parser to be set'),
    ]
    for choice, message in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            await plain.chat.completions.create(
                model="swarm-sim", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=8
            )
        assert message in str(refused.value)
    r = await plain.chat.completions.create(
        model="swarm-sim", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content
    unknown: Any = {"type": "function", "function": {"name": "rm_rf"}}
    with pytest.raises(openai.BadRequestError, match="does not match any of the specified"):
        await plain.chat.completions.create(
            model="swarm-sim", messages=ASK, tools=TOOLS, tool_choice=unknown, max_tokens=8
        )
    async with sim_fleet(1, tool_parser="hermes", auto_tool_choice=False) as fleet:
        parsing = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x", max_retries=0)
        try:
            await _forced_calls(parsing)
        finally:
            await parsing.close()


async def _forced_calls(client: openai.AsyncOpenAI) -> None:
    """On a server with a parser and no auto choice: auto refused, required and named called."""
    with pytest.raises(openai.BadRequestError, match="auto"):
        await client.chat.completions.create(
            model="swarm-sim", messages=ASK, tools=TOOLS, max_tokens=8
        )
    plain = client
    r = await plain.chat.completions.create(
        model="swarm-sim", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=8
    )
    message = r.choices[0].message
    call = (message.tool_calls or [])[0]
    # The directive's call; vLLM 0.32 (hermes) writes a forced call with content "", finish
    # "tool_calls" when required, "stop" when named (OpenAI's rule).
    assert (call.function.name, json.loads(call.function.arguments)) == ("fetch", {"q": "x"})
    assert (message.content, r.choices[0].finish_reason) == ("", "tool_calls")
    named: Any = {"type": "function", "function": {"name": "lookup"}}
    r = await plain.chat.completions.create(
        model="swarm-sim", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=8
    )
    call = (r.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "lookup"  # not the directive's: the named one, filled in
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("", "stop")
    assert set(json.loads(call.function.arguments)) == {"q"}
    # Nothing asked for, a call is still required: the first tool's parameters filled in.
    r = await plain.chat.completions.create(
        model="swarm-sim",
        messages=[{"role": "user", "content": "Hello."}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=8,
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls or []] == ["lookup"]


async def test_a_schema_beside_tools_holds_an_auto_answer_but_not_a_required_call(
    clients: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    _, parsing = clients
    r = await parsing.chat.completions.create(
        model="swarm-sim", messages=ASK, tools=TOOLS, response_format=FORMAT, max_tokens=64
    )
    message = r.choices[0].message
    assert not message.tool_calls  # guided decoding wrote the schema's object: no call
    assert set(json.loads(message.content or "")) == {"title"}
    r = await parsing.chat.completions.create(
        model="swarm-sim",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        response_format=FORMAT,
        max_tokens=64,
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls or []] == ["fetch"]


def test_auto_tool_choice_needs_a_tool_parser_as_in_vllm() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "swarm_queue.sim", "--ports", "1", "--enable-auto-tool-choice"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 1
    assert "--enable-auto-tool-choice needs --tool-call-parser" in got.stderr
