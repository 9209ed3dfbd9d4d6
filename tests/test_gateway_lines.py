"""Each kind of OpenAI batch line as the Batch API answers it, through swarm-gateway with the
official openai SDK, real gateway and worker processes and swarm-sim endpoints: a line asked
with ``n`` answered with ``n`` choices as the engine gives them, and a line the engine refuses
failed alone with the engine's own message (as vLLM's run-batch fails it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm_queue.sim.text import count_tokens, sample_for
from tests import gatewayproc as gw
from tests.harness import MAX_TOKENS, OVER_CONTEXT, FleetFactory


def _line(url: str, i: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}


def _samples(seen: str, n: int) -> list[tuple[str, int, str]]:
    """swarm-sim's ``n`` sampled answers to what the model sees (text, tokens, finish)."""
    return [sample_for(seen, MAX_TOKENS, j) for j in range(n)]


def test_lines_asked_with_n_get_n_choices_and_a_greedy_one_fails_alone_with_vllms_message(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2)
    fleet.worker("w", [0, 1], burst=False)
    asked = {i: 3 for i in range(10)} | {10: 2, 11: 1}  # line -> its n
    greedy = 10  # n 2 at temperature 0: vLLM refuses it

    def completion(i: int) -> dict[str, Any]:
        body = {"prompt": f"Name finding {i}.", "max_tokens": MAX_TOKENS, "n": asked[i]}
        return _line("/v1/completions", i, body | {"temperature": 0.0 if i == greedy else 0.8})

    def chat(i: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": f"Weigh finding {i}."}]
        body = {"messages": messages, "max_tokens": MAX_TOKENS, "n": 3, "temperature": 0.7}
        return _line("/v1/chat/completions", i, body)

    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        batches = {
            url: client.batches.create(
                input_file_id=gw.upload(client, tmp_path, name, lines),
                endpoint=url,
                completion_window="24h",
            )
            for url, name, lines in (
                ("/v1/completions", "c.jsonl", [completion(i) for i in asked]),
                ("/v1/chat/completions", "chat.jsonl", [chat(i) for i in range(6)]),
            )
        }
        done = gw.wait_over(client, batches["/v1/completions"].id)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (11, 1)
        out = {x["custom_id"]: x for x in gw.file_lines(client, done.output_file_id)}
        assert sorted(out) == sorted(f"line-{i}" for i in asked if i != greedy)
        input_tokens = output_tokens = 0
        for i, n in asked.items():
            if i == greedy:
                continue
            prompt = f"Name finding {i}."
            samples = _samples(prompt, n)
            body = out[f"line-{i}"]["response"]["body"]
            assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
                (j, text, finish) for j, (text, _, finish) in enumerate(samples)
            ]
            # The prompt once, every sample's answer: as vLLM counts a request with n.
            tokens = sum(t for _, t, _ in samples)
            assert body["usage"] == {
                "prompt_tokens": count_tokens(prompt), "completion_tokens": tokens,
                "total_tokens": count_tokens(prompt) + tokens,
                "prompt_tokens_details": None, "completion_tokens_details": None,
            }  # fmt: skip
            input_tokens += count_tokens(prompt)
            output_tokens += tokens
        assert done.usage is not None
        assert (done.usage.input_tokens, done.usage.output_tokens) == (input_tokens, output_tokens)
        [error] = gw.file_lines(client, done.error_file_id)
        assert error["custom_id"] == f"line-{greedy}"
        assert error["response"]["status_code"] == 400
        assert error["error"]["message"] == "n must be 1 when using greedy sampling, got 2."

        chat_done = gw.wait_over(client, batches["/v1/chat/completions"].id)
        assert chat_done.status == "completed" and chat_done.error_file_id is None
        for x in gw.file_lines(client, chat_done.output_file_id):
            i = int(x["custom_id"].split("-")[1])
            # swarm-sim's stand-in chat template around the one user message
            samples = _samples(f"<|user|>\nWeigh finding {i}.\n<|assistant|>\n", 3)
            choices = x["response"]["body"]["choices"]
            assert [(c["message"]["content"], c["finish_reason"]) for c in choices] == [
                (text.lstrip(), finish) for text, _, finish in samples
            ]
            assert x["response"]["body"]["usage"]["completion_tokens"] == sum(
                t for _, t, _ in samples
            )


def test_responses_lines_are_answered_as_the_responses_api_writes_them(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2)
    fleet.worker("w", [0, 1], burst=False)
    long = 7  # over the context: refused alone, in the engine's words

    def line(i: int) -> dict[str, Any]:
        said: Any = f"Weigh finding {i}." if i != long else "p" * 3000
        if i % 2:  # a conversation with instructions, content as input_text parts
            said = [{"role": "user", "content": [{"type": "input_text", "text": said}]}]
        body = {"input": said, "max_output_tokens": MAX_TOKENS, "temperature": 0}
        return _line("/v1/responses", i, body | ({"instructions": "Be brief."} if i % 2 else {}))

    def seen(i: int) -> str:
        """What the model reads (swarm-sim's stand-in chat template)."""
        system = "<|system|>\nBe brief.\n" if i % 2 else ""
        return f"{system}<|user|>\nWeigh finding {i}.\n<|assistant|>\n"

    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        lines = [line(i) for i in range(12)]
        batch = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "r.jsonl", lines),
            endpoint="/v1/responses",
            completion_window="24h",
        )
        done = gw.wait_over(client, batch.id)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (11, 1)
        out = gw.file_lines(client, done.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(
            f"line-{i}" for i in range(12) if i != long
        )
        for x in out:
            i = int(x["custom_id"].split("-")[1])
            text, tokens, finish = sample_for(seen(i), MAX_TOKENS, 0)
            body = x["response"]["body"]
            assert body["object"] == "response"
            assert body["status"] == ("incomplete" if finish == "length" else "completed")
            [message] = body["output"]
            assert (message["type"], message["role"]) == ("message", "assistant")
            assert [(c["type"], c["text"]) for c in message["content"]] == [
                ("output_text", text.lstrip())
            ]
            usage = body["usage"]
            assert (usage["input_tokens"], usage["output_tokens"]) == (
                count_tokens(seen(i)), tokens,
            )  # fmt: skip
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        [error] = gw.file_lines(client, done.error_file_id)
        assert error["custom_id"] == f"line-{long}"
        assert error["response"]["status_code"] == 400
        assert error["error"]["message"].startswith(OVER_CONTEXT)
        assert done.usage is not None
        assert done.usage.output_tokens == sum(
            x["response"]["body"]["usage"]["output_tokens"] for x in out
        )
