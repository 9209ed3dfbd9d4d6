"""One spec for the CLI and the API: every job flag of swarm-enqueue is a keyword of
Swarm.submit, and the same settings give the same spec either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions, build_spec, options_from
from swarm_queue.common.keys import Keys
from swarm_queue.producer.enqueue import JOB_FLAGS, options_from_args, parser
from tests.harness import command


def _job_flags() -> set[str]:
    group = next(g for g in parser()._action_groups if g.title and "job settings" in g.title)
    return {action.dest for action in group._group_actions}


def test_every_job_flag_of_the_cli_is_a_setting_of_the_api_and_back() -> None:
    assert _job_flags() == set(JOB_FLAGS) == set(JobOptions.__struct_fields__) - {"reduce"}


def test_the_cli_and_the_api_build_the_same_spec_from_the_same_settings(tmp_path: Path) -> None:
    template = tmp_path / "t.txt"
    template.write_text("<s>{prompt}</s>")
    args = parser().parse_args(
        ["in.txt", "--job", "j", "--model", "m", "--max-tokens", "9", "--temperature", "0",
         "--top-p", "0.5", "--stop", "END", "--seed", "4", "--chat", "--template", str(template),
         "--schema", '{"type": "object"}', "--response-format", '{"type": "json_object"}',
         "--structured-outputs", '{"choice": ["a"]}', "--priority", "3", "--cache",
         "--cache-sampled", "--refresh"]
    )  # fmt: skip
    from_cli, _ = build_spec("j", options_from_args(args), source="x")
    from_api, _ = build_spec(
        "j",
        options_from(
            {
                "model": "m", "max_tokens": 9, "temperature": 0, "top_p": 0.5, "stop": ["END"],
                "seed": 4, "chat": True, "template": "<s>{prompt}</s>",
                "schema": {"type": "object"}, "response_format": {"type": "json_object"},
                "structured_outputs": {"choice": ["a"]}, "priority": 3, "cache": True,
                "cache_sampled": True, "cache_refresh": True,
            }
        ),
        source="x",
    )  # fmt: skip
    assert from_cli == from_api
    assert from_api.params.top_p == 0.5 and from_api.cache_refresh and from_api.chat


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"template": "no slot"}, "the template has no {prompt} to fill in"),
        ({"cache": True}, r"the cache needs a model \(--model NAME, or model=\)"),
        ({"temperature": "hot"}, "Expected `float | null`, got `str`"),
        ({"top_p": 3.0}, r"top_p must be in \(0, 1\], got 3.0"),
        (
            {"samples": 4, "temperature": 0},
            r"--samples 4 with --temperature 0 \(greedy decoding\) would be one answer "
            "repeated, and vLLM refuses it: set a temperature above 0",
        ),
    ],
)
def test_one_rule_refuses_a_bad_setting_for_both(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_spec("j", options_from(settings), source="x")


def test_a_sampled_cache_is_the_same_warning_for_both() -> None:
    _, warnings = build_spec("j", options_from({"model": "m", "cache": True}), source="x")
    assert len(warnings) == 1 and "keeps deterministic answers only" in warnings[0]


def test_greedy_samples_are_refused_by_swarm_enqueue_before_anything_is_queued(
    tmp_path: Path, cli_env: dict[str, str], redis_url: str, prefix: str
) -> None:
    """Seen on vLLM: accepted, then every prompt failed 400 after 78 requests for 40 prompts."""
    (tmp_path / "in.txt").write_text("a\nb\n")
    got = command(cli_env, "swarm-enqueue", tmp_path / "in.txt", "--job", "g", "--samples", "3",
                  "--temperature", "0")  # fmt: skip
    assert got.returncode == 2
    assert "--samples 3 with --temperature 0 (greedy decoding) would be one answer" in got.stderr
    with redis.Redis.from_url(redis_url) as client:
        assert client.exists(Keys(prefix).meta("g")) == 0


def test_the_typed_job_settings_are_the_job_options() -> None:
    """Swarm.submit's keyword arguments, typed for editors and type checkers, name exactly
    JobOptions' fields, with the same types."""
    import typing

    from swarm_queue.common.jobspec import JobOptions, JobSettings

    hints = typing.get_type_hints(JobSettings)
    fields = typing.get_type_hints(JobOptions)
    assert list(hints) == list(JobOptions.__struct_fields__)
    assert hints == {name: fields[name] for name in JobOptions.__struct_fields__}
