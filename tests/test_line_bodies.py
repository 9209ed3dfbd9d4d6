"""An OpenAI batch output line's body is the engine's own answer to that line sent alone, as
the ``openai`` SDK reads it (every field of its type, less ids and times; :mod:`bench.sdkview`):
for each line kind, against swarm-sim, which answers as vLLM 0.32 does (bench/interop_gateway.py
checks the same against a real vLLM)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec
import pytest

from bench.sdkview import sdk_view
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue
from swarm_queue.sim.server import SimFleet
from tests.helpers import collect_lines, run_engine

_LINES: dict[str, list[dict[str, Any]]] = {
    "completions": [
        {"prompt": f"Check paper {i}.", "max_tokens": 12, "temperature": 0} for i in range(4)
    ],
    "chat/completions": [
        {
            "messages": [{"role": "user", "content": f"Weigh finding {i}."}],
            "max_tokens": 12,
            "n": 2,
            "temperature": 0.8,
            "seed": i,
        }
        for i in range(4)
    ],
    "responses": [
        {"input": f"Name finding {i}.", "max_output_tokens": 12, "temperature": 0}
        | ({"instructions": "Be brief."} if i % 2 else {})
        for i in range(4)
    ]
    + [  # the sampling left to the engine's defaults, echoed as it ran them
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Why?"}]}],
            "max_output_tokens": 4000,
            "instructions": "Be brief.",
        }
    ],
    "embeddings": [{"input": f"Observation {i}."} for i in range(4)],
}


@pytest.mark.parametrize("route", sorted(_LINES))
async def test_each_line_body_is_the_engines_own_answer_to_it_alone(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    route: str,
) -> None:
    options = JobOptions(
        chat=route == "chat/completions",
        responses=route == "responses",
        embed=route == "embeddings",
        line_usage=True,
    )
    spec, _ = build_spec("bodies", options, source="test")
    bodies = [b | {"model": "m"} for b in _LINES[route]]
    lines = [
        {"custom_id": f"l{i}", "method": "POST", "url": f"/v1/{route}", "body": b}
        for i, b in enumerate(bodies)
    ]
    stream = io.BytesIO(b"".join(msgspec.json.encode(x) + b"\n" for x in lines))
    assert (await enqueue(make_settings(), spec, "b.jsonl", stream)).total == len(lines)
    async with sim_fleet(1, model="m") as fleet:
        await run_engine(make_settings(), store, fleet.urls)
        out = await collect_lines(store, "bodies", "openai")
        async with aiohttp.ClientSession() as http:
            alone = []
            for body in bodies:
                async with http.post(f"{fleet.urls[0]}/v1/{route}", json=body) as resp:
                    assert resp.status == 200
                    alone.append(await resp.json())
    assert [x["custom_id"] for x in out] == [f"l{i}" for i in range(len(lines))]
    for x, own in zip(out, alone, strict=True):
        assert x["response"]["status_code"] == 200
        assert sdk_view(route, x["response"]["body"]) == sdk_view(route, own), x["custom_id"]
