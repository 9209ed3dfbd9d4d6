"""The one request builder: what is sent for a prompt, and the key of its answer."""

from __future__ import annotations

from swarm_queue.common.cache import answer_key
from swarm_queue.common.chat import Message
from swarm_queue.common.models import Chat, Completion, JobSpec, PromptItem, SamplingParams
from swarm_queue.common.request import Route, render, request_key


def _spec(*, chat: bool = False, template: str | None = None) -> JobSpec:
    return JobSpec(
        job="j",
        model="m",
        params=SamplingParams(max_tokens=8),
        request=Chat(template=template) if chat else Completion(template=template),
    )


def test_a_completion_fills_the_template_and_asks_for_no_special_tokens_then() -> None:
    item = PromptItem.of(3, "the question", "c3")
    plain = render(_spec(), item)
    assert (plain.route, plain.text, plain.messages) == (Route.COMPLETIONS, "the question", None)
    assert plain.add_special_tokens is None  # the server's default: it adds its BOS
    templated = render(_spec(template="<s>[INST] {prompt} [/INST]"), item)
    assert templated.text == "<s>[INST] the question [/INST]"
    assert templated.add_special_tokens is False  # the template carries its own


def test_a_chat_request_sends_the_conversation_or_the_prompt_as_one_user_message() -> None:
    chat = _spec(chat=True, template="Answer briefly: {prompt}")
    lone = render(chat, PromptItem.of(0, "why?", None))
    assert (lone.route, lone.text) == (Route.CHAT, None)
    assert lone.messages == [{"role": "user", "content": "Answer briefly: why?"}]
    talk = (Message("system", "be terse"), Message("user", "hi"))
    whole = render(chat, PromptItem.of(1, talk, None))
    assert whole.messages == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "hi"},
    ]


def test_a_prompt_with_settings_of_its_own_is_sent_and_keyed_with_them() -> None:
    own = SamplingParams(max_tokens=99, temperature=0.0)
    item = PromptItem.of(0, "q", None, own)
    assert render(_spec(), item).params == own
    assert request_key(render(_spec(), item)) != request_key(
        render(_spec(), PromptItem.of(0, "q", None))
    )


def test_equal_settings_give_one_key_whatever_their_order() -> None:
    a = SamplingParams(max_tokens=8, response_format={"type": "json", "schema": {"a": 1, "b": 2}})
    b = SamplingParams(max_tokens=8, response_format={"schema": {"b": 2, "a": 1}, "type": "json"})
    item = PromptItem.of(0, "q", None)
    key_a = request_key(render(JobSpec(job="j", model="m", params=a), item))
    key_b = request_key(render(JobSpec(job="j", model="m", params=b), item))
    assert key_a == key_b


def test_answers_kept_by_earlier_versions_keep_their_keys() -> None:
    """The keys the cache computed before its requests were built here (a cache of weeks of
    answers would otherwise be lost): digests taken from that code."""
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    completions = JobSpec(job="j", model="m", cache=True, params=greedy)
    chat = JobSpec(job="j", model="m", cache=True, request=Chat(), params=greedy)
    talk = (Message("system", "be brief"), Message("user", "hi"))
    assert answer_key(completions, PromptItem.of(0, "hello", None)) == (
        "fd96fbe72a316d16eef8da13c6e0921b74b91bac"
    )
    assert answer_key(chat, PromptItem.of(0, "hello", None)) == (
        "b304360e0313527744f80fd73264347581c1d305"
    )
    assert answer_key(chat, PromptItem.of(1, talk, "c1")) == (
        "53a871957ab5e61d915188c0497efb79771cb69c"
    )
