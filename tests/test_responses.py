"""OpenAI Responses API lines (``/v1/responses``) queued by swarm-enqueue into a responses job
(``--responses``): each sent to the endpoints' own /v1/responses with its own fields, read as
a chat answer, and written back as a ``response``; what such a job or line cannot honour
refused with its line, never ignored."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from swarm_queue.common.errors import ConfigError, InputError
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.models import Chat, JobSpec, Result, SamplingParams, Usage
from swarm_queue.common.request import Route
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue
from swarm_queue.producer.openai_batch import openai_line
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for, count_tokens
from tests.helpers import collect_lines, run_engine

RESPONSES = Chat(api="responses")


def _line(i: int, url: str = "/v1/responses", **body: Any) -> bytes:
    said = {"input": f"Question {i}?"} if url == "/v1/responses" else {"prompt": f"Q{i}"}
    line = {"custom_id": f"r{i}", "method": "POST", "url": url, "body": said | body}
    return msgspec.json.encode(line)


async def _enqueue(settings: Settings, spec: JobSpec, lines: list[bytes]) -> int:
    stream = io.BytesIO(b"\n".join(lines) + b"\n")
    return (await enqueue(settings, spec, "r.jsonl", stream)).total


async def test_responses_lines_go_to_the_responses_route_with_their_own_fields(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    spec = JobSpec(job="resp", params=SamplingParams(max_tokens=32), request=RESPONSES)
    lines = [_line(i, max_output_tokens=5 if i % 2 else None) for i in range(10)]
    lines.append(_line(10, instructions="Be brief.", temperature=0))
    assert await _enqueue(make_settings(), spec, lines) == 11
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=4), store, fleet.urls)
        received = list(fleet.endpoints[0].received)
    assert len(received) == 11 and all("input" in r for r in received)
    sent = {r["input"][-1]["content"]: r for r in received}
    assert sent["Question 1?"]["max_output_tokens"] == 5
    assert sent["Question 2?"]["max_output_tokens"] == 32
    # (a line's instructions travel as instructions: the answer echoes them as given)
    assert sent["Question 10?"]["instructions"] == "Be brief."
    assert sent["Question 10?"]["input"] == [{"role": "user", "content": "Question 10?"}]
    assert "instructions" not in sent["Question 9?"]
    assert sent["Question 10?"]["temperature"] == 0
    out = await collect_lines(store, "resp")
    for i, x in enumerate(out):
        system = "<|system|>\nBe brief.\n" if i == 10 else ""
        seen = f"{system}<|user|>\nQuestion {i}?\n<|assistant|>\n"
        text, tokens, finish = completion_for(seen, 5 if i % 2 and i != 10 else 32)
        assert (x["text"], x["finish_reason"]) == (text.lstrip(), finish)
        # (the responses route says its cached and reasoning tokens always: none here, each
        # question new to the engine)
        assert x["usage"] == {
            "prompt_tokens": count_tokens(seen),
            "completion_tokens": tokens,
            "cached_tokens": 0,
            "reasoning_tokens": 0,
        }


def test_a_responses_answer_cut_at_its_limit_is_written_incomplete() -> None:
    r = Result(3, "a b", "length", Usage(7, 2), model="m")
    body = msgspec.json.decode(openai_line("j", r, route=Route.RESPONSES, created=1))
    body = body["response"]["body"]
    assert (body["status"], body["incomplete_details"]) == (
        "incomplete", {"reason": "max_output_tokens"},
    )  # fmt: skip
    assert body["output"][0]["content"][0]["text"] == "a b"
    assert body["usage"]["total_tokens"] == 9


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (_line(0, stop="\n"), r"body.stop is not supported \(supported: max_output_tokens"),
        (_line(0, tools=[]), "body.tools is not supported"),
        (_line(0, input=[{"type": "function_call"}]), r"body.input\[0\]: only message items"),
        (
            _line(0, input=[{"role": "user", "content": [{"type": "input_image"}]}]),
            r"only input_text parts are supported",
        ),
        (_line(0, "/v1/chat/completions"), "a chat line in a responses job"),
    ],
)
async def test_what_a_responses_job_cannot_honour_is_refused_with_its_line(
    make_settings: Callable[..., Settings], store: JobStore, line: bytes, message: str
) -> None:
    spec = JobSpec(job="bad", model="m", request=RESPONSES)
    with pytest.raises(InputError, match=f"r.jsonl:2: .*{message}"):
        await _enqueue(make_settings(), spec, [_line(1), line])


async def test_a_responses_line_in_a_chat_job_is_refused(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    with pytest.raises(InputError, match=r"r.jsonl:1: a /v1/responses line needs a responses"):
        await _enqueue(make_settings(), JobSpec(job="c", request=Chat()), [_line(0)])


def test_a_responses_job_refuses_settings_the_route_does_not_take() -> None:
    spec, _ = build_spec("r", JobOptions(responses=True, temperature=0.5), source="t")
    assert spec.request == RESPONSES
    with pytest.raises(ConfigError, match=r"a responses job .* has no stop, seed, samples"):
        build_spec("r", JobOptions(responses=True, stop=["x"], seed=1, samples=2,
                                   temperature=1), source="t")  # fmt: skip
