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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

import msgspec

from common.cli import add_redis_arg, run, settings_from_args
from common.errors import BadRecordError, ConfigError, InputError
from common.feed import EnqueueReport, PromptInput, enqueue_prompts
from common.fleet import waiting_reason
from common.jobspec import JobOptions, build_spec
from common.keys import validate_job_name
from common.models import JobSpec, ReduceSpec, SamplingParams
from common.reducekinds import FUNCTION, REDUCE_KINDS, TREE
from common.settings import Settings
from common.store import JobStore
from producer.inputs import DEFAULT_MAX_PROMPT_BYTES, Format, Parsed, iter_prompts

__all__ = [
    "JOB_FLAGS",
    "EnqueueReport",
    "enqueue",
    "enqueue_prompts",
    "main",
    "options_from_args",
    "parser",
]

# enqueue_prompts and EnqueueReport live in common.feed (the reduce stage queues prompts too);
# they are part of the producer's API, re-exported here.


async def check_model(settings: Settings, model: str | None, *, strict: bool) -> None:
    """Warn on stderr (``strict``: refuse with a ConfigError, before anything is queued) when
    no live endpoint serves ``model``, as the workers' fleet registry shows it."""
    store = JobStore.from_settings(settings, patient=False)
    try:
        reason = waiting_reason(model, await store.read_fleet(), await store.server_time())
    except BadRecordError as exc:  # the fleet registry's key holds another tool's value
        reason = f"the endpoints serving it cannot be known: {exc}"
    finally:
        await store.close()
    if reason is None:
        return
    if strict:
        raise ConfigError(f"--check-model: {reason}")
    print(
        f"swarm-enqueue: warning: {reason}; the job waits until an endpoint serving it appears",
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
) -> EnqueueReport:
    """Queue every prompt of ``stream`` (a binary line iterator) for ``spec.job``."""
    store = JobStore.from_settings(settings)
    try:
        parsed = iter_prompts(stream, source, fmt, max_prompt_bytes=max_prompt_bytes)
        spec, prompts = _prompts_for(spec, source, parsed)
        return await enqueue_prompts(store, spec, prompts, progress=progress, window=window)
    finally:
        await store.close()


def _prompts_for(
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
    return spec, (_prompt_of(p, source, spec) for p in itertools.chain([first], parsed))


def _prompt_of(p: Parsed, source: str, spec: JobSpec) -> PromptInput:
    """One line's prompt and its own settings (None: the job's); InputError for a line the
    job cannot send as it asks (its API, its model, its sampling values)."""
    if p.messages is not None and not spec.chat:
        raise InputError(
            source,
            p.line,
            f"a conversation of {len(p.messages)} messages needs --chat: /v1/completions takes "
            "one text per prompt (or write the conversation into a --template)",
        )
    if p.route == "chat" and not spec.chat and spec.template is None:
        raise InputError(
            source,
            p.line,
            "a /v1/chat/completions line needs --chat (the server applies the model's chat "
            "template) or --template FILE (the template written out, list-batched)",
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
        try:
            params = msgspec.convert({**msgspec.to_builtins(spec.params), **fields}, SamplingParams)
        except (msgspec.ValidationError, ConfigError) as exc:
            raise InputError(source, p.line, f"body: {exc}") from None
        if params == spec.params:
            params = None
    return (p.messages if p.messages is not None else p.prompt), p.custom_id, params


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarm-enqueue",
        description="Queue prompts for a job. Safe to run again after a crash: it resumes.",
    )
    p.add_argument("input", help="prompt file (.txt, .jsonl, OpenAI batch .jsonl) or - for stdin")
    p.add_argument("--job", required=True, help="job name: letters, digits, '.', '_', '-'")
    j = p.add_argument_group(
        "job settings (the keywords of Swarm.submit, with dashes; see common/jobspec.py)"
    )
    j.add_argument("--model", help="model name (default: whatever each endpoint serves)")
    j.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    j.add_argument("--temperature", type=float, help="sampling temperature")
    j.add_argument("--top-p", type=float, help="nucleus sampling")
    j.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    j.add_argument("--seed", type=int, help="sampling seed")
    j.add_argument(
        "--response-format",
        metavar="JSON|FILE",
        help='passed through, e.g. {"type": "json_object"} or a json_schema response format',
    )
    j.add_argument(
        "--structured-outputs",
        metavar="JSON|FILE",
        help='vLLM\'s guided decoding, passed through, e.g. {"choice": ["yes", "no"]}',
    )
    j.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as its own /v1/chat/completions request (the server applies "
        "the model's chat template; no list batching)",
    )
    j.add_argument(
        "--template",
        metavar="FILE",
        help="wrap each prompt in this text, at {prompt}, before list-prompt batching on "
        "/v1/completions (a chat template written out)",
    )
    j.add_argument(
        "--schema",
        metavar="FILE",
        help="a JSON Schema each answer must match; a mismatch fails that prompt (kind "
        "'schema', its text kept)",
    )
    j.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="while a job of higher priority has work, the endpoints serve it first; jobs of "
        "equal priority share them in turn (default 0)",
    )
    j.add_argument(
        "--cache",
        action="store_true",
        help="answer prompts from the response cache shared by every job of this Redis, and "
        "keep new answers in it (deterministic requests only: temperature 0 or a seed; "
        "needs --model)",
    )
    j.add_argument(
        "--cache-sampled",
        action="store_true",
        help="with --cache: keep and reuse sampled answers too (a rerun gets the first "
        "sample again)",
    )
    j.add_argument(
        "--refresh",
        dest="cache_refresh",
        action="store_true",
        help="with --cache: answer nothing from the cache; ask the endpoints again and "
        "replace the answers it keeps (after an endpoint answered wrongly for a while)",
    )
    p.add_argument(
        "--check-model",
        action="store_true",
        help="refuse the job unless a live endpoint serves --model (without it: a warning)",
    )
    p.add_argument("--format", choices=["auto", "txt", "jsonl"], default="auto")
    p.add_argument("--max-prompt-bytes", type=int, default=DEFAULT_MAX_PROMPT_BYTES)
    p.add_argument(
        "--window",
        type=int,
        metavar="N",
        help="keep at most N unfinished prompts in Redis: stream a huge input with "
        "bounded memory, waiting for results before queuing more. Default: as many as "
        "leave room for their answers within Redis's maxmemory (none without one)",
    )
    r = p.add_argument_group("reduce stage (run by the workers once every prompt is answered)")
    r.add_argument(
        "--reduce",
        dest="reduce_kind",
        metavar="KIND",
        help="; ".join(
            f"{name}: {kind.help}" for name, kind in REDUCE_KINDS.items() if name != FUNCTION
        )
        + "; or package.module:function, the user's own (see swarm-collect --final)",
    )
    r.add_argument(
        "--reduce-prompt",
        metavar="FILE",
        help="tree: supervisor prompt template; {responses} and {level} are filled in",
    )
    r.add_argument("--fanin", type=int, default=10, help="tree: answers per supervisor prompt")
    r.add_argument(
        "--reduce-max-tokens",
        type=int,
        default=0,
        metavar="N",
        help="tree: tokens a supervisor prompt may generate (default: twice --max-tokens)",
    )
    r.add_argument("--separator", default="\n", help="concat: text between answers")
    add_redis_arg(p)
    return p


def _read_text(path: str, flag: str) -> str:
    """The text of the file given to ``flag``; ConfigError naming both if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc}") from None


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    template = _read_text(path, "--template")
    if "{prompt}" not in template:
        raise ConfigError(f"--template {path} has no {{prompt}} to fill in")
    return template


def _json_arg(value: str | None, flag: str) -> dict[str, Any] | None:
    """A JSON object given inline or as a file name."""
    if value is None:
        return None
    text = value
    if not value.lstrip().startswith("{"):
        try:
            with open(value, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{flag} {value}: not inline JSON, and cannot read it: {exc}"
            ) from None
    try:
        obj = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{flag}: invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{flag}: expected a JSON object")
    return obj


# The job settings that are flags of their own (the reduce is built from the --reduce* group).
JOB_FLAGS = tuple(name for name in JobOptions.__struct_fields__ if name != "reduce")
# The job settings whose flags name a file (or give JSON inline), and how each is read.
_FROM_FILES: dict[str, Callable[[Any], Any]] = {
    "template": lambda path: _read_template(path),
    "schema": lambda value: _json_arg(value, "--schema"),
    "response_format": lambda value: _json_arg(value, "--response-format"),
    "structured_outputs": lambda value: _json_arg(value, "--structured-outputs"),
}


def options_from_args(args: argparse.Namespace) -> JobOptions:
    """The job settings of parsed ``swarm-enqueue`` arguments, the files they name read."""
    fields = {name: getattr(args, name) for name in JOB_FLAGS}
    for name, read in _FROM_FILES.items():  # flags that take a file (or inline JSON)
        fields[name] = read(fields[name])
    return JobOptions(**{**fields, "reduce": reduce_from_args(args)})


def reduce_from_args(args: argparse.Namespace) -> ReduceSpec | None:
    """The ``--reduce*`` options as a :class:`ReduceSpec` (validated), or None."""
    if args.reduce_kind is None:
        if args.reduce_prompt is not None:
            raise ConfigError(f"--reduce-prompt needs --reduce {TREE}")
        return None
    kind, function = args.reduce_kind, None
    if ":" in kind:
        kind, function = FUNCTION, args.reduce_kind
    takes_prompt = kind in REDUCE_KINDS and REDUCE_KINDS[kind].prompt
    prompt = None
    if args.reduce_prompt is not None:
        if not takes_prompt:
            takers = " or ".join(n for n, k in REDUCE_KINDS.items() if k.prompt)
            raise ConfigError(f"--reduce-prompt is for --reduce {takers}")
        prompt = _read_text(args.reduce_prompt, "--reduce-prompt")
    elif takes_prompt:
        raise ConfigError(
            f"--reduce {kind} needs --reduce-prompt FILE (a template with {{responses}})"
        )
    return ReduceSpec(
        kind=kind,
        function=function,
        prompt=prompt,
        fanin=args.fanin,
        max_tokens=args.reduce_max_tokens,
        separator=args.separator,
    )


async def _main(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    job = validate_job_name(args.job)
    for flag, value in (
        ("--max-tokens", args.max_tokens),
        ("--max-prompt-bytes", args.max_prompt_bytes),
        ("--window", args.window),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    spec, warnings = build_spec(
        job, options_from_args(args), source=args.input, created_s=time.time()
    )
    for warning in warnings:
        print(f"swarm-enqueue: warning: {warning}", file=sys.stderr)
    if args.model is not None or args.check_model:
        await check_model(settings, args.model, strict=args.check_model)
    if args.input == "-":
        report = await enqueue(
            settings,
            spec,
            "<stdin>",
            sys.stdin.buffer,
            fmt=args.format,
            max_prompt_bytes=args.max_prompt_bytes,
            progress=True,
            window=args.window,
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
                max_prompt_bytes=args.max_prompt_bytes,
                progress=True,
                window=args.window,
            )
    print(
        f"job {report.job}: {report.total} prompts queued "
        f"({report.added} new, {report.already_queued} already queued)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    raise SystemExit(run("swarm-enqueue", _main(args)))
