"""``swarm-collect --format openai``: OpenAI Batch API output lines, success and failure."""

from __future__ import annotations

import io

import msgspec

from swarm_queue.common.models import Result, Usage
from swarm_queue.common.request import Route
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.openai_batch import openai_line
from swarm_queue.producer.output import write_output
from tests.helpers import gen_of, spec


def test_a_success_is_a_200_response_with_a_completion_body() -> None:
    r = Result(
        index=3,
        text=" blue",
        finish_reason="stop",
        usage=Usage(5, 1),
        custom_id="q3",
        model="m1",
        fingerprint="vllm-0.32.0-9a53fb34",
    )
    line = openai_line("job1", r, created=1700000000)
    assert line.endswith(b"\n")
    assert msgspec.json.decode(line) == {
        "id": "batch_req_job1_3",
        "custom_id": "q3",
        "response": {
            "status_code": 200,
            "request_id": "job1-3",
            "body": {
                "id": "cmpl-job1-3",
                "object": "text_completion",
                "created": 1700000000,
                "model": "m1",
                "choices": [
                    {"index": 0, "text": " blue", "logprobs": None, "finish_reason": "stop"}
                ],
                # the engine's, as it said it
                "system_fingerprint": "vllm-0.32.0-9a53fb34",
                "usage": {
                    "prompt_tokens": 5,
                    "completion_tokens": 1,
                    "total_tokens": 6,
                    # null where the engine did not say them, as vLLM writes
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
            },
        },
        "error": None,
    }


def test_a_chat_job_gets_chat_completion_bodies() -> None:
    r = Result(index=0, text="Hi.", finish_reason="stop", model="m")
    body = msgspec.json.decode(openai_line("c", r, route=Route.CHAT, created=1))["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] is None


def test_a_failure_has_run_batchs_shape_a_status_no_body_and_the_error_object() -> None:
    r = Result(index=7, error="You passed 900 input tokens ...", error_kind="rejected", status=400)
    assert msgspec.json.decode(openai_line("j", r)) == {
        "id": "batch_req_j_7",
        "custom_id": "7",  # no custom_id in the input: the index stands in
        "response": {"status_code": 400, "request_id": "j-7", "body": None},
        "error": {
            "object": "error",
            "message": "You passed 900 input tokens ...",
            "type": "rejected",
            "param": None,
            "code": 400,
        },
    }
    cancelled = msgspec.json.decode(
        openai_line("j", Result(index=1, error="x", error_kind="cancelled"))
    )
    assert (cancelled["response"]["status_code"], cancelled["error"]["code"]) == (400, 400)
    lost = msgspec.json.decode(openai_line("j", Result(index=1, error="x", error_kind="no_choice")))
    assert (lost["response"]["status_code"], lost["error"]["type"]) == (500, "no_choice")


def test_a_schema_failure_keeps_its_text_in_the_response_body() -> None:
    r = Result(
        index=2,
        text='{"name": 3}',
        finish_reason="stop",
        error="$.name: not a string",
        error_kind="schema",
    )
    line = msgspec.json.decode(openai_line("j", r, created=1))
    assert line["response"]["status_code"] == 200
    assert line["response"]["body"]["choices"][0]["text"] == '{"name": 3}'
    assert (line["error"]["type"], line["error"]["message"]) == ("schema", "$.name: not a string")


async def test_collect_writes_openai_lines_in_input_order(store: JobStore) -> None:
    await enqueue_prompts(store, spec(job="oa"), [("a", "id-a"), ("b", None), ("c", "id-c")])
    entries = await store.redis.xrange(store.keys.stream("oa"))
    await store.commit(
        "oa",
        [
            (
                entries[0][0],
                Result(index=0, text="A", finish_reason="stop", custom_id="id-a"),
                None,
            ),
            (
                entries[1][0],
                Result(index=1, error="boom", error_kind="endpoint"),
                entries[1][1][b"d"],
            ),
            (
                entries[2][0],
                Result(index=2, text="C", finish_reason="length", custom_id="id-c"),
                None,
            ),
        ],
        gen=await gen_of(store, "oa"),
    )
    buf = io.BytesIO()
    report = await write_output(store, "oa", buf, "openai")
    assert report.written == 3
    lines = [msgspec.json.decode(x) for x in buf.getvalue().splitlines()]
    assert [x["custom_id"] for x in lines] == ["id-a", "1", "id-c"]
    assert [x["response"]["body"]["choices"][0]["text"] for x in (lines[0], lines[2])] == ["A", "C"]
    assert lines[1]["response"]["body"] is None and lines[1]["error"] == {
        "object": "error",
        "message": "boom",
        "type": "endpoint",
        "param": None,
        "code": 500,
    }
