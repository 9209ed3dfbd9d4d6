"""Chat models and sampling: --chat (one chat request per prompt) and --template (a chat
template written out, list-batched) against swarm-sim; sampling and structured-output fields
reaching the server; answers validated against a JSON Schema, failures kept per index."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from swarm_queue.common.chat import Message
from swarm_queue.common.errors import ConfigError, InputError
from swarm_queue.common.models import Chat, Completion, JobSpec, SamplingParams
from swarm_queue.common.schema import AnswerValidator
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue, enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from tests.helpers import collect_lines, prompts, run_engine, serve

CHAT_TEMPLATE = "<|user|>\n{prompt}\n<|assistant|>\n"  # what swarm-sim's chat endpoint applies


async def test_chat_mode_and_template_mode_give_the_model_the_same_text(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    params = SamplingParams(max_tokens=12)
    await enqueue_prompts(store, JobSpec(job="chat", params=params, request=Chat()), prompts(150))
    templated = JobSpec(job="tmpl", params=params, request=Completion(template=CHAT_TEMPLATE))
    await enqueue_prompts(store, templated, prompts(150))
    async with sim_fleet(2) as fleet:
        # No speculative copies at the tail: this counts the requests a batch takes.
        await run_engine(make_settings(batch_size=16, speculate=False), store, fleet.urls)
        chat_requests = sum(e.requests_total for e in fleet.endpoints)
    expected = [
        completion_for(CHAT_TEMPLATE.replace("{prompt}", p), 12)[0] for p, _ in prompts(150)
    ]
    chat = await collect_lines(store, "chat")
    tmpl = await collect_lines(store, "tmpl")
    assert [x["text"] for x in tmpl] == expected  # list-batched completions, template applied
    assert [x["text"] for x in chat] == [t.lstrip() for t in expected]  # the server's template
    assert all(x["usage"] is not None for x in chat)  # one prompt per request: exact usage
    # 150 chat requests + 150 / 16 list requests (rounded up)
    assert chat_requests == 150 + 10


async def test_a_chat_prompt_over_the_context_fails_alone(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    items: list[tuple[str, str | None]] = [(p, None) for p, _ in prompts(20)]
    items[4] = ("z" * 20000, "long")
    await enqueue_prompts(
        store, JobSpec(job="c", params=SamplingParams(max_tokens=8), request=Chat()), items
    )
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines if x["error"]] == [4]
    assert "maximum context length" in lines[4]["error"] or "context" in lines[4]["error"]


def _conversation(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"You are assistant number {i}."},
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": "Go on."},
        {"role": "user", "content": f"follow-up {i}"},
    ]


async def test_openai_chat_batch_lines_with_a_system_prompt_reach_the_model_whole(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
) -> None:
    lines = [
        msgspec.json.encode(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "swarm-sim", "messages": _conversation(i)},  # the served one
            }
        )
        for i in range(40)
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(b"\n".join(lines) + b"\n")
    spec = JobSpec(job="convo", params=SamplingParams(max_tokens=10), request=Chat())
    with batch.open("rb") as fh:
        report = await enqueue(make_settings(), spec, str(batch), fh)
    assert report.total == 40
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(), store, fleet.urls)
    out = await collect_lines(store, "convo")

    def seen_by_model(i: int) -> str:  # swarm-sim's stand-in chat template
        turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in _conversation(i))
        return turns + "<|assistant|>\n"

    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(40)]
    assert [x["text"] for x in out] == [
        completion_for(seen_by_model(i), 10)[0].lstrip() for i in range(40)
    ]


async def test_a_conversation_in_a_completion_job_is_refused_with_its_line(
    make_settings: Callable[..., Settings], store: JobStore, tmp_path: Path
) -> None:
    batch = tmp_path / "mixed.jsonl"
    batch.write_bytes(
        b'"plain prompt"\n' + msgspec.json.encode({"body": {"messages": _conversation(0)}})
    )
    with batch.open("rb") as fh, pytest.raises(InputError) as err:
        await enqueue(make_settings(), JobSpec(job="plain"), str(batch), fh)
    assert str(err.value) == (
        f"{batch}:2: a conversation of 4 messages needs --chat: /v1/completions takes one text "
        "per prompt (or write the conversation into a --template)"
    )
    convo = tuple(Message(m["role"], m["content"]) for m in _conversation(0))
    with pytest.raises(ConfigError, match="prompt 0 is a conversation: only a --chat job"):
        await enqueue_prompts(store, JobSpec(job="api"), [(convo, None)])


@pytest.fixture
async def capture() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible server that records request bodies and answers JSON texts: a valid
    record for a prompt with 'good', a wrong one for 'bad', prose otherwise."""
    seen: list[dict[str, Any]] = []

    def answer(prompt: str) -> str:
        if "good" in prompt:
            return '{"name": "x", "age": 3}'
        if "bad" in prompt:
            return '{"name": "x", "age": "three"}'
        return "Sure! Here it is."

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        ps = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = [
            {"index": i, "text": answer(p), "finish_reason": "stop"} for i, p in enumerate(ps)
        ]
        return web.json_response({"model": "m", "choices": choices})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response(
            {
                "model": "m",
                "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    async with serve(app) as url:
        yield url, seen


async def test_sampling_and_structured_output_fields_reach_the_server(
    capture: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = capture
    params = SamplingParams(
        max_tokens=7,
        temperature=0.3,
        top_p=0.9,
        stop=["\n\n"],
        seed=42,
        response_format={"type": "json_object"},
        structured_outputs={"choice": ["yes", "no"]},
    )
    client = EndpointClient(url)
    try:
        await client.complete("m", ["a", "b"], params)
        await client.chat("m", [{"role": "user", "content": "c"}], params)
    finally:
        await client.close()
    wanted = {
        "max_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "seed": 42,
        "response_format": {"type": "json_object"},
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    assert {k: seen[0][k] for k in wanted} == wanted
    assert seen[0]["prompt"] == ["a", "b"]
    assert {k: seen[1][k] for k in wanted} == wanted
    assert seen[1]["messages"] == [{"role": "user", "content": "c"}]
    client = EndpointClient(url)
    try:  # unset fields are not sent: the server's defaults apply
        await client.complete("m", ["a"], SamplingParams(max_tokens=5))
    finally:
        await client.close()
    assert set(seen[2]) == {"model", "prompt", "max_tokens"}


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


async def test_answers_are_validated_against_the_schema_and_failures_keep_their_text(
    make_settings: Callable[..., Settings],
    store: JobStore,
    capture: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = capture
    items = [("a good one", None), ("a bad one", None), ("prose please", None), ("good", "g")]
    await enqueue_prompts(store, JobSpec(job="s", schema=SCHEMA), items)
    await run_engine(make_settings(), store, [url])
    lines = await collect_lines(store, "s")
    assert [x["error"] is None for x in lines] == [True, False, False, True]
    assert lines[1]["error"] == (
        "does not match the schema: Expected `int`, got `str` - at `$.age`"
    )
    assert lines[1]["text"] == '{"name": "x", "age": "three"}'  # kept, to see what went wrong
    assert lines[2]["error"].startswith("not JSON")
    failed = await store.failed_indices("s", {"schema"})
    assert failed == [(1, "schema"), (2, "schema")]  # swarm-retry --kind schema takes them


async def test_a_name_queued_again_with_another_schema_is_held_to_the_new_one(
    make_settings: Callable[..., Settings],
    store: JobStore,
    capture: tuple[str, list[dict[str, Any]]],
) -> None:
    """One worker serves both lives of the name: the second's answers are checked against
    the second's schema, not against a validator kept for the name (seen: kept by job)."""
    url, _ = capture
    items = [("a good one", None), ("a bad one", None)]
    engine = Engine(make_settings(), store, [EndpointClient(url)])
    running = asyncio.create_task(engine.run())
    try:
        await enqueue_prompts(store, JobSpec(job="s", schema=SCHEMA), items)
        await _finished(store, "s")
        assert [x["error"] is None for x in await collect_lines(store, "s")] == [True, False]
        await store.delete_job("s")
        text = {"type": "string"}
        ages_as_text = {**SCHEMA, "properties": {"name": text, "age": text}}
        await enqueue_prompts(store, JobSpec(job="s", schema=ages_as_text), items)
        await _finished(store, "s")
    finally:
        engine.request_stop()
        await running
        await engine.close()
    assert [x["error"] for x in await collect_lines(store, "s")] == [
        "does not match the schema: Expected `str`, got `int` - at `$.age`",
        None,
    ]


async def _finished(store: JobStore, job: str) -> None:
    """Wait for ``job`` to finish: the engine's tasks run in this loop, and Redis says."""
    async with asyncio.timeout(60):
        while not (await store.status(job, rate=False)).finished:  # noqa: ASYNC110 - Redis
            await asyncio.sleep(0.01)


def test_schema_conversion_covers_the_usual_subset_and_refuses_the_rest() -> None:
    v = AnswerValidator(
        {
            "type": "object",
            "properties": {
                "label": {"enum": ["yes", "no"]},
                "score": {"type": ["number", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["label"],
            "additionalProperties": False,
        }
    )
    assert v.error('{"label": "yes", "score": null, "tags": ["a"]}') is None
    assert v.error('{"label": "no"}') is None
    assert "Expected `str`" in (v.error('{"label": "yes", "tags": [1]}') or "")
    assert "Object contains unknown field `extra`" in (v.error('{"label": "no", "extra": 1}') or "")
    assert v.error('{"label": "maybe"}') is not None
    with pytest.raises(ConfigError, match=r"keyword\(s\) pattern not supported"):
        AnswerValidator({"type": "string", "pattern": "^a"})
    with pytest.raises(ConfigError, match=r"required \['b'\] not in properties"):
        AnswerValidator({"type": "object", "properties": {}, "required": ["b"]})
    assert msgspec.json.decode(b'"x"', type=str) == "x"


@pytest.mark.parametrize(
    ("bos_in_template", "template"),
    [
        (False, "<|user|>\n{prompt}\n<|assistant|>\n"),  # a template with no BOS
        (True, "<s><|user|>\n{prompt}\n<|assistant|>\n"),  # {{ bos_token }} written out
    ],
)
async def test_template_mode_equals_chat_mode_with_and_without_a_bos_in_the_template(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    bos_in_template: bool,
    template: str,
) -> None:
    """vLLM adds its BOS to /v1/completions prompts unless told not to, and chat rendering
    does not: a template written out (with its BOS, if the model's has one) must be sent with
    add_special_tokens false to give the model exactly what chat mode gives it."""
    params = SamplingParams(max_tokens=12)
    await enqueue_prompts(store, JobSpec(job="chat", params=params, request=Chat()), prompts(50))
    await enqueue_prompts(
        store,
        JobSpec(job="tmpl", params=params, request=Completion(template=template)),
        prompts(50),
    )
    async with sim_fleet(1, bos_token="<s>", chat_template_bos=bos_in_template) as fleet:
        await run_engine(make_settings(batch_size=16), store, fleet.urls)
        received = list(fleet.endpoints[0].received)
    chat = [x["text"] for x in await collect_lines(store, "chat")]
    tmpl = [x["text"] for x in await collect_lines(store, "tmpl")]
    assert [t.lstrip() for t in tmpl] == chat  # the same text, prompt by prompt
    # What the model saw in both modes: the template's own tokens, no BOS added to them.
    seen = [template.replace("{prompt}", p) for p, _ in prompts(50)]
    assert tmpl == [completion_for(s, 12)[0] for s in seen]
    assert completion_for("<s>" + seen[0], 12)[0] != tmpl[0]  # a BOS added would show
    lists = [r for r in received if "prompt" in r]
    chats = [r for r in received if "messages" in r]
    assert len(lists) == 4 and len(chats) == 50
    assert all(r["add_special_tokens"] is False for r in lists)
    assert all("add_special_tokens" not in r for r in chats)


def _batch_line(i: int, url: str = "/v1/completions", **body: Any) -> bytes:
    key = "messages" if url.endswith("chat/completions") else "prompt"
    prompt: Any = f"Batch question {i}?"
    if key == "messages":
        prompt = [{"role": "user", "content": prompt}]
    line = {"custom_id": f"r{i}", "method": "POST", "url": url, "body": {key: prompt, **body}}
    return msgspec.json.encode(line)


async def _enqueue_lines(settings: Settings, spec: JobSpec, lines: list[bytes]) -> int:
    """Queue ``lines`` as the file ``b.jsonl``."""
    stream = io.BytesIO(b"\n".join(lines) + b"\n")
    return (await enqueue(settings, spec, "b.jsonl", stream)).total


async def test_openai_batch_lines_are_sent_with_their_own_fields_and_still_list_batched(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
) -> None:
    def fields(i: int) -> dict[str, Any]:  # 5 tokens, 12 with a stop and a temperature, or none
        if i % 3 == 0:
            return {"max_tokens": 5}
        if i % 3 == 1:
            return {"max_tokens": 12, "temperature": 0.7, "stop": "\n\n"}
        return {}

    lines = [_batch_line(i, model="swarm-sim", **fields(i)) for i in range(90)]
    spec = JobSpec(job="mixed", params=SamplingParams(max_tokens=32))
    assert await _enqueue_lines(make_settings(), spec, lines) == 90
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=30, inflight=1), store, fleet.urls)
        received = list(fleet.endpoints[0].received)
    out = await collect_lines(store, "mixed")
    wanted = {0: 5, 1: 12, 2: 32}
    for i, x in enumerate(out):
        assert x["text"] == completion_for(f"Batch question {i}?", wanted[i % 3])[0]
        assert x["custom_id"] == f"r{i}"
    # One list request per distinct setting in each batch of 30: three of ten prompts each.
    assert len(received) == 9 and {len(r["prompt"]) for r in received} == {10}
    by_tokens = {r["max_tokens"]: r for r in received}
    assert set(by_tokens) == {5, 12, 32}
    assert (by_tokens[12]["temperature"], by_tokens[12]["stop"]) == (0.7, ["\n\n"])
    assert "temperature" not in by_tokens[5] and "stop" not in by_tokens[32]


@pytest.mark.parametrize(
    ("line", "chat", "template", "message"),
    [
        (_batch_line(0, n=0), False, None, r"body: samples \(n\) must be 1\.\.256, got 0"),
        (_batch_line(0, stream=True), False, None, "body.stream=True is not supported"),
        (_batch_line(0, logprobs=3), False, None, "body.logprobs is not supported"),
        (_batch_line(0, temperature=-1), False, None, "temperature must be a finite number"),
        (_batch_line(0, max_tokens="lots"), False, None, r"Expected `int`, got `str`"),
        (
            _batch_line(0, "/v1/chat/completions"),
            False,
            None,
            r"a /v1/chat/completions line needs --chat .* or --template FILE",
        ),
        (_batch_line(0), True, None, "a /v1/completions line in a --chat job"),
        (
            _batch_line(0, model="other"),
            False,
            None,
            "body.model 'other' is not the job's model 'm': one model per job",
        ),
    ],
)
async def test_batch_lines_the_job_cannot_honour_are_refused_with_their_line(
    make_settings: Callable[..., Settings],
    store: JobStore,
    line: bytes,
    chat: bool,
    template: str | None,
    message: str,
) -> None:
    kind = Chat(template=template) if chat else Completion(template=template)
    spec = JobSpec(job="bad", model="m", request=kind)
    lines = [_batch_line(1, "/v1/chat/completions" if chat else "/v1/completions"), line]
    with pytest.raises(InputError, match=f"b.jsonl:2: .*{message}"):
        await _enqueue_lines(make_settings(), spec, lines)


async def test_chat_lines_with_a_template_and_the_lines_model_for_the_job(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    lines = [_batch_line(i, "/v1/chat/completions", model="lora-7") for i in range(3)]
    spec = JobSpec(job="t", request=Completion(template="<|user|>\n{prompt}\n<|assistant|>\n"))
    assert await _enqueue_lines(make_settings(), spec, lines) == 3
    assert (await store.load_spec("t")).model == "lora-7"  # the lines' model is the job's


async def test_a_chat_answer_without_text_is_a_failure_of_its_own_kind_and_never_cached(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    """``message.content: null`` (tool calls, a reasoning-only answer) is no answer: a
    ``no_content`` failure with its finish reason, never an empty success, never cached."""

    async def chat(request: web.Request) -> web.Response:
        said = (await request.json())["messages"][-1]["content"]
        message: dict[str, Any] = {"role": "assistant", "content": f"answer to {said}"}
        finish = "stop"
        if "tool" in said:
            message = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
            finish = "tool_calls"
        elif "think" in said:
            message = {"role": "assistant", "content": None, "reasoning_content": "hmm"}
            finish = "length"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return web.json_response({"model": "m", "choices": [choice]})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    said = ["plain", "call a tool", "think hard", "plain again"]
    job = JobSpec(
        job="j",
        params=SamplingParams(max_tokens=8, temperature=0),
        model="m",
        request=Chat(),
        cache=True,
    )
    await enqueue_prompts(store, job, [(p, None) for p in said])
    async with serve(app) as url:
        await run_engine(make_settings(), store, [url])
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == ["answer to plain", None, None, "answer to plain again"]
    assert lines[1]["error"] == (
        "the answer has no text (message.content null, tool calls only; finish_reason 'tool_calls')"
    )
    assert lines[2]["error"] == (
        "the answer has no text (message.content null, reasoning only; finish_reason 'length')"
    )
    assert [x["finish_reason"] for x in lines] == ["stop", "tool_calls", "length", "stop"]
    status = await store.status("j")
    assert (status.done, status.failed_by_kind) == (2, {"no_content": 2})
    assert await store.redis.hlen(store.keys.cache_answers) == 2  # the two answers only
