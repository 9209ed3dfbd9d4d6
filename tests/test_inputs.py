"""Reading prompt files: every accepted line form, and clear errors for the rest."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import InputError
from swarm_queue.producer.inputs import detect_format, iter_prompts


def _read(text: str, source: str = "in.jsonl", **kw: object) -> list[tuple[int, str, str | None]]:
    lines = text.encode().splitlines(keepends=True)
    return [(p.line, p.prompt, p.custom_id) for p in iter_prompts(lines, source, **kw)]


def test_plain_text_one_prompt_per_line_blank_lines_skipped() -> None:
    assert _read("first\r\n\nsecond {not json}\n", "p.txt") == [
        (1, "first", None),
        (3, "second {not json}", None),
    ]


def test_jsonl_strings_objects_and_openai_batch_lines() -> None:
    text = "\n".join(
        [
            '"a plain string"',
            '{"prompt": "with key", "custom_id": "k1"}',
            '{"custom_id": "req-1", "method": "POST", "url": "/v1/completions",'
            ' "body": {"model": "m", "prompt": "batch prompt"}}',
            '{"custom_id": "req-2", "method": "POST", "url": "/v1/chat/completions",'
            ' "body": {"model": "m", "messages": [{"role": "user", "content": "chat prompt"}]}}',
        ]
    )
    assert _read(text) == [
        (1, "a plain string", None),
        (2, "with key", "k1"),
        (3, "batch prompt", "req-1"),
        (4, "chat prompt", "req-2"),
    ]


def test_a_conversation_is_kept_whole_and_a_lone_user_message_is_a_plain_prompt() -> None:
    convo = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Bonjour."},
        {"role": "user", "content": "And goodbye?"},
    ]
    lines = [
        msgspec.json.encode({"custom_id": "c1", "body": {"messages": convo}}),
        msgspec.json.encode({"body": {"messages": convo[1:2]}}),
    ]
    first, second = iter_prompts(lines, "chat.jsonl")
    assert first.prompt == "And goodbye?"  # the last user message, for display
    assert first.custom_id == "c1"
    assert [(m.role, m.content) for m in first.messages or ()] == [
        (m["role"], m["content"]) for m in convo
    ]
    assert (second.prompt, second.messages) == ("Hello?", None)


def test_format_detection() -> None:
    assert detect_format("x.txt", b'"looks json"') == "txt"
    assert detect_format("x.jsonl", b"plain") == "jsonl"
    assert detect_format("<stdin>", b'{"prompt": "p"}') == "jsonl"
    assert detect_format("<stdin>", b"{not json") == "txt"
    assert _read('"quoted"\n', "<stdin>") == [(1, "quoted", None)]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{broken", "invalid JSON"),
        ("42", "expected a JSON string or object, got int"),
        ('{"text": "x"}', "no 'prompt'"),
        ('{"prompt": ["a", "b"]}', "prompt must be a string, got list"),
        ('{"body": {"prompt": ["a"]}}', "body.prompt must be one string"),
        ('{"body": {}}', "neither 'prompt' nor 'messages'"),
        ('{"body": {"messages": []}}', "body.messages must be a non-empty list"),
        (
            '{"body": {"messages": [{"role": "user", "content": "u"}, {"role": "bot"}]}}',
            "body.messages[1].role 'bot': expected one of system, developer, user, assistant",
        ),
        (
            '{"body": {"messages": [{"role": "user", "content": [{"type": "text"}]}]}}',
            "body.messages[0].content must be a string (content parts are not supported)",
        ),
        ('{"body": {"messages": [{"role": "system", "content": "s"}]}}', "no user message"),
        ('{"prompt": "x", "custom_id": 5}', "custom_id must be a string"),
        ('""', "empty prompt"),
        ('{"prompt": "   "}', "empty prompt"),
    ],
)
def test_malformed_lines_name_file_and_line(line: str, reason: str) -> None:
    with pytest.raises(InputError) as err:
        _read(f'"ok"\n\n{line}\n', "data/in.jsonl")
    assert str(err.value).startswith("data/in.jsonl:3: ")
    assert reason in str(err.value)
    assert err.value.line == 3


def test_prompt_size_limit_and_bad_utf8() -> None:
    with pytest.raises(InputError, match=r"p.txt:2: line is 11 bytes, over the limit of 10"):
        _read("short\n" + "x" * 11 + "\n", "p.txt", max_prompt_bytes=10)
    with pytest.raises(InputError, match=r"p.txt:1: not valid UTF-8"):
        list(iter_prompts([b"\xff\xfe\n"], "p.txt"))


@pytest.mark.parametrize("flag", ["--max-prompt-bytes", "--window", "--max-tokens"])
def test_a_count_below_one_is_a_usage_error_before_anything_is_queued(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarm_queue.producer.enqueue import main as enqueue_main

    # A Redis nobody listens on: the refusal comes before any connection.
    monkeypatch.setenv("SWARM_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    src = tmp_path / "p.txt"
    src.write_text("a prompt\n")
    with pytest.raises(SystemExit) as usage:
        enqueue_main([str(src), "--job", "j", flag, "-1"])
    assert usage.value.code == 2
    assert capsys.readouterr().err == f"swarm-enqueue: error: {flag} must be >= 1, got -1\n"
