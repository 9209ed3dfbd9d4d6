"""swarm-sim's fidelity to vLLM, and the endpoint boundary that translates errors.

The endpoint tests run the worker's endpoint client against an in-process swarm-sim, or a
throwaway server where swarm-sim does not give the answer needed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web

from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import (
    EndpointRejected,
    EndpointRetryable,
    ModelNotServed,
    RouteMissing,
)
from swarm_queue.common.models import SamplingParams
from swarm_queue.sim.engine import EngineConfig, SimEngine
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for, count_tokens
from swarm_queue.worker.endpoint import EndpointClient
from tests.harness import over_context
from tests.helpers import serve

# -- the deterministic model ----------------------------------------------------------


def test_completion_is_deterministic_and_respects_max_tokens() -> None:
    text, n, reason = completion_for("hello", 1000)
    assert completion_for("hello", 1000) == (text, n, reason)
    assert reason == "stop" and len(text.split()) == n
    short, n2, reason2 = completion_for("hello", 3)
    assert (n2, reason2) == (3, "length") and text.startswith(short)
    assert completion_for("hello!", 1000)[0] != text
    assert count_tokens("abcd") == 1 and count_tokens("abcde") == 2


# -- continuous batching, driven step by step --------------------------------------------


async def test_engine_runs_at_most_max_num_seqs_and_answers_when_all_sequences_finish() -> None:
    engine = SimEngine(EngineConfig(max_num_seqs=2))
    first = engine.submit([2, 5])  # one list request: two sequences
    second = engine.submit([1])
    engine.admit()
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    assert engine.step() == 0
    assert engine.step() == 1  # the 2-token sequence ends; the waiting one is admitted next
    assert not first.done()
    engine.step()  # admits [1] and finishes it
    assert second.done() and not first.done()
    while not first.done():
        engine.step()
    assert engine.finished_seqs == 3 and (engine.num_running, engine.num_waiting) == (0, 0)


def test_step_cost_grows_with_running_count_and_capacity_follows() -> None:
    c = EngineConfig(max_num_seqs=256, step_base_ms=10, step_per_seq_ms=0.05, speed=2.0)
    assert c.step_s(0) == pytest.approx(0.005)
    assert c.step_s(256) == pytest.approx((10 + 12.8) / 1000 / 2)
    assert c.capacity_seqs_per_s(20) == pytest.approx(256 / (20 * c.step_s(256)))


# -- the HTTP surface --------------------------------------------------------------------


async def _post(url: str, path: str, body: object) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
    data = msgspec.json.encode(body)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), msgspec.json.decode(payload) if payload else {}


async def test_over_long_prompt_fails_the_whole_list_in_both_error_formats(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    cfg = EngineConfig(max_model_len=50, step_base_ms=0.5)
    async with sim_fleet(1, cfg) as nested, sim_fleet(1, cfg, error_format="flat") as flat:
        body = {"model": "swarm-sim", "prompt": ["ok", "x" * 400, "fine"], "max_tokens": 10}
        status, new = await _post(nested.urls[0], "/v1/completions", body)
        assert status == 400
        assert new["error"]["type"] == "BadRequestError" and new["error"]["code"] == 400
        assert new["error"]["message"].startswith(over_context(50))
        assert new["error"]["param"] == "input_tokens"
        status, old = await _post(flat.urls[0], "/v1/completions", body)
        assert status == 400 and old["object"] == "error"
        assert old["message"] == new["error"]["message"]
        # An input to embed over the context: the same words (vLLM 0.32's pooling runner).
        texts = {"model": "swarm-sim", "input": ["ok", "x" * 400]}
        status, refused = await _post(nested.urls[0], "/v1/embeddings", texts)
        assert (status, refused["error"]["message"]) == (400, new["error"]["message"])


async def test_a_prompt_that_fits_gets_what_the_context_has_left_and_more_than_it_is_refused(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    # vLLM 0.32, seen on the CPU build: a prompt of 1022 tokens asking for 2000 of a context
    # of 2048 got 1026; max_tokens over the context refused, in each route's own name.
    async with sim_fleet(1, EngineConfig(max_model_len=60, step_base_ms=0.5)) as fleet:
        url, prompt = fleet.urls[0], "w" * 160  # 40 tokens of the 60
        body = {"model": "swarm-sim", "prompt": prompt, "max_tokens": 50, "ignore_eos": True}
        status, answer = await _post(url, "/v1/completions", body)
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 20
        assert answer["choices"][0]["finish_reason"] == "length"
        chat = {"model": "swarm-sim", "messages": [{"role": "user", "content": prompt}]}
        status, answer = await _post(url, "/v1/chat/completions", chat | {"max_tokens": 50})
        assert status == 200
        assert answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"] <= 60
        for path, name, asked in (
            ("/v1/completions", "max_tokens", {"prompt": "hi", "max_tokens": 61}),
            (
                "/v1/chat/completions",
                "max_tokens",
                {"messages": chat["messages"], "max_tokens": 61},
            ),
            ("/v1/responses", "max_output_tokens", {"input": "hi", "max_output_tokens": 61}),
        ):
            status, refused = await _post(url, path, {"model": "swarm-sim", **asked})
            assert status == 400
            assert refused["error"]["message"] == (
                f"{name}=61 cannot be greater than max_model_len=60. Please request fewer "
                f"output tokens. (parameter={name}, value=61)"
            )
            assert refused["error"]["param"] == name


async def test_chat_completions_and_models(sim_fleet: Callable[..., SimFleet]) -> None:
    async with sim_fleet(1, EngineConfig(max_model_len=1234, step_base_ms=0.5)) as fleet:
        status, chat = await _post(
            fleet.urls[0],
            "/v1/chat/completions",
            {
                "model": "swarm-sim",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
            },
        )
        assert status == 200
        assert chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] == 5
        client = EndpointClient(fleet.urls[0])
        try:
            models = await client.models()
        finally:
            await client.close()
        assert [(m.id, m.max_model_len) for m in models] == [("swarm-sim", 1234)]


def test_ignore_eos_generates_exactly_max_tokens() -> None:
    short = completion_for("hello", 1000)  # stops at its natural length (8-32 tokens)
    text, n, reason = completion_for("hello", 100, ignore_eos=True)
    assert (n, reason, len(text.split())) == (100, "length", 100)
    assert text.startswith(short[0])  # the same answer, run on past its end


async def test_an_engine_configured_with_ignore_eos_answers_every_prompt_at_full_length(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    prompts = [f"prompt {i}" for i in range(20)]
    async with sim_fleet(1, EngineConfig(step_base_ms=0.5, ignore_eos=True)) as fleet:
        client = EndpointClient(fleet.urls[0])
        try:
            body = await client.complete("swarm-sim", prompts, SamplingParams(max_tokens=40))
        finally:
            await client.close()
    assert body.usage is not None and body.usage.completion_tokens == 20 * 40
    assert [c.text for c in body.choices] == [
        completion_for(p, 40, ignore_eos=True)[0] for p in prompts
    ]


# -- the endpoint boundary ---------------------------------------------------------------


async def test_list_request_returns_indexed_choices_and_total_usage(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    async with sim_fleet(1) as fleet:
        client = EndpointClient(fleet.urls[0])
        try:
            prompts = [f"prompt {i}" for i in range(5)]
            body = await client.complete("swarm-sim", prompts, SamplingParams(max_tokens=12))
        finally:
            await client.close()
    assert [c.index for c in body.choices] == [0, 1, 2, 3, 4]
    for c in body.choices:
        assert c.text == completion_for(prompts[c.index], 12)[0]
    assert body.usage is not None
    assert body.usage.prompt_tokens == sum(count_tokens(p) for p in prompts)
    assert body.usage.completion_tokens == sum(completion_for(p, 12)[1] for p in prompts)


@pytest.mark.parametrize("error_format", ["nested", "flat"])
async def test_rejection_carries_the_servers_message(
    sim_fleet: Callable[..., SimFleet], error_format: str
) -> None:
    cfg = EngineConfig(max_model_len=40, step_base_ms=0.5)
    async with sim_fleet(1, cfg, error_format=error_format) as fleet:
        client = EndpointClient(fleet.urls[0])
        try:
            with pytest.raises(EndpointRejected) as err:
                await client.complete("swarm-sim", ["a", "y" * 200], SamplingParams(max_tokens=8))
            with pytest.raises(ModelNotServed) as missing:
                await client.complete("no-such-model", ["a"], SamplingParams())
        finally:
            await client.close()
    assert err.value.status == 400
    assert err.value.message.startswith(over_context(40))
    assert missing.value.status == 404 and "does not exist" in missing.value.message
    assert not isinstance(missing.value, RouteMissing)  # a model not served, as vLLM says


async def test_a_route_the_server_lacks_is_said_as_such_not_as_a_model_not_served() -> None:
    """Seen: a 404 on /v1/embeddings (a server with no such route) reported as "does not
    serve model". A 404 without vLLM's error object is a route missing."""
    async with serve(web.Application()) as url:  # no routes: a web framework's 404
        client = EndpointClient(url)
        try:
            with pytest.raises(RouteMissing) as err:
                await client.embed("m", ["a"])
        finally:
            await client.close()
    assert err.value.status == 404
    assert err.value.message.startswith("no /v1/embeddings route (")


async def test_server_errors_resets_and_refused_connections_are_retryable(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    faults = [FaultConfig(error_rate=1.0), FaultConfig(reset_rate=1.0)]
    async with sim_fleet(2, faults=faults) as fleet:
        for url, status in zip(fleet.urls, [500, None], strict=True):
            client = EndpointClient(url)
            try:
                with pytest.raises(EndpointRetryable) as err:
                    await client.complete("swarm-sim", ["a"], SamplingParams())
            finally:
                await client.close()
            assert err.value.status == status
    client = EndpointClient(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(EndpointRetryable, match="connection failed"):
            await client.complete("swarm-sim", ["a"], SamplingParams())
    finally:
        await client.close()


async def test_timeout_is_retryable(sim_fleet: Callable[..., SimFleet]) -> None:
    async with sim_fleet(1, faults=[FaultConfig(stall_after_s=0.0)]) as fleet:
        client = EndpointClient(fleet.urls[0])
        try:
            with pytest.raises(EndpointRetryable, match=r"no answer within 0\.2 s"):
                await client.complete("swarm-sim", ["a"], SamplingParams(), timeout_s=0.2)
        finally:
            await client.close()


async def test_a_trickling_answer_is_cut_off_at_the_timeout_as_a_whole() -> None:
    """A server that sends its headers, then a byte now and then, never finishing: httpx's
    timeout acts per read, so only a deadline on the whole answer ends the request."""

    async def trickle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for _ in range(600):
            await resp.write(b" ")
            await asyncio.sleep(0.05)
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", trickle)
    async with serve(app) as url:
        client = EndpointClient(url)
        try:
            started = time.monotonic()
            with pytest.raises(EndpointRetryable, match=r"no answer within 0\.5 s"):
                await client.complete("m", ["a"], SamplingParams(), timeout_s=0.5)
            assert time.monotonic() - started < 5  # not the 30 s the trickle lasts
        finally:
            await client.close()


async def test_metrics_expose_vllm_gauges(sim_fleet: Callable[..., SimFleet]) -> None:
    async with sim_fleet(1, EngineConfig(max_num_seqs=1, step_base_ms=50.0)) as fleet:
        ep = fleet.endpoints[0]
        pending = ep.engine.submit([100, 100])  # occupy the engine: 1 running, 1 waiting
        ep.engine.admit()
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = (await reader.read()).decode()
        writer.close()
        pending.cancel()
    assert 'vllm:num_requests_running{model_name="swarm-sim"} 1' in text
    assert 'vllm:num_requests_waiting{model_name="swarm-sim"} 1' in text


async def test_vllm_routes_go_through_the_same_client_with_its_key() -> None:
    seen: list[tuple[str, str | None]] = []
    health = [503, 200]

    async def record(request: web.Request) -> None:
        seen.append((request.path, request.headers.get("Authorization")))

    async def on_health(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=health.pop(0) if len(health) > 1 else health[0])

    async def on_metrics(request: web.Request) -> web.Response:
        await record(request)
        body = 'vllm:num_requests_running{model_name="m"} 3.0\nvllm:num_requests_waiting 1.0\n'
        return web.Response(text=body)

    async def on_tokenize(request: web.Request) -> web.Response:
        await record(request)
        got = await request.json()
        return web.json_response({"count": len(got["prompt"].split()), "tokens": []})

    app = web.Application()
    app.router.add_get("/health", on_health)
    app.router.add_get("/metrics", on_metrics)
    app.router.add_post("/tokenize", on_tokenize)
    async with serve(app) as url:
        client = EndpointClient(url, "sk-test")
        try:
            assert await client.ready() is False  # 503: the model is still loading
            assert client.unready == "/health: HTTP 503 (not ready: a model loading?)"
            assert await client.ready() is True
            assert client.unready == ""
            load = await client.load()
            assert load is not None and (load.running, load.waiting) == (3.0, 1.0)
            assert await client.tokenize("one two three", "m") == 3
        finally:
            await client.close()
    assert [p for p, _ in seen] == ["/health", "/health", "/metrics", "/tokenize"]
    assert {auth for _, auth in seen} == {"Bearer sk-test"}


async def test_vllm_routes_missing_or_unreachable_are_answers_not_errors() -> None:
    async with serve(web.Application()) as url:  # no routes at all: every one a 404
        client = EndpointClient(url)
        try:
            assert await client.ready() is True  # no /health: its other routes will tell
            assert await client.load() is None
            assert await client.tokenize("x", "m") is None
        finally:
            await client.close()
    gone = EndpointClient(f"http://127.0.0.1:{free_port()}")
    try:
        assert await gone.ready(timeout_s=2) is False
        # What a failed probe says: the cause (seen: "/health not ready" for a refused one).
        assert gone.unready.startswith("/health: connection failed: ClientConnectorError")
        assert await gone.load(timeout_s=2) is None
        assert await gone.tokenize("x", "m", timeout_s=2) is None
    finally:
        await gone.close()


def test_a_simulator_given_a_port_another_process_holds_says_so() -> None:
    """Not "listening" because a neighbour listens there: the launch checks the pid."""
    import socket

    from swarm_queue.sim.launch import SimExited, launch

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SimExited):
            launch([port], timeout_s=20)


# -- how requests leave the worker ------------------------------------------------------


class _Seen(msgspec.Struct):
    """A request as a server got it."""

    url: str
    authorization: str
    body: Any


def _answering(seen: list[_Seen]) -> web.Application:
    """A server that notes each request and answers any completion of one prompt."""

    async def answer(request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        seen.append(_Seen(str(request.url), request.headers.get("Authorization", ""), body))
        choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response({"id": "c", "choices": [choice], "usage": usage})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


async def test_credentials_in_an_endpoint_url_are_never_sent_nor_said() -> None:
    """The settings refuse an endpoint URL with ``user:password@`` (vLLM takes a bearer key);
    a client made with one anyway sends the key alone, and its label masks the password."""
    seen: list[_Seen] = []
    async with serve(_answering(seen)) as url:
        client = EndpointClient(url.replace("http://", "http://alice:p%40ss@"), "the-key")
        try:
            body = await client.complete("m", ["a"], SamplingParams())
        finally:
            await client.close()
    assert [c.text for c in body.choices] == ["ok"]
    assert seen[0].authorization == "Bearer the-key"
    assert "p%40ss" not in client.label and "alice:***@" in client.label


async def test_the_bearer_key_is_sent_without_credentials_in_the_url() -> None:
    seen: list[_Seen] = []
    async with serve(_answering(seen)) as url:
        client = EndpointClient(url, "the-key")
        try:
            await client.complete("m", ["a"], SamplingParams())
        finally:
            await client.close()
    assert seen[0].authorization == "Bearer the-key"
    assert seen[0].body == {"model": "m", "prompt": ["a"], "max_tokens": 256}


async def test_a_proxy_named_by_the_environment_carries_requests_unless_no_proxy_names_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As curl and httpx do (and the openai client did): ``http_proxy`` carries requests to an
    endpoint, unless ``no_proxy`` lists its host."""
    seen: list[_Seen] = []
    async with serve(_answering(seen)) as proxy:
        monkeypatch.setenv("http_proxy", proxy)
        monkeypatch.setenv("no_proxy", "direct.invalid")
        via = EndpointClient("http://engine.invalid:8000")
        direct = EndpointClient("http://direct.invalid:8000")
        try:
            await via.complete("m", ["a"], SamplingParams())
            with pytest.raises(EndpointRetryable, match="connection failed"):
                await direct.complete("m", ["a"], SamplingParams(), timeout_s=10)
        finally:
            await via.close()
            await direct.close()
    assert [r.url for r in seen] == ["http://engine.invalid:8000/v1/completions"]


def test_the_worker_does_not_import_the_openai_sdk() -> None:
    """Its requests go straight through aiohttp: openai's import was 0.7 s of a worker's
    0.8 s start (docs/BENCHMARKS.md, 10)."""
    code = (
        "import sys, swarm_queue.worker.app, swarm_queue.worker.main;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('openai', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_closed_endpoint_client_opens_no_session_nobody_would_close(
    sim_fleet: Callable[..., SimFleet],
) -> None:
    """A background task still running at a stop (a reduce's /tokenize, the window's /metrics)
    called a closed client and opened a session that nothing closed (an 'Unclosed client
    session' at exit, seen once in CI). After close, a call fails as a connection does."""
    async with sim_fleet(1) as fleet:
        client = EndpointClient(fleet.urls[0])
        assert await client.ready(timeout_s=5)
        await client.close()
        assert not await client.ready(timeout_s=5)
        assert client._session is None
        assert client.unready == (
            f"/health: connection failed: ClientConnectionError: the client of "
            f"{fleet.urls[0]} is closed"
        )
