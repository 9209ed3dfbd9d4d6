"""The batch room on its own: a fake endpoint, no Redis, no simulator. The retry loop,
bisection of a rejected list, mapping by choice.index, choices asked again, giving up."""

from __future__ import annotations

from typing import Any

import pytest

from swarm_queue.common.errors import EndpointRejected, EndpointRetryable
from swarm_queue.common.models import JobSpec, PromptItem, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.worker.batch import BatchRunner
from swarm_queue.worker.circuit import Circuit, GiveUp
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.replies import Choice, CompletionBody, CompletionUsage
from swarm_queue.worker.retry import RetryLoop
from swarm_queue.worker.usage import Tally


class FakeEndpoint(EndpointClient):
    """Answers each list with ``answer(prompts)``: a body, or an error to raise."""

    def __init__(self, answer: Any) -> None:
        super().__init__("http://fake:8000")
        self.answer = answer
        self.lists: list[list[str]] = []

    async def complete(
        self, model: str, prompts: list[str], params: SamplingParams, **_: Any
    ) -> CompletionBody:
        self.lists.append(list(prompts))
        out = self.answer(prompts)
        if isinstance(out, Exception):
            raise out
        return out


def _echo(prompts: list[str], skip: frozenset[int] = frozenset()) -> CompletionBody:
    choices = [Choice(index=i, text=f"re: {p}") for i, p in enumerate(prompts) if i not in skip]
    return CompletionBody(choices=choices[::-1], usage=CompletionUsage(len(prompts), 1))


def _runner(client: EndpointClient, **settings: Any) -> tuple[BatchRunner, Circuit]:
    s = Settings(**{"max_attempts": 3, "circuit_failures": 100, **settings})
    circuit = Circuit(client.label, s.circuit_failures)
    return BatchRunner(RetryLoop(client, s, circuit, lambda attempt: 0.0)), circuit


ITEMS = [PromptItem(10 + i, f"p{i}") for i in range(8)]
SPEC = JobSpec(job="j")


async def test_a_rejected_list_is_bisected_until_only_the_bad_prompt_fails() -> None:
    def answer(prompts: list[str]) -> object:
        if "p5" in prompts:
            return EndpointRejected("http://fake:8000", "too long", 400)
        return _echo(prompts)

    client = FakeEndpoint(answer)
    runner, _ = _runner(client)
    tally = Tally()
    results = await runner.run(SPEC, ITEMS, "m", tally)
    assert [r.index for r in results] == list(range(10, 18))
    assert [r.text for r in results] == [f"re: p{i}" if i != 5 else None for i in range(8)]
    assert (results[5].error, results[5].error_kind, results[5].status) == (
        "too long",
        "rejected",
        400,
    )
    assert client.lists[0] == [f"p{i}" for i in range(8)] and ["p5"] in client.lists
    assert tally.rest.prompt_tokens == sum(len(x) for x in client.lists if "p5" not in x)


async def test_missing_choices_are_asked_again_and_mapped_by_index() -> None:
    calls = 0

    def answer(prompts: list[str]) -> object:
        nonlocal calls
        calls += 1
        return _echo(prompts, frozenset({2, 3}) if calls == 1 else frozenset())

    client = FakeEndpoint(answer)
    runner, _ = _runner(client)
    results = await runner.run(SPEC, ITEMS, "m", Tally())
    assert [r.text for r in results] == [f"re: p{i}" for i in range(8)]  # reversed choices, mapped
    assert client.lists[1] == ["p2", "p3"]
    assert [r.attempts for r in results] == [1, 1, 2, 2, 1, 1, 1, 1]


async def test_transient_failures_are_retried_then_given_up_and_counted() -> None:
    client = FakeEndpoint(lambda prompts: EndpointRetryable("http://fake:8000", "busy", 503))
    runner, circuit = _runner(client, max_attempts=3, circuit_failures=3)
    with pytest.raises(GiveUp) as gave_up:
        await runner.run(SPEC, ITEMS, "m", Tally())
    assert gave_up.value.cause.status == 503
    assert (len(client.lists), runner.retries, circuit.errors) == (3, 2, 3)
    assert circuit.is_open and circuit.last_error == "http://fake:8000: HTTP 503: busy"


async def test_an_answer_under_another_prompts_index_is_never_returned() -> None:
    def answer(prompts: list[str]) -> object:
        body = _echo(prompts)
        return CompletionBody(
            choices=[Choice(index=c.index + 1, text=c.text) for c in body.choices]
        )

    runner, circuit = _runner(FakeEndpoint(answer), max_attempts=2)
    with pytest.raises(GiveUp, match="malformed answer: choice index 8 for 8 choices"):
        await runner.run(SPEC, ITEMS, "m", Tally())
    assert circuit.errors == 2
