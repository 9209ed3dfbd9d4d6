"""A batch's input checked as OpenAI's Batch API does, in bounded memory: each rule's error
with its line and code, duplicates found exactly however large the file (two custom_ids that
only share a hash are checked again and never reported), and the same when the file is checked
in ranges by the gateway's helper processes at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.producer.gateway import offload
from swarm_queue.producer.gateway.offload import Helpers
from swarm_queue.producer.gateway.validate import (
    MAX_ERRORS,
    _duplicates,
    _hash,
    check_input,
    split_points,
)

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


def test_custom_ids_that_only_share_a_hash_are_checked_again_and_not_reported(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, [_line(i) for i in range(10)] + [_line(3)])
    # "id-5" as if its hash had come twice (another id sharing it), "id-3" truly repeated.
    doubled = {_hash(c) for c in ("id-5", "id-3")}
    found = _duplicates(path, doubled)
    assert [(e.line, e.message) for e in found] == [
        (11, "The custom_id 'id-3' is used by line 4 too; each must be unique.")
    ]


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


def test_ranges_start_at_lines_and_cover_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, [_line(i) for i in range(1000)])
    cuts = split_points(path, [0.25, 0.6])
    data = path.read_bytes()
    assert cuts[0] == 0 and cuts[-1] == len(data) and cuts == sorted(cuts) and len(cuts) == 4
    assert all(data[c - 1 : c] == b"\n" for c in cuts[1:-1])
    assert abs(cuts[1] - len(data) // 4) < 200


def _checked_by_helpers(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(offload, "SPLIT_BYTES", 0)  # every file in ranges
    helpers = Helpers()
    try:
        return asyncio.run(helpers.check(path, "/v1/completions", SPEC, 1 << 20))
    finally:
        helpers.close()


def test_a_file_checked_in_ranges_at_once_finds_what_one_pass_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [_line(i) for i in range(3000)]
    lines[0] = _line(0, body={"prompt": "a", "model": "m1"})
    lines[10] = "{oops"  # in the first range
    lines[2500] = _line(3)  # in the second: repeats line 4 of the first
    lines[2600] = _line("get", method="GET")
    lines.insert(1500, "")  # a blank line: the second range's lines still numbered in the file
    path = _write(tmp_path, lines)
    checked = _checked_by_helpers(path, monkeypatch)
    assert [(e.line, e.code) for e in checked.errors] == [
        (11, "invalid_json_line"),
        (2502, "duplicate_custom_id"),
        (2602, "invalid_request"),
    ]
    assert checked.requests == 3000 and checked.spec.model == "m1"
    assert checked == check_input(path, "/v1/completions", SPEC, 1 << 20)


def test_a_later_range_naming_another_model_is_checked_again_with_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [_line(i) for i in range(3000)]
    lines[5] = _line(5, body={"prompt": "a", "model": "m1"})
    lines[2700] = _line(2700, body={"prompt": "a", "model": "m2"})
    lines[2800] = _line(2800, body={"prompt": "a", "model": "m2"})
    path = _write(tmp_path, lines)
    checked = _checked_by_helpers(path, monkeypatch)
    assert [(e.line, e.code) for e in checked.errors] == [
        (2701, "model_mismatch"),
        (2801, "model_mismatch"),
    ]
    assert checked.spec.model == "m1"
    assert checked == check_input(path, "/v1/completions", SPEC, 1 << 20)
