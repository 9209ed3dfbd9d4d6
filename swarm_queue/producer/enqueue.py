"""``swarm-enqueue``: read prompts and queue them for a job, idempotently.

Each prompt gets its 0-based input index and the stream entry ID ``0-(index+1)``. A rerun of the
same command after a crash skips the prompts the stream already holds and queues the rest: no
duplicate, no gap. When the whole input is queued the job is sealed with its total.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import msgspec

from swarm_queue.common.cli import Parser, add_redis_arg, run, settings_from_args
from swarm_queue.common.errors import BadRecordError, ConfigError, InputError, JobNotFoundError
from swarm_queue.common.feed import EnqueueReport, PromptInput, enqueue_prompts
from swarm_queue.common.fleet import live_models, waiting_reason
from swarm_queue.common.jobspec import build_spec
from swarm_queue.common.keys import validate_job_name
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.request import Route, route_of
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.bestof.flow import build_best_of
from swarm_queue.flows.pipeline.spec import build_pipeline, enqueue_pipeline, needs_steps
from swarm_queue.producer.agentjob import add_agent_args, enqueue_agent_job, is_agent_job
from swarm_queue.producer.inputs import (
    DEFAULT_MAX_PROMPT_BYTES,
    Format,
    Parsed,
    is_parquet,
    iter_prompts,
    parquet_prompts,
)
from swarm_queue.producer.jobflags import (
    JOB_FLAGS,
    add_best_of_args,
    add_job_settings,
    add_reduce_args,
    best_of_from_args,
    options_from_args,
    split_steps,
    step_from_args,
    step_parser,
)

__all__ = [
    "JOB_FLAGS",
    "EnqueueReport",
    "ParamsMemo",
    "enqueue",
    "enqueue_prompts",
    "main",
    "options_from_args",
    "parser",
    "prompts_for",
    "split_steps",
    "step_parser",
]

# enqueue_prompts and EnqueueReport live in common.feed (the reduce stage queues prompts too),
# the job's flags in producer.jobflags; they are part of the producer's API, re-exported here.


async def check_model(
    settings: Settings, model: str | None, *, strict: bool, what: str = ""
) -> None:
    """Warn on stderr (``strict``: refuse with a ConfigError, before anything is queued) when
    no live endpoint serves ``model``, as the workers' fleet registry shows it; ``what``
    names the pipeline step it is for."""
    store = JobStore.from_settings(settings, patient=False)
    try:
        reason = waiting_reason(model, await store.read_fleet(), await store.server_time())
    except BadRecordError as exc:  # the fleet registry's key holds another tool's value
        reason = f"the endpoints serving it cannot be known: {exc}"
    finally:
        await store.close()
    if reason is None:
        return
    if what:
        reason = f"{what}: {reason}"
    if strict:
        raise ConfigError(f"--check-model: {reason}")
    print(
        f"swarm-enqueue: warning: {reason}; the job waits until an endpoint serving it appears",
        file=sys.stderr,
    )


async def warn_mixed_models(settings: Settings) -> None:
    """Warn on stderr when the live endpoints serve more than one model: a job without
    --model takes whatever each endpoint serves, so its answers would mix them (seen: 64 of
    300 answered by an embedding model)."""
    store = JobStore.from_settings(settings, patient=False)
    try:
        served = live_models(await store.read_fleet(), await store.server_time())
    except BadRecordError:
        return  # the fleet registry's key holds another tool's value: nothing to tell
    finally:
        await store.close()
    if len(served) > 1:
        print(
            f"swarm-enqueue: warning: the live endpoints serve {len(served)} models "
            f"({', '.join(served)}): a job without --model is answered by whichever each "
            "endpoint serves, so its answers would mix them; give --model NAME",
            file=sys.stderr,
        )


async def enqueue(
    settings: Settings,
    spec: JobSpec,
    source: str,
    stream: BinaryIO,
    *,
    fmt: Format = "auto",
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES,
    progress: bool = False,
    window: int | None = None,
    later: Sequence[JobSpec] = (),
    column: str = "prompt",
    id_column: str | None = None,
    checked: bool = False,
    affinity: bool = True,
) -> EnqueueReport:
    """Queue every prompt of ``stream`` (a binary line iterator) for ``spec.job``; ``later``:
    the pipeline steps after it (see :mod:`flows.pipeline.spec`), created first. A Parquet input
    is read from the file ``source`` names, its ``column`` (``id_column``: custom ids).

    A file is checked whole before any of it is queued: a bad line half-way must not leave a
    job running half its input, waiting for the rest for ever. A stream that cannot be read
    twice (stdin) is queued as it comes, and a bad line ends the job where it stands: sealed
    with the prompts queued before it, so that its workers and collectors end. ``checked``:
    the caller checked every line already (the gateway)."""
    line_input = not is_parquet(source, fmt)

    def parsed() -> Iterator[Parsed]:
        if not line_input:
            return parquet_prompts(source, column, id_column)
        return iter_prompts(stream, source, fmt, max_prompt_bytes=max_prompt_bytes)

    store = JobStore.from_settings(settings)
    try:
        if not checked and (not line_input or stream.seekable()):
            for _ in prompts_for(spec, source, parsed())[1]:
                pass  # raises the first bad line's InputError
            if line_input:
                stream.seek(0)
        spec, prompts = prompts_for(spec, source, parsed())
        try:
            return await enqueue_pipeline(
                store, [spec, *later], prompts, progress=progress, window=window, affinity=affinity
            )
        except InputError as exc:
            await _stop_at(store, spec.job, exc)
            raise
    finally:
        await store.close()


async def _stop_at(store: JobStore, job: str, exc: InputError) -> None:
    """End ``job`` at the bad line ``exc`` names of a stream read once: sealed with what was
    queued before it (nothing to do if the job was never created)."""
    try:
        gen = (await store.load_spec(job)).generation
    except JobNotFoundError:
        return
    queued = await store.enqueued_count(job)
    await store.seal(job, queued, gen=gen)
    print(
        f"swarm-enqueue: job {job} ends at {exc.source}:{exc.line} with the {queued} prompts "
        "queued before it (sealed: its workers and collectors end); queue the rest of the "
        "input as another job",
        file=sys.stderr,
    )


def prompts_for(
    spec: JobSpec, source: str, parsed: Iterator[Parsed]
) -> tuple[JobSpec, Iterator[PromptInput]]:
    """The job as its input defines it (without ``--model``, the model its batch lines name),
    and its prompts, each line checked against the job."""
    first = next(parsed, None)
    if first is None:
        return spec, iter(())
    model = (first.fields or {}).get("model")
    if spec.model is None and isinstance(model, str):
        spec = msgspec.structs.replace(spec, model=model)
    memo: ParamsMemo = {}
    return spec, (prompt_of(p, source, spec, memo) for p in itertools.chain([first], parsed))


# A line's own request fields (as JSON) -> its sampling settings: lines of one file mostly
# ask for the same, and the conversion is most of what checking a line costs.
ParamsMemo = dict[bytes, SamplingParams | None]
_MEMO_MAX = 1024
_encode_json = msgspec.json.Encoder().encode


def prompt_of(p: Parsed, source: str, spec: JobSpec, memo: ParamsMemo | None = None) -> PromptInput:
    """One line's prompt and its own settings (None: the job's); InputError for a line the
    job cannot send as it asks (its API, its model, its sampling values). ``memo``: the
    settings of the fields seen before, for lines of one ``spec``."""
    if p.messages is not None and not spec.chat:
        raise InputError(
            source,
            p.line,
            f"a conversation of {len(p.messages)} messages needs --chat: /v1/completions takes "
            "one text per prompt (or write the conversation into a --template)",
        )
    responses = route_of(spec) is Route.RESPONSES
    if (p.route == "responses") != responses and p.route is not None and not spec.embed:
        raise InputError(
            source,
            p.line,
            "a /v1/responses line needs a responses job (--responses)"
            if p.route == "responses"
            else f"a {p.route} line in a responses job (--responses)",
        )
    if p.route == "chat" and not spec.chat and spec.template is None:
        raise InputError(
            source,
            p.line,
            "a /v1/chat/completions line needs --chat (the server applies the model's chat "
            "template) or --template FILE (the template written out, list-batched)",
        )
    if (p.route == "embeddings") != spec.embed and p.route is not None:
        raise InputError(
            source,
            p.line,
            "a /v1/embeddings line needs an embeddings job (--embed)"
            if p.route == "embeddings"
            else f"a /v1/{'chat/' if p.route == 'chat' else ''}completions line in an embeddings "
            "job (--embed)",
        )
    if p.route == "completions" and spec.chat:
        raise InputError(
            source, p.line, "a /v1/completions line in a --chat job: drop --chat for it"
        )
    fields = dict(p.fields or {})
    model = fields.pop("model", None)
    if model is not None and model != spec.model:
        raise InputError(
            source,
            p.line,
            f"body.model {model!r} is not the job's model {spec.model!r}: one model per job, "
            "as in OpenAI's Batch API (split the file into one job per model)",
        )
    params = None
    if fields:
        key = _encode_json(fields) if memo is not None else b""
        if memo is not None and key in memo:
            return (p.messages if p.messages is not None else p.prompt), p.custom_id, memo[key]
        try:
            params = msgspec.convert({**msgspec.to_builtins(spec.params), **fields}, SamplingParams)
        except (msgspec.ValidationError, ConfigError) as exc:
            raise InputError(source, p.line, f"body: {exc}") from None
        if params == spec.params:
            params = None
        if memo is not None and len(memo) < _MEMO_MAX:
            memo[key] = params
    return (p.messages if p.messages is not None else p.prompt), p.custom_id, params


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="swarm-enqueue",
        description="Queue prompts for a job. Safe to run again after a crash: it resumes.",
    )
    p.add_argument("input", help="prompt file (.txt, .jsonl, OpenAI batch .jsonl) or - for stdin")
    p.add_argument("--job", required=True, help="job name: letters, digits, '.', '_', '-'")
    add_job_settings(p)
    p.add_argument(
        "--check-model",
        action="store_true",
        help="refuse the job unless a live endpoint serves --model (without it: a warning)",
    )
    source = p.add_argument_group("the input (read, checked and queued in chunks; a rerun resumes)")
    source.add_argument(
        "--format",
        choices=["auto", "txt", "jsonl", "parquet"],
        default="auto",
        help="the input's format (auto: by its name and first line; a .parquet file is Parquet)",
    )
    source.add_argument(
        "--column", default="prompt", help="a Parquet input's prompt column (default: prompt)"
    )
    source.add_argument("--id-column", help="a Parquet input's column of custom ids")
    source.add_argument(
        "--max-prompt-bytes",
        type=int,
        default=DEFAULT_MAX_PROMPT_BYTES,
        metavar="N",
        help="refuse the input at a line longer than N bytes, naming the line "
        f"(default {DEFAULT_MAX_PROMPT_BYTES:,})",
    )
    source.add_argument(
        "--window",
        type=int,
        metavar="N",
        help="keep at most N unfinished prompts in Redis: stream a huge input with "
        "bounded memory, waiting for results before queuing more. Default: as many as "
        "leave room for their answers within Redis's maxmemory (none without one)",
    )
    source.add_argument(
        "--no-affinity",
        action="store_true",
        help="send prompts that share a long prefix wherever, not to the engine that computes "
        "it (docs/JOBS.md, affinity): only to measure without it",
    )
    pipeline = p.add_argument_group("a pipeline (steps after the first, each with its own flags)")
    pipeline.add_argument(
        "--then",
        metavar="TEMPLATE",
        action="append",
        help="a pipeline's next step: each answer, the moment it is committed, is sent on as "
        "this file's text with {answer} and {prompt} (the input's) filled in. The flags after "
        "it, up to the next --then, are that step's own: --max-tokens, --chat, --template..., "
        "--keep-if REGEX and --keep-fn package.module:fn (allowed by the workers' "
        "SWARM_REDUCE_FUNCTIONS), the gate into that step: only answers of the step before "
        "that pass reach it; --model and --priority default to the first "
        "step's. Collect the pipeline with swarm-collect JOB: one line per input, every step",
    )
    add_agent_args(p)
    add_best_of_args(p)
    add_reduce_args(p)
    add_redis_arg(p)
    return p


async def _main(args: argparse.Namespace, steps: Sequence[list[str]] = ()) -> int:
    settings = settings_from_args(args)
    job = validate_job_name(args.job)
    for flag, value in (
        ("--max-tokens", args.max_tokens),
        ("--max-prompt-bytes", args.max_prompt_bytes),
        ("--window", args.window),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    first = options_from_args(args)
    if is_agent_job(args):
        if steps or args.best_of is not None:
            raise ConfigError("an agent job has turns, not --then steps or --best-of")
        print(await enqueue_agent_job(settings, args, job, first))
        return 0
    later: list[JobSpec] = []
    best = best_of_from_args(args)
    if best is not None:
        if steps:
            raise ConfigError("a best-of job has its judge, not --then steps")
        n, judge, judge_model = best
        specs, warnings = build_best_of(
            job, first, n, judge, judge_model=judge_model, source=args.input
        )
        spec, later = specs[0], specs[1:]
    elif steps or needs_steps(first):
        step_options = [step_from_args(step_parser().parse_args(a)) for a in steps]
        specs, warnings = build_pipeline(job, first, step_options, source=args.input)
        spec, later = specs[0], specs[1:]
    else:
        spec, warnings = build_spec(job, first, source=args.input, created_s=time.time())
    for warning in warnings:
        print(f"swarm-enqueue: warning: {warning}", file=sys.stderr)
    if args.model is not None or args.check_model:
        await check_model(settings, args.model, strict=args.check_model)
    else:
        await warn_mixed_models(settings)
    for k, step in enumerate(later, 1):  # a later step (or a measure) of a model of its own
        if step.model is not None and step.model != args.model:
            what = f"step {k} {step.job}"
            await check_model(settings, step.model, strict=args.check_model, what=what)
    if args.input == "-":
        report = await enqueue(
            settings,
            spec,
            "<stdin>",
            sys.stdin.buffer,
            fmt=args.format,
            column=args.column,
            id_column=args.id_column,
            max_prompt_bytes=args.max_prompt_bytes,
            progress=True,
            window=args.window,
            later=later,
            affinity=not args.no_affinity,
        )
    else:
        try:
            fh = open(args.input, "rb")  # noqa: SIM115, ASYNC230 - closed below; a CLI, nothing else runs
        except OSError as exc:
            raise ConfigError(f"cannot read {args.input}: {exc.strerror}") from None
        with fh:
            report = await enqueue(
                settings,
                spec,
                args.input,
                fh,
                fmt=args.format,
                column=args.column,
                id_column=args.id_column,
                max_prompt_bytes=args.max_prompt_bytes,
                progress=True,
                window=args.window,
                later=later,
                affinity=not args.no_affinity,
            )
    print(
        f"job {report.job}: {report.total} prompts queued "
        f"({report.added} new, {report.already_queued} already queued)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    head, steps = split_steps(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(head)
    for step in steps:  # usage errors of every step before anything runs
        step_parser().parse_args(step)
    raise SystemExit(run("swarm-enqueue", _main(args, steps)))
