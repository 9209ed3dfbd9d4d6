"""A batch's input checked as OpenAI's Batch API does, in bounded memory: each rule's error
with its line and code, duplicates found exactly however large the file (a Bloom filter's
false alarms are checked again and never reported)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.producer.gateway.validate import MAX_ERRORS, _duplicates, check_input

SPEC, _ = build_spec("batch_" + "0" * 24, JobOptions(), source="test")


def _line(i: int | str, **over: Any) -> str:
    obj = {
        "custom_id": f"id-{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": f"question {i}", "max_tokens": 8},
    }
    return json.dumps(obj | over)


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_duplicates_in_a_large_file_are_each_named_at_their_line(tmp_path: Path) -> None:
    lines = [_line(i) for i in range(50_000)]
    lines[20_000] = _line(7)  # line 20,001 repeats line 8
    lines[49_999] = _line(7)
    lines[30_000] = _line(29_999)
    checked = check_input(_write(tmp_path, lines), "/v1/completions", SPEC, 1 << 20)
    assert [(e.line, e.code) for e in checked.errors] == [
        (20_001, "duplicate_custom_id"),
        (30_001, "duplicate_custom_id"),
        (50_000, "duplicate_custom_id"),
    ]
    assert checked.errors[0].message == (
        "The custom_id 'id-7' is used by line 8 too; each must be unique."
    )
    assert checked.requests == 50_000


def test_a_false_alarm_of_the_filter_is_checked_again_and_not_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, [_line(i) for i in range(10)] + [_line(3)])
    # "id-5" taken for seen by the filter (a false alarm), "id-3" truly repeated.
    found = _duplicates(path, {"id-5", "id-3"})
    assert [(e.line, e.message) for e in found] == [
        (11, "The custom_id 'id-3' is used by line 4 too; each must be unique.")
    ]
    # With more to look for than it searches for by their text, every line is decoded.
    many = {f"id-{i}" for i in range(300, 700)} | {"id-3"}
    assert [e.line for e in _duplicates(path, many)] == [11]


def test_each_rule_names_its_line_and_the_errors_stop_at_the_limit(tmp_path: Path) -> None:
    lines = [
        _line(0, body={"prompt": "a", "model": "m1"}),
        "{oops",
        "[1, 2]",
        _line(3, custom_id=None),
        _line(4, method="GET"),
        _line(5, url="/v1/embeddings"),
        _line(6, body={"prompt": "a", "model": "m2"}),
        _line(7, body={"prompt": ["a", "b"]}),
        _line(8, body={"prompt": "a", "logit_bias": {}}),
        "x" * 300,
    ]
    checked = check_input(_write(tmp_path, lines), "/v1/completions", SPEC, 256)
    assert [(e.line, e.code, e.param) for e in checked.errors] == [
        (2, "invalid_json_line", None),
        (3, "invalid_json_line", None),
        (4, "missing_required_parameter", "custom_id"),
        (5, "invalid_request", "method"),
        (6, "url_mismatch", "url"),
        (7, "model_mismatch", "body.model"),
        (8, "invalid_request", "body"),
        (9, "invalid_request", "body"),
        (10, "line_too_large", None),
    ]
    assert checked.spec.model == "m1"
    assert "body.logit_bias is not supported" in checked.errors[7].message
    bad = check_input(_write(tmp_path, ["{"] * 100), "/v1/completions", SPEC, 256)
    assert len(bad.errors) == MAX_ERRORS and bad.errors[-1].line == MAX_ERRORS
