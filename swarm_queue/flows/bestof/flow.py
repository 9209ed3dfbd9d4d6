"""Best-of-N with a judge: each prompt answered N times (vLLM's ``n``, sampled, one request),
each candidate judged by a judge model (a score parsed from its answer), and the best kept as
the input's answer, every candidate with its score beside it.

Two jobs, as a pipeline has steps: ``job`` samples the candidates; its flow (:class:`BestOfFlow`)
queues each candidate, the moment the prompt's answer is committed, into the judge step
(``job:s1``) as the judge's template with ``{answer}`` (the candidate) and ``{prompt}`` (the
input's) filled in. Nothing waits for a step to end, nothing is lost when a worker dies (the
pipeline's moves: exactly once, see :mod:`flows.pipeline.flow`), and the lines are written as
the judgements come in (:class:`BestOfOutput`): every collector makes the same choice, since
the scores are parsed from what Redis holds.

A score is the number in the judge's last ``[[...]]`` when its answer has one (MT-Bench's
convention: ask for it; the last, since a judge may quote the candidate's own ``[[10]]`` before
its verdict), else the first number in the answer; a number of over 15 digits is none. The
highest wins, the first candidate of equal ones. A candidate whose judgement failed or holds
no number is unscored, and said why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.keys import step_name
from swarm_queue.common.models import FlowRef, JobSpec, PromptItem, Result, result_or_failure
from swarm_queue.common.output import Column, JobOutput
from swarm_queue.common.store import CollectorStore
from swarm_queue.common.store.steps import Move
from swarm_queue.flows.pipeline.flow import PipelineFlow
from swarm_queue.flows.pipeline.spec import fill

__all__ = [
    "KIND",
    "MAX_CANDIDATES",
    "BestLine",
    "BestOf",
    "BestOfFlow",
    "BestOfOutput",
    "Candidate",
    "best_of_of",
    "build_best_of",
    "score_of",
]

# The name the flow goes by (the first job's FlowRef.kind).
KIND = "best_of"
# vLLM takes any n; past this many candidates a judge per candidate is rarely what is meant.
MAX_CANDIDATES = 64


class BestOf(msgspec.Struct, frozen=True, kw_only=True):
    """The first job's flow settings: ``n`` candidates a prompt, each judged in job ``judge``
    as ``template`` with ``{answer}`` and ``{prompt}`` filled in."""

    judge: str
    template: str
    n: int


def best_of_of(spec: JobSpec) -> BestOf | None:
    """The best-of settings of ``spec``, when it is a best-of job's first step."""
    if spec.flow is None or spec.flow.kind != KIND:
        return None
    return msgspec.convert(spec.flow.settings, BestOf)


_NAMED = re.compile(r"\{([A-Za-z_]\w*)\}")


def build_best_of(
    job: str,
    options: JobOptions,
    n: int,
    judge: str,
    *,
    judge_model: str | None = None,
    source: str,
) -> tuple[list[JobSpec], list[str]]:
    """The specs of best-of job ``job`` (its candidates, then its judge step) and the warnings
    to show; :class:`ConfigError` for settings that cannot work. The judge step answers
    greedily (temperature 0) with ``judge_model`` (default: the job's), as chat when the job
    is, its template the job's."""
    if not 2 <= n <= MAX_CANDIDATES:
        raise ConfigError(f"--best-of takes 2 to {MAX_CANDIDATES} candidates, got {n}")
    if "{answer}" not in judge:
        raise ConfigError("the judge's template has no {answer} (the candidate) to fill in")
    unknown = sorted({m for m in _NAMED.findall(judge) if m not in ("answer", "prompt")})
    if unknown:
        raise ConfigError(
            f"the judge's template names {', '.join('{' + u + '}' for u in unknown)}: only "
            "{answer} (a candidate) and {prompt} (the input's) are filled in"
        )
    if options.samples not in (1, n):
        raise ConfigError(f"--best-of {n} samples {n} candidates: drop --samples {options.samples}")
    if options.per_prompt is not None or options.embed or options.reduce is not None:
        raise ConfigError(
            "--best-of keeps one candidate a prompt: not with --per-prompt, --embed or --reduce"
        )
    first, warnings = build_spec(
        job, msgspec.structs.replace(options, samples=n), source=source, step=True
    )
    judging = JobOptions(
        model=judge_model if judge_model is not None else options.model,
        max_tokens=options.max_tokens,
        temperature=0,
        chat=options.chat,
        template=options.template,
        priority=options.priority,
    )
    try:
        judge_spec, said = build_spec(job, judging, source=f"judge of {job}", step=True)
    except ConfigError as exc:
        raise ConfigError(f"the judge: {exc}") from None
    judge_spec = msgspec.structs.replace(judge_spec, job=step_name(job, 1))
    settings = BestOf(judge=judge_spec.job, template=judge, n=n)
    first = msgspec.structs.replace(
        first, flow=FlowRef(kind=KIND, settings=msgspec.to_builtins(settings))
    )
    return [first, judge_spec], warnings + [f"the judge: {w}" for w in said]


_BRACKETED = re.compile(r"\[\[(.*?)\]\]", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# More digits than a float holds: no judge's score, only a way to win every comparison.
_MAX_DIGITS = 15


def score_of(answer: str) -> float | None:
    """The score in a judge's ``answer``: the number in its last ``[[...]]`` if it has one
    (None if that holds no plain number: ``[[1e308]]``, ``[[inf]]``), else its first number;
    None if it has none, or one of over 15 digits."""
    verdicts = _BRACKETED.findall(answer)
    found = _NUMBER.fullmatch(verdicts[-1].strip()) if verdicts else _NUMBER.search(answer)
    if found is None or sum(c.isdigit() for c in found.group(0)) > _MAX_DIGITS:
        return None
    return float(found.group(0))


def _settings(spec: JobSpec) -> BestOf:
    settings = best_of_of(spec)
    assert settings is not None, spec.job
    return settings


def _candidates(result: Result) -> list[str]:
    if result.samples:
        return list(result.samples)
    return [result.text] if result.text is not None else []


class Candidate(msgspec.Struct, frozen=True, omit_defaults=True):
    """One candidate: its text, its score, the judge's answer, or why it is unscored."""

    text: str
    score: float | None = None
    judge: str | None = None
    error: str | None = None


class BestLine(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """One input of a best-of job: ``text`` the best candidate (``best`` its number, from 0,
    ``score`` its score), every candidate beside it; else ``error`` says why none is."""

    index: int
    custom_id: str | msgspec.UnsetType = msgspec.UNSET
    text: str | None = None
    best: int | None = None
    score: float | None = None
    candidates: list[Candidate] = msgspec.field(default_factory=list)
    model: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Input:
    """One input while its candidates are judged."""

    def __init__(self, first: Result, n: int) -> None:
        self.first = first
        self.candidates = _candidates(first) if first.ok else []
        # Each candidate's judgement (a result), or why it has none (a reason).
        self.judged: dict[int, Result | str] = {}
        if first.ok:
            for k in range(len(self.candidates), n):
                self.judged[k] = f"the answer had {len(self.candidates)} candidates"
        self.n = n

    def ended(self) -> bool:
        return not self.first.ok or len(self.judged) >= self.n

    def line(self) -> BestLine:
        first = self.first
        custom_id = first.custom_id if first.custom_id is not None else msgspec.UNSET
        if not first.ok:
            return BestLine(first.index, custom_id, error=f"the prompt failed: {first.error}")
        candidates = [self._candidate(k, text) for k, text in enumerate(self.candidates)]
        scored = [(c.score, -k) for k, c in enumerate(candidates) if c.score is not None]
        if not scored:
            why = next((c.error for c in candidates if c.error), "no candidate")
            return BestLine(
                first.index, custom_id, candidates=candidates, model=first.model,
                error=f"no candidate was scored ({why})",
            )  # fmt: skip
        score, minus_k = max(scored)
        return BestLine(
            first.index,
            custom_id,
            text=candidates[-minus_k].text,
            best=-minus_k,
            score=score,
            candidates=candidates,
            model=first.model,
        )

    def _candidate(self, k: int, text: str) -> Candidate:
        judged = self.judged.get(k)
        if isinstance(judged, str):
            return Candidate(text, error=f"not judged: {judged}")
        if judged is None or not judged.ok:
            why = judged.error if judged is not None else "no judgement"
            return Candidate(text, error=f"the judge failed: {why}")
        answer = judged.text or ""
        score = score_of(answer)
        if score is None:
            return Candidate(text, judge=answer, error="the judge's answer holds no score")
        return Candidate(text, score=score, judge=answer)


class BestOfOutput(JobOutput[_Input]):
    """A best-of job's lines: one per input, once every candidate is judged."""

    what = "best-of"

    def __init__(self, steps: Sequence[JobSpec]) -> None:
        super().__init__(steps)
        self.settings = _settings(self.steps[0])

    @staticmethod
    def later(spec: JobSpec) -> list[str]:
        return [_settings(spec).judge]

    def start(self, first: Result) -> _Input:
        return _Input(first, self.settings.n)

    async def advance(self, store: CollectorStore, items: list[_Input]) -> None:
        n, judge = self.settings.n, self.settings.judge
        wanted = [(x, k) for x in items if not x.ended() for k in range(n) if k not in x.judged]
        keys = [x.first.index * n + k for x, k in wanted]
        at = await store.step_indices(judge, keys)
        placed = [(x, k, i) for (x, k), i in zip(wanted, at, strict=True) if i is not None]
        raws = await store.results_at(judge, [i for _, _, i in placed])
        for (x, k, i), raw in zip(placed, raws, strict=True):
            if raw is not None:
                x.judged[k] = result_or_failure(i, raw)
        lost = [(x, k) for (x, k), i in zip(wanted, at, strict=True) if i is None]
        reasons = await store.drop_reasons(judge, [x.first.index * n + k for x, k in lost])
        for (x, k), why in zip(lost, reasons, strict=True):
            if why is not None:
                x.judged[k] = why

    def ended(self, item: _Input) -> bool:
        return item.ended()

    def line(self, item: _Input) -> BestLine:
        return item.line()

    def columns(self) -> list[Column]:
        own = [
            Column("index", int),
            Column("custom_id", str),
            Column("text", str),
            Column("best", int),
            Column("score", float),
            Column("model", str),
            Column("error", str),
        ]
        for k in range(self.settings.n):
            own += [
                Column(f"c{k}_text", str),
                Column(f"c{k}_score", float),
                Column(f"c{k}_judge", str),
                Column(f"c{k}_error", str),
            ]
        return own

    def cells(self, line: Any) -> list[Any]:
        assert isinstance(line, BestLine)
        cells: list[Any] = [
            line.index,
            line.custom_id if line.custom_id is not msgspec.UNSET else None,
            line.text,
            line.best,
            line.score,
            line.model or None,
            line.error,
        ]
        for k in range(self.settings.n):
            c = line.candidates[k] if k < len(line.candidates) else None
            cells += [None] * 4 if c is None else [c.text, c.score, c.judge, c.error]
        return cells


class BestOfFlow(PipelineFlow):
    """Moves each best-of job's answers into its judge step, one item per candidate (input
    ``i``'s candidate ``k`` under key ``i * n + k``: all of an input's move at once)."""

    name = KIND
    output = BestOfOutput

    def target(self, source: JobSpec) -> str | None:
        settings = best_of_of(source)
        return settings.judge if settings is not None else None

    def key(self, source: JobSpec, origin: int) -> int:
        return origin * self.settings_of(source, BestOf).n

    def runs(self, name: str, spec: JobSpec) -> bool:
        return True  # no function of the user's to run

    def moves(
        self, source: JobSpec, item: PromptItem, result: Result | None, index: int
    ) -> list[Move]:
        settings = self.settings_of(source, BestOf)
        origin = item.origin if item.origin is not None else item.index
        keys = [origin * settings.n + k for k in range(settings.n)]
        if result is None or not result.ok:
            why = "its answer was not in Redis any more (collected with --evict?)"
            if result is not None:
                why = f"the prompt failed: {result.error}"
            return [Move(key, reason=why) for key in keys]
        candidates = _candidates(result)
        root = item.root if item.root is not None else item.prompt
        moves: list[Move] = []
        for k, key in enumerate(keys):
            if k >= len(candidates):
                moves.append(Move(key, reason=f"the answer had {len(candidates)} candidates"))
                continue
            judged = PromptItem(
                index=index + sum(1 for m in moves if m.item is not None),
                prompt=fill(settings.template, candidates[k], root),
                custom_id=item.custom_id,
                origin=origin,
                root=root,
            )
            moves.append(Move(key, item=judged))
        return moves
