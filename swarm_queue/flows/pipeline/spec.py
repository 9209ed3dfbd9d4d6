"""A pipeline: a job whose answers each go on, the moment it is committed, as a prompt of the
job's next step (``job:s1``, ``job:s2``...), built from a template with ``{answer}`` and the
input's ``{prompt}``, unless the step's filter keeps it back. No step waits for the one before
to end: the first input through every step is answered after one pass, not after the slowest
prompt of every step.

Every step is a job to the workers (its own settings: model, sampling, chat, template);
:func:`build_pipeline` makes their specs from the same options as ``swarm-enqueue`` and
``Swarm.submit`` take, the link to the next step in each (:class:`Link`, the step's flow settings).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.feed import EnqueueReport, PromptInput, enqueue_prompts
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import Embedding, FlowRef, JobSpec, PromptItem
from swarm_queue.common.perprompt import PER_PROMPT_KINDS
from swarm_queue.common.reduce import function_allowed, load_function
from swarm_queue.common.reducekinds import REDUCE_KINDS
from swarm_queue.common.store import ProducerStore

__all__ = [
    "KIND",
    "MAX_STEPS",
    "Keep",
    "Link",
    "StepOptions",
    "build_pipeline",
    "enqueue_pipeline",
    "fill",
    "link_of",
    "needs_steps",
    "next_item",
]

# More steps than any study runs; step names stay short.
MAX_STEPS = 64
# The name the pipeline's flow goes by (a step's FlowRef.kind).
KIND = "pipeline"


class Link(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """Where a pipeline step's answers go the moment each is committed (the step's flow
    settings): job ``job`` (the next step), each as ``template`` with ``{answer}`` (this
    step's answer) and ``{prompt}`` (the input's prompt) filled in. An answer that ``keep_if``
    (a regular expression searched in it) or ``keep_fn`` (``package.module:function``, which
    the workers' ``SWARM_REDUCE_FUNCTIONS`` allow) refuses goes no further, with the reason
    kept."""

    job: str
    template: str
    keep_if: str | None = None
    keep_fn: str | None = None
    # What moves on is the answer's samples, to be embedded together (an uncertainty
    # measure's step), rather than its text filled into the template.
    samples: bool = False


def link_of(spec: JobSpec) -> Link | None:
    """Where ``spec``'s answers go on, when it is a pipeline step with a step after it."""
    if spec.flow is None or spec.flow.kind != KIND:
        return None
    return msgspec.convert(spec.flow.settings, Link)


_FIELD = re.compile(r"\{(answer|prompt)\}")


def fill(template: str, answer: str, prompt: str) -> str:
    """``template`` with ``{answer}`` and ``{prompt}`` replaced, in one pass: an answer that
    itself holds ``{prompt}`` stays as written."""
    values = {"answer": answer, "prompt": prompt}
    return _FIELD.sub(lambda m: values[m.group(1)], template)


class StepOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A step after a pipeline's first: its prompt template (``{answer}``: the answer of the
    step before, ``{prompt}``: the input's prompt), its filter, and its job settings (a
    ``model`` None and a ``priority`` 0 are the first step's)."""

    template: str
    keep_if: str | None = None
    keep_fn: str | None = None
    options: JobOptions = JobOptions()


# What looks like a placeholder in a template: a name in braces.
_NAMED = re.compile(r"\{([A-Za-z_]\w*)\}")


def _check_step(k: int, step: StepOptions) -> None:
    if "{answer}" not in step.template:
        raise ConfigError(f"step {k}'s template has no {{answer}} to fill in")
    unknown = sorted({m for m in _NAMED.findall(step.template) if m not in ("answer", "prompt")})
    if unknown:
        raise ConfigError(
            f"step {k}'s template names {', '.join('{' + u + '}' for u in unknown)}: only "
            "{answer} (the step before's answer) and {prompt} (the input's) are filled in"
        )
    if step.keep_if is not None:
        try:
            re.compile(step.keep_if)
        except re.error as exc:
            raise ConfigError(f"step {k}'s keep-if {step.keep_if!r}: {exc}") from None
    if step.keep_fn is not None and not re.fullmatch(r"[\w.]+:\w+", step.keep_fn):
        raise ConfigError(f"step {k}'s keep function {step.keep_fn!r} is not package.module:fn")
    if step.options.reduce is not None:
        raise ConfigError("a pipeline's reduce is given with its first step's settings")


def build_pipeline(
    job: str, first: JobOptions, steps: Sequence[StepOptions], *, source: str
) -> tuple[list[JobSpec], list[str]]:
    """The specs of ``job`` and of its steps, each linked to the next, and the warnings to
    show; :class:`ConfigError` naming the step when one is invalid. A step whose per-prompt
    measure embeds its samples is followed by a step of its own that does (see
    :func:`needs_steps`)."""
    if len(steps) >= MAX_STEPS:
        raise ConfigError(f"a pipeline has at most {MAX_STEPS - 1} steps after its first")
    reduce = first.reduce
    if reduce is not None and REDUCE_KINDS[reduce.kind].fleet:
        raise ConfigError(
            f"a pipeline's reduce runs over its last step: a {reduce.kind} reduce is not "
            "supported there yet (concat, vote, json, stats or a function are)"
        )
    first = msgspec.structs.replace(first, reduce=None)
    for k, step in enumerate(steps, 1):
        _check_step(k, step)
    # Each step's spec, and the step that follows it (None: the last).
    planned: list[tuple[JobSpec, StepOptions | None]] = []
    warnings: list[str] = []
    for k, own in enumerate([first, *(s.options for s in steps)]):
        options = own
        if k:
            options = msgspec.structs.replace(
                own,
                model=own.model if own.model is not None else first.model,
                priority=own.priority or first.priority,
            )
        try:
            spec, said = build_spec(job, options, source=source, step=True)
        except ConfigError as exc:
            raise ConfigError(f"step {k}: {exc}") from None
        warnings += [f"step {k}: {w}" for w in said]
        if spec.per_prompt is not None and PER_PROMPT_KINDS[spec.per_prompt.kind].embeddings:
            # The uncertainty measure is a step of its own on the fleet: the samples embedded
            # together and measured, its answer going on.
            planned.append((spec, _SAMPLES))
            spec = _measure_step(spec)
        planned.append((spec, steps[k] if k < len(steps) else None))
    specs = []
    for k, (spec, after) in enumerate(planned):
        flow = None
        if after is not None:
            link = Link(
                job=step_name(job, k + 1),
                template=after.template,
                keep_if=after.keep_if,
                keep_fn=after.keep_fn,
                samples=after is _SAMPLES,
            )
            flow = FlowRef(kind=KIND, settings=msgspec.to_builtins(link))
        specs.append(msgspec.structs.replace(spec, job=step_name(job, k), flow=flow))
    if reduce is not None:  # over the last step's answers, in input order
        specs[-1] = msgspec.structs.replace(specs[-1], reduce=reduce)
    if len(specs) > MAX_STEPS:
        raise ConfigError(f"a pipeline has at most {MAX_STEPS} steps, its measures included")
    return specs, warnings


# The link into an uncertainty measure's step: each prompt's samples, as they are.
_SAMPLES = StepOptions(template="{answer}")


def _measure_step(sampled: JobSpec) -> JobSpec:
    """The step that embeds a sampled step's samples and measures their uncertainty."""
    per = sampled.per_prompt
    assert per is not None
    return JobSpec(
        job=sampled.job,
        model=per.model,
        request=Embedding(),
        per_prompt=per,
        priority=sampled.priority,
        source=f"{per.kind} of {sampled.job}",
    )


def needs_steps(options: JobOptions) -> bool:
    """Whether a job of ``options`` runs as a pipeline: its per-prompt measure embeds its
    samples, a step of its own on the fleet."""
    kind = PER_PROMPT_KINDS.get(options.per_prompt or "")
    return kind is not None and kind.embeddings


class Keep:
    """A link's filter: whether an answer goes on, and if not why. A ``keep_fn`` is imported
    only when the worker's ``SWARM_REDUCE_FUNCTIONS`` name it (the spec comes from Redis:
    whoever can write there must not choose what code the workers run); ``refused`` says why
    this worker cannot run it, and then its pump leaves the link to one that can."""

    def __init__(self, link: Link, allowed: Iterable[str]) -> None:
        self.pattern = re.compile(link.keep_if) if link.keep_if is not None else None
        self.fn: Callable[[str], Any] | None = None
        self.refused: str | None = None
        if link.keep_fn is not None:
            if not function_allowed(link.keep_fn, allowed):
                self.refused = (
                    f"keep function {link.keep_fn} (SWARM_REDUCE_FUNCTIONS does not allow it here)"
                )
            else:
                try:
                    self.fn = load_function(link.keep_fn)  # type: ignore[assignment]
                except ConfigError as exc:
                    self.refused = str(exc)
        self.link = link

    def why_not(self, answer: str) -> str | None:
        """None when ``answer`` goes on, else the reason it does not (never asked of a
        filter this worker cannot run: see ``refused``)."""
        assert self.refused is None, self.refused
        if self.pattern is not None and self.pattern.search(answer) is None:
            return f"the answer does not match keep-if {self.link.keep_if!r}"
        if self.fn is not None:
            try:
                if not self.fn(answer):
                    return f"{self.link.keep_fn} refused the answer"
            except Exception as exc:  # the user's code: its failure drops this item alone
                return f"{self.link.keep_fn} raised {type(exc).__name__}: {exc}"
        return None


def next_item(
    link: Link, index: int, item: PromptItem, answer: str, samples: Sequence[str] | None = None
) -> PromptItem:
    """The item queued as ``index`` of ``link``'s step for ``item``'s ``answer`` (and its
    ``samples``, which a samples link moves on to be embedded): it carries the input's index,
    prompt and custom_id on."""
    root = item.root if item.root is not None else item.prompt
    origin = item.origin if item.origin is not None else item.index
    return PromptItem(
        index=index,
        prompt=fill(link.template, answer, root),
        custom_id=item.custom_id,
        origin=origin,
        root=root,
        texts=tuple(samples) if link.samples and samples else None,
    )


async def enqueue_pipeline(
    store: ProducerStore, specs: Sequence[JobSpec], prompts: Iterable[PromptInput], **kwargs: Any
) -> EnqueueReport:
    """Create every step of a pipeline (``specs`` from :func:`build_pipeline`), later ones
    first so that no answer lands before its next step exists, then queue ``prompts`` into
    its first step as ``swarm-enqueue`` does (``kwargs``: :func:`common.feed.enqueue_prompts`'s).
    A rerun checks each step's settings and resumes the input."""
    for spec in reversed(specs[1:]):
        await store.create_job(spec)
    return await enqueue_prompts(store, specs[0], prompts, **kwargs)
