"""One way from what a user asks for to a job's spec, shared by ``swarm-enqueue`` and
``Swarm.submit``: every setting named once (:class:`JobOptions`), checked by the same rules
(:func:`build_spec`). A new job setting is a field here and of :class:`common.models.JobSpec`;
the CLI's flag and the API's keyword follow from it (a test checks that every job flag of the
CLI is a field here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from common.cache import check_cache_spec
from common.errors import ConfigError
from common.keys import validate_job_name
from common.models import JobSpec, ReduceSpec, SamplingParams
from common.schema import AnswerValidator

__all__ = ["JobOptions", "build_spec", "options_from"]


class JobOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting of a job, as ``Swarm.submit`` takes them; the CLI's flags are the same
    names with dashes (``--max-tokens``), files read into them (``--template FILE``)."""

    model: str | None = None
    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    response_format: dict[str, object] | None = None
    structured_outputs: dict[str, object] | None = None
    chat: bool = False
    # The text each prompt is put into, at {prompt} (a chat template written out).
    template: str | None = None
    # A JSON Schema every answer must match.
    schema: dict[str, object] | None = None
    priority: int = 0
    cache: bool = False
    cache_sampled: bool = False
    cache_refresh: bool = False
    reduce: ReduceSpec | None = None


def options_from(settings: Mapping[str, Any]) -> JobOptions:
    """The options named by ``settings`` (keyword arguments); ConfigError for a name that is
    no job setting, or a value of the wrong type."""
    try:
        return msgspec.convert(dict(settings), JobOptions)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"job settings: {exc}") from None


def build_spec(
    job: str, options: JobOptions, *, source: str, created_s: float = 0.0
) -> tuple[JobSpec, list[str]]:
    """The spec of ``job`` asked for with ``options`` (ConfigError naming the setting when one
    is invalid), and the warnings to show its user."""
    validate_job_name(job)
    if options.max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {options.max_tokens}")
    if options.template is not None and "{prompt}" not in options.template:
        raise ConfigError("the template has no {prompt} to fill in")
    if options.schema is not None:
        AnswerValidator(options.schema)  # refuses what it cannot check, before anything is queued
    try:
        params = SamplingParams(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            stop=options.stop,
            seed=options.seed,
            response_format=options.response_format,
            structured_outputs=options.structured_outputs,
        )
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc)) from None
    spec = JobSpec(
        job=job,
        model=options.model,
        params=params,
        created_s=created_s,
        source=source,
        reduce=options.reduce,
        schema=options.schema,
        chat=options.chat,
        template=options.template,
        priority=options.priority,
        cache=options.cache or options.cache_sampled or options.cache_refresh,
        cache_sampled=options.cache_sampled,
        cache_refresh=options.cache_refresh,
    )
    warning = check_cache_spec(spec)  # ConfigError for a cached job without a model
    return spec, [warning] if warning is not None else []
