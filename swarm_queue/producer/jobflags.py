"""The flags of a job on ``swarm-enqueue``'s command line: every job setting (the names of
:class:`common.jobspec.JobOptions`, with dashes), the reduce stage, and a pipeline's
``--then`` steps; and how they are read into options (files read, JSON parsed)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from swarm_queue.common.cli import Parser
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.models import ReduceSpec
from swarm_queue.common.perprompt import PER_PROMPT_KINDS
from swarm_queue.common.reducekinds import FUNCTION, REDUCE_KINDS, TREE
from swarm_queue.common.shards import parse_shards
from swarm_queue.flows.pipeline.spec import StepOptions

__all__ = [
    "JOB_FLAGS",
    "add_best_of_args",
    "add_job_settings",
    "add_reduce_args",
    "best_of_from_args",
    "options_from_args",
    "read_text",
    "reduce_from_args",
    "split_steps",
    "step_from_args",
    "step_parser",
]


def add_job_settings(p: argparse.ArgumentParser) -> None:
    """The flags of every job setting (:class:`common.jobspec.JobOptions`), in their group."""
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
        "--samples",
        type=int,
        default=1,
        metavar="K",
        help="answers sampled per prompt (vLLM's n, one request; set --temperature): each "
        "output line carries them all under 'samples'",
    )
    j.add_argument(
        "--per-prompt",
        metavar="KIND",
        help="what to make of each prompt's samples: "
        + "; ".join(f"{name}: {kind.help}" for name, kind in PER_PROMPT_KINDS.items())
        + ". Its answer is the line's text (and a next step's {answer})",
    )
    j.add_argument(
        "--per-prompt-model",
        metavar="MODEL",
        help="the embeddings model of the fleet that the entropy measures embed samples with",
    )
    j.add_argument(
        "--similarity",
        type=float,
        default=0.9,
        help="semantic-entropy: the cosine similarity at which two answers mean the same "
        "(default 0.9)",
    )
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
        "--responses",
        action="store_true",
        help="send each prompt as its own /v1/responses request (OpenAI's Responses API, the "
        "prompt or conversation as its input), answered as --chat is",
    )
    j.add_argument(
        "--embed",
        action="store_true",
        help="embed each prompt (/v1/embeddings, a list of inputs a request, --model an "
        "embedding model) instead of generating: each output line carries its vector",
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
        "--project",
        default="",
        metavar="NAME",
        help="the project the job is for: a project's jobs share one turn of the fleet, "
        "however many it has (default: a turn of its own)",
    )
    j.add_argument(
        "--line-usage",
        action="store_true",
        help="each output line says its prompt's own token counts, even where prompts shared a "
        "request (vLLM counts a list's total only): costs throughput (list completions ask "
        "for token ids, embeddings go one a request); the job's total is exact either way",
    )
    j.add_argument(
        "--chunk",
        type=int,
        default=None,
        metavar="N",
        help="prompts to a stream entry (consecutive ones): read, claimed and acknowledged as "
        "one, so Redis does a fraction of its work a prompt (default 16; a workflow's steps: 1)",
    )
    j.add_argument(
        "--shards",
        type=_shards,
        default=1,
        metavar="K",
        help="spread a plain job over K Redis Cluster slots, each its own stream, results and "
        "counters, so that one job uses K primaries' cores; 'auto': one a primary (default "
        "1; see docs/SCALE.md)",
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


def add_reduce_args(p: argparse.ArgumentParser) -> None:
    """The flags of a job's reduce stage."""
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


def add_best_of_args(p: argparse.ArgumentParser) -> None:
    """The flags of a best-of job (see :mod:`flows.bestof.flow`)."""
    g = p.add_argument_group("best-of-N with a judge")
    g.add_argument(
        "--best-of",
        type=int,
        metavar="N",
        help="sample N candidates a prompt (vLLM's n: set --temperature), judge each with "
        "--judge, keep the best as the line's text, every candidate and its score beside it",
    )
    g.add_argument(
        "--judge",
        metavar="FILE",
        help="the judge's prompt: {answer} (a candidate) and {prompt} (the input's) filled in; "
        "its score is the number in [[...]] in the judge's answer, else its first number",
    )
    g.add_argument(
        "--judge-model", metavar="M", help="the judge's model (default: the job's --model)"
    )


def best_of_from_args(args: argparse.Namespace) -> tuple[int, str, str | None] | None:
    """A best-of job's (N, judge template, judge model) from the flags; None without
    ``--best-of``."""
    if args.best_of is None:
        if args.judge is not None or args.judge_model is not None:
            raise ConfigError("--judge and --judge-model are for a --best-of N job")
        return None
    if args.judge is None:
        raise ConfigError("--best-of N needs --judge FILE: the prompt that scores a candidate")
    return args.best_of, read_text(args.judge, "--judge"), args.judge_model


def step_parser() -> argparse.ArgumentParser:
    """The flags of one ``--then TEMPLATE ...`` step of a pipeline."""
    p = Parser(
        prog="swarm-enqueue ... --then",
        description="One step of a pipeline: its template and its own settings.",
    )
    p.add_argument(
        "step_template",
        metavar="TEMPLATE",
        help="a file: the step's prompt, with {answer} and {prompt}",
    )
    p.add_argument(
        "--keep-if",
        metavar="REGEX",
        help="the gate into this step: only answers of the step before that REGEX matches "
        "(searched anywhere in them) reach it",
    )
    p.add_argument(
        "--keep-fn",
        metavar="package.module:fn",
        help="the gate into this step: only answers of the step before that fn(answer) is "
        "true for reach it (the workers' SWARM_REDUCE_FUNCTIONS must allow it)",
    )
    add_job_settings(p)
    return p


def split_steps(argv: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """``argv`` cut at each ``--then``: the command's own arguments, then each step's (its
    template first)."""
    head: list[str] = []
    steps: list[list[str]] = []
    for arg in argv:
        if arg == "--then" or arg.startswith("--then="):
            steps.append([arg.partition("=")[2]] if "=" in arg else [])
        elif steps:
            steps[-1].append(arg)
        else:
            head.append(arg)
    return head, steps


def step_from_args(args: argparse.Namespace) -> StepOptions:
    """One ``--then`` step's options, its files read."""
    return StepOptions(
        template=read_text(args.step_template, "--then"),
        keep_if=args.keep_if,
        keep_fn=args.keep_fn,
        options=options_from_args(args),
    )


def read_text(path: str, flag: str) -> str:
    """The text of the file given to ``flag``; ConfigError naming both if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc}") from None


def _shards(text: str) -> int:
    """``--shards``: a count or ``auto`` (argparse says what is wrong with anything else)."""
    try:
        return parse_shards(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    template = read_text(path, "--template")
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
    reduce = reduce_from_args(args) if hasattr(args, "reduce_kind") else None
    return JobOptions(**{**fields, "reduce": reduce})


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
        prompt = read_text(args.reduce_prompt, "--reduce-prompt")
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
