"""Reading prompt files: every accepted line form, and clear errors for the rest."""

from __future__ import annotations

import pytest

from common.errors import InputError
from producer.inputs import detect_format, iter_prompts


def _read(text: str, source: str = "in.jsonl", **kw: object) -> list[tuple[int, str, str | None]]:
    lines = text.encode().splitlines(keepends=True)
    return [tuple(p) for p in iter_prompts(lines, source, **kw)]  # type: ignore[arg-type,misc]


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
        (
            '{"body": {"messages": [{"role": "system", "content": "s"},'
            ' {"role": "user", "content": "u"}]}}',
            "only a single user message",
        ),
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
