"""The reduce stage's aggregators, each with failures present: values, failure lists, errors."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import msgspec
import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.final import FailedPrompt
from swarm_queue.common.models import ReduceSpec, Result
from swarm_queue.common.reduce import (
    aggregate,
    function_allowed,
    merge_json,
    normalise,
    parse_number,
    render,
)


def results(*texts: str | None) -> list[Result]:
    """A result per text, in index order; None is a failed prompt."""
    return [
        Result(index=i, text=t)
        if t is not None
        else Result(index=i, error=f"boom {i}", error_kind="rejected")
        for i, t in enumerate(texts)
    ]


def test_concat_joins_answers_in_index_order_and_lists_failures() -> None:
    out = aggregate("j", ReduceSpec(kind="concat", separator=" | "), results("a", None, "c"))
    assert out.value == "a | c"
    assert out.used == 2
    assert out.failed == [FailedPrompt(1, "boom 1", "rejected")]


def test_vote_normalises_answers_and_reports_the_winning_share() -> None:
    out = aggregate("j", ReduceSpec(kind="vote"), results(" Yes.", "no", "YES", None, "yes!", "No"))
    assert out.value == {"winner": "yes", "votes": 3, "share": 0.6, "counts": {"yes": 3, "no": 2}}
    assert [f.index for f in out.failed] == [3]


def test_vote_tie_goes_to_the_answer_seen_first() -> None:
    out = aggregate("j", ReduceSpec(kind="vote"), results("B", "a", "b", "A"))
    assert out.value["winner"] == "b"


def test_vote_with_every_prompt_failed_has_no_winner() -> None:
    out = aggregate("j", ReduceSpec(kind="vote"), results(None, None))
    assert out.value == {"winner": None, "votes": 0, "share": 0.0, "counts": {}}
    assert [f.index for f in out.failed] == [0, 1]


def test_normalise() -> None:
    assert normalise("  The   ANSWER:  ") == "the answer"
    assert normalise('"Paris"') == "paris"
    assert normalise("\uff30\uff41\uff52\uff49\uff53") == "paris"  # full-width letters


def test_json_merges_objects_flattens_lists_and_reports_unparsable_by_index() -> None:
    spec = ReduceSpec(kind="json")
    out = aggregate(
        "j",
        spec,
        results(
            '{"a": [1], "n": {"x": 1}}', "not json", None, '```json\n{"a": [2], "n": {"y": 2}}\n```'
        ),
    )
    assert out.value == {"a": [1, 2], "n": {"x": 1, "y": 2}}
    assert [(f.index, f.kind) for f in out.failed] == [(1, "unparsable"), (2, "rejected")]
    assert out.failed[0].error.startswith("not JSON")
    assert out.used == 2
    lists = aggregate("j", spec, results("[1, 2]", "[3]", "4"))
    assert lists.value == [1, 2, 3, 4]


def test_merge_json_later_scalar_wins() -> None:
    assert merge_json([{"k": 1}, {"k": 2}]) == {"k": 2}
    assert merge_json([]) == []


def test_stats_over_parsed_numbers_with_unparsable_and_failed_listed() -> None:
    out = aggregate(
        "j",
        ReduceSpec(kind="stats"),
        results("1", "The answer is 3.", None, "2 or 5", "-2e0", "nan"),
    )
    assert out.value == {
        "count": 3,
        "mean": pytest.approx(2 / 3),
        "std": pytest.approx(((1 / 3) ** 2 + (7 / 3) ** 2 + (8 / 3) ** 2) ** 0.5 / 3**0.5),
        "median": 1.0,
        "min": -2.0,
        "max": 3.0,
    }
    assert [(f.index, f.kind) for f in out.failed] == [
        (2, "rejected"),
        (3, "unparsable"),
        (5, "unparsable"),
    ]
    assert out.failed[1].error == "expected one number, found 2"


def test_parse_number() -> None:
    assert parse_number(" 42\n") == 42.0
    assert parse_number("about .5 percent") == 0.5
    with pytest.raises(ValueError, match="found 0"):
        parse_number("none")


@pytest.fixture
def user_module() -> Iterator[str]:
    mod = types.ModuleType("swarm_test_reducers")

    def longest(rs: list[Result]) -> dict[str, object]:
        best = max(rs, key=lambda r: len(r.text or ""))
        return {"index": best.index, "text": best.text, "seen": [r.index for r in rs]}

    def broken(rs: list[Result]) -> object:
        raise RuntimeError("no can do")

    def not_json(rs: list[Result]) -> object:
        return object()

    mod.longest = longest  # type: ignore[attr-defined]
    mod.broken = broken  # type: ignore[attr-defined]
    mod.not_json = not_json  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    yield mod.__name__
    del sys.modules[mod.__name__]


def test_user_function_gets_the_successes_in_order_and_failures_stay_listed(
    user_module: str,
) -> None:
    spec = ReduceSpec(kind="function", function=f"{user_module}:longest")
    out = aggregate("j", spec, results("ab", None, "abcd", "a"), [f"{user_module}:longest"])
    assert out.value == {"index": 2, "text": "abcd", "seen": [0, 2, 3]}
    assert [f.index for f in out.failed] == [1]
    assert out.error is None


def test_user_function_errors_become_the_outputs_error(user_module: str) -> None:
    allowed = [f"{user_module}:*", "no_such_mod:f"]
    out = aggregate(
        "j", ReduceSpec(kind="function", function=f"{user_module}:broken"), results("a"), allowed
    )
    assert (out.value, out.error) == (None, f"{user_module}:broken failed: RuntimeError: no can do")
    out = aggregate(
        "j", ReduceSpec(kind="function", function=f"{user_module}:not_json"), results("a"), allowed
    )
    assert out.error is not None and "not_json returned what JSON cannot hold" in out.error
    out = aggregate(
        "j", ReduceSpec(kind="function", function="no_such_mod:f"), results("a"), allowed
    )
    assert out.error is not None and "cannot import no_such_mod" in out.error


def test_a_function_the_worker_does_not_allow_is_never_imported(user_module: str) -> None:
    imported = []

    class Finder:  # sees every import attempted while it is installed
        def find_spec(self, name: str, *args: object) -> None:
            imported.append(name)

    sys.meta_path.insert(0, Finder())
    try:
        out = aggregate(
            "j",
            ReduceSpec(kind="function", function="evil_module:run"),
            results("a"),
            [f"{user_module}:*", "other.mod:f"],
        )
    finally:
        sys.meta_path.pop(0)
    assert out.value is None and imported == []
    assert out.error == (
        "reduce function evil_module:run is not allowed on this worker: list it in the workers' "
        f"SWARM_REDUCE_FUNCTIONS (allowed now: other.mod:f, {user_module}:*)"
    )
    assert not function_allowed(f"{user_module}x:longest", [f"{user_module}:*"])
    assert function_allowed(f"{user_module}:longest", [f"{user_module}:longest"])


def test_reduce_spec_is_validated_with_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown reduce 'mean'"):
        ReduceSpec(kind="mean")
    with pytest.raises(ConfigError, match=r"package\.module:function"):
        ReduceSpec(kind="function", function="nocolon")
    with pytest.raises(ConfigError, match=r"containing \{responses\}"):
        ReduceSpec(kind="tree", prompt="Summarise.")
    with pytest.raises(ConfigError, match="fanin must be >= 2"):
        ReduceSpec(kind="tree", prompt="{responses}", fanin=1)
    with pytest.raises(ConfigError, match="unknown reduce"):
        msgspec.json.decode(b'{"kind": "x"}', type=ReduceSpec)


def test_render_replaces_only_responses_and_level() -> None:
    template = 'Level {level}. Merge into {"summary": ...}:\n{responses}'
    out = render(template, [" first ", "{level} second"], 2)
    assert out == (
        'Level 2. Merge into {"summary": ...}:\nResponse 1:\nfirst\n\nResponse 2:\n{level} second'
    )


def test_every_reduce_kind_is_run_by_exactly_one_room() -> None:
    """The registry names each kind once: a function of the results (an aggregator, or the
    user's own) or work for the fleet (stages), never both, never neither."""
    from swarm_queue.common.reduce import AGGREGATORS
    from swarm_queue.common.reducekinds import FUNCTION, REDUCE_KINDS

    by_function = set(AGGREGATORS) | {FUNCTION}
    by_fleet = {name for name, kind in REDUCE_KINDS.items() if kind.fleet}
    assert by_function.isdisjoint(by_fleet)
    assert by_function | by_fleet == set(REDUCE_KINDS)
