"""One way from what a user asks for to a job's spec, shared by ``swarm-enqueue`` and
``Swarm.submit``: every setting named once (:class:`JobOptions`), checked by the same rules
(:func:`build_spec`). A new job setting is a field here and of :class:`common.models.JobSpec`;
the CLI's flag and the API's keyword follow from it (a test checks that every job flag of the
CLI is a field here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import msgspec

from swarm_queue.common.cache import check_cache_spec
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.keys import validate_job_name
from swarm_queue.common.models import (
    Chat,
    Completion,
    Embedding,
    JobSpec,
    PerPrompt,
    ReduceSpec,
    RequestKind,
    SamplingParams,
)
from swarm_queue.common.perprompt import PER_PROMPT_KINDS
from swarm_queue.common.schema import AnswerValidator
from swarm_queue.common.shards import check_shards

__all__ = ["DEFAULT_CHUNK", "MAX_CHUNK", "JobOptions", "JobSettings", "build_spec", "options_from"]

# The most prompts a stream entry holds: a chunk is read, answered and acknowledged whole.
MAX_CHUNK = 1024
# A plain job's prompts a stream entry unless told: half the default batch, so that a batch is
# two entries (docs/SCALE.md has what it saves).
DEFAULT_CHUNK = 16


class JobOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting of a job, as ``Swarm.submit`` takes them; the CLI's flags are the same
    names with dashes (``--max-tokens``), files read into them (``--template FILE``)."""

    model: str | None = None
    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    # Answers sampled per prompt (vLLM's n), and what is made of them per prompt (a kind of
    # common.perprompt; the uncertainty measures embed the samples with per_prompt_model).
    samples: int = 1
    per_prompt: str | None = None
    per_prompt_model: str | None = None
    similarity: float = 0.9
    response_format: dict[str, object] | None = None
    structured_outputs: dict[str, object] | None = None
    chat: bool = False
    # Send each prompt to /v1/responses (OpenAI's Responses API) rather than chat: a chat job
    # whose conversations are the requests' input.
    responses: bool = False
    # Embed each prompt (/v1/embeddings) instead of generating an answer.
    embed: bool = False
    # The text each prompt is put into, at {prompt} (a chat template written out).
    template: str | None = None
    # A JSON Schema every answer must match.
    schema: dict[str, object] | None = None
    priority: int = 0
    # The project the job is for: a project's jobs share one turn of the fleet.
    project: str = ""
    cache: bool = False
    cache_sampled: bool = False
    cache_refresh: bool = False
    line_usage: bool = False
    # Prompts to a stream entry: read, claimed and acknowledged as one (see JobSpec.chunk);
    # None: DEFAULT_CHUNK for a plain job, 1 for a workflow's step.
    chunk: int | None = None
    # Redis Cluster slots the job is spread over (see common/shards.py): a plain job's only.
    shards: int = 1
    reduce: ReduceSpec | None = None


class JobSettings(TypedDict, total=False):
    """:class:`JobOptions` as keyword arguments (``Swarm.submit(..., max_tokens=64)``), named
    so that an editor completes them and a type checker checks them; the same fields (a test
    holds the two together)."""

    model: str | None
    max_tokens: int
    temperature: float | None
    top_p: float | None
    stop: list[str] | None
    seed: int | None
    samples: int
    per_prompt: str | None
    per_prompt_model: str | None
    similarity: float
    response_format: dict[str, object] | None
    structured_outputs: dict[str, object] | None
    chat: bool
    responses: bool
    embed: bool
    template: str | None
    schema: dict[str, object] | None
    priority: int
    project: str
    cache: bool
    cache_sampled: bool
    cache_refresh: bool
    line_usage: bool
    chunk: int | None
    shards: int
    reduce: ReduceSpec | None


def options_from(settings: Mapping[str, Any]) -> JobOptions:
    """The options named by ``settings`` (keyword arguments); ConfigError for a name that is
    no job setting, or a value of the wrong type."""
    try:
        return msgspec.convert(dict(settings), JobOptions)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"job settings: {exc}") from None


# The settings an embeddings job cannot have: they shape a generated answer, which it has none of.
_NOT_FOR_EMBED = (
    "chat",
    "responses",
    "schema",
    "response_format",
    "structured_outputs",
    "stop",
    "reduce",
)


def _check_embed(options: JobOptions) -> None:
    given = [name for name in _NOT_FOR_EMBED if getattr(options, name)]
    if given:
        raise ConfigError(
            f"an embeddings job (embed) has no {', '.join(given)}: it generates no text"
        )
    if options.cache or options.cache_sampled or options.cache_refresh:
        raise ConfigError("the response cache keeps generated answers only, not embeddings")
    if options.samples != 1:
        raise ConfigError("an embeddings job (embed) has one vector a prompt: no samples")


def _per_prompt(options: JobOptions) -> PerPrompt | None:
    """The per-prompt reduce asked for, checked against the samples it needs."""
    if options.per_prompt is None:
        if options.per_prompt_model is not None:
            raise ConfigError(
                "per_prompt_model is for --per-prompt semantic-entropy or kernel-entropy"
            )
        return None
    kind = PER_PROMPT_KINDS.get(options.per_prompt)
    if kind is None:
        raise ConfigError(
            f"unknown per-prompt reduce {options.per_prompt!r}: use one of "
            + ", ".join(PER_PROMPT_KINDS)
        )
    if options.samples < 2:
        raise ConfigError(f"--per-prompt {options.per_prompt} needs --samples 2 or more")
    if kind.embeddings and options.per_prompt_model is None:
        raise ConfigError(
            f"--per-prompt {options.per_prompt} embeds the samples: name the embeddings model "
            "(--per-prompt-model)"
        )
    if not 0 < options.similarity <= 1:
        raise ConfigError(f"similarity must be in (0, 1], got {options.similarity}")
    return PerPrompt(
        kind=options.per_prompt, model=options.per_prompt_model, similarity=options.similarity
    )


# What /v1/responses does not take (its sampling is temperature, top_p and max_output_tokens).
_NOT_FOR_RESPONSES = ("stop", "seed", "response_format", "structured_outputs", "embed")


def _check_responses(options: JobOptions) -> None:
    given = [name for name in _NOT_FOR_RESPONSES if getattr(options, name)]
    if options.samples != 1:
        given.append("samples")
    if given:
        raise ConfigError(
            f"a responses job (responses) has no {', '.join(given)}: /v1/responses takes a "
            "conversation, max_output_tokens, temperature and top_p"
        )


def _request(options: JobOptions) -> RequestKind:
    """What the prompts of a job of ``options`` are sent as."""
    if options.embed:
        return Embedding()
    if options.responses:
        return Chat(template=options.template, api="responses")
    if options.chat:
        return Chat(template=options.template)
    return Completion(template=options.template)


def build_spec(
    job: str, options: JobOptions, *, source: str, created_s: float = 0.0, step: bool = False
) -> tuple[JobSpec, list[str]]:
    """The spec of ``job`` asked for with ``options`` (ConfigError naming the setting when one
    is invalid), and the warnings to show its user. A workflow's ``step`` takes one prompt an
    entry: its answers move on one by one, as they come."""
    validate_job_name(job)
    if options.max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {options.max_tokens}")
    chunk = options.chunk if options.chunk is not None else 1 if step else DEFAULT_CHUNK
    if not 1 <= chunk <= MAX_CHUNK:
        raise ConfigError(f"chunk must be 1..{MAX_CHUNK} prompts an entry, got {chunk}")
    if step and chunk > 1:
        raise ConfigError("a workflow's steps take no --chunk: their answers move on one by one")
    if step and check_shards(options.shards) > 1:
        raise ConfigError("a workflow's steps are not spread over shards: leave --shards at 1")
    if options.template is not None and "{prompt}" not in options.template:
        raise ConfigError("the template has no {prompt} to fill in")
    if options.embed:
        _check_embed(options)
    if options.responses:
        _check_responses(options)
    per_prompt = _per_prompt(options)
    if options.samples > 1 and options.temperature == 0:
        # vLLM refuses it (400 "n must be 1 when using greedy sampling"): every prompt failed.
        raise ConfigError(
            f"--samples {options.samples} with --temperature 0 (greedy decoding) would be one "
            "answer repeated, and vLLM refuses it: set a temperature above 0 (a seed makes "
            "the samples repeatable)"
        )
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
            n=options.samples if options.samples != 1 else None,
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
        request=_request(options),
        per_prompt=per_prompt,
        priority=options.priority,
        project=options.project,
        cache=options.cache or options.cache_sampled or options.cache_refresh,
        cache_sampled=options.cache_sampled,
        cache_refresh=options.cache_refresh,
        line_usage=options.line_usage,
        chunk=chunk,
        shards=check_shards(options.shards),
    )
    if options.samples != 1 and spec.cache:
        raise ConfigError("the response cache keeps one answer a prompt: not with --samples")
    warning = check_cache_spec(spec)  # ConfigError for a cached job without a model
    return spec, [warning] if warning is not None else []
