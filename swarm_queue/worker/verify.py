"""What an endpoint's answer must be to be used: choice indices each of the list's at most
once, the choices a request asked for, vectors of one finite length. A server that breaks one
is malformed (:class:`EndpointMalformed`): its answer is retried, never committed. And how
an answer is used: each choice mapped to its prompt by its index, never its position."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from swarm_queue.common.errors import EndpointMalformed
from swarm_queue.common.models import PromptItem, Result
from swarm_queue.worker.replies import CompletionBody
from swarm_queue.worker.usage import choices_usage

__all__ = [
    "EMBEDDINGS",
    "answered_whole",
    "check_choice_indices",
    "check_vectors",
    "map_choices",
    "missing_choices",
]

# The route of a vectors' answer, as an EndpointMalformed names it.
EMBEDDINGS = "embeddings"


def check_choice_indices(
    endpoint: str, indices: list[int], n: int, route: str = "", samples: int = 1
) -> None:
    """Refuse (:class:`EndpointMalformed`: another try, or another endpoint) an answer of
    ``n`` choices (``samples`` a prompt) whose indices are not distinct values in
    ``0..n-1``: a server that repeats or shifts them would put one prompt's answer under
    another's index. Fewer is allowed here (the ones left out are asked again; see
    :func:`missing_choices`)."""
    seen: set[int] = set()
    for i in indices:
        if not 0 <= i < n or i in seen:
            raise EndpointMalformed(
                endpoint,
                f"malformed answer: choice index {i} for {n} choices (each of 0..{n - 1} "
                "expected at most once)",
                route=route,
                samples=samples,
            )
        seen.add(i)


def missing_choices(
    endpoint: str, got: int, n: int, samples: int = 1, *, answered: int = 0
) -> EndpointMalformed | None:
    """The endpoint's failure when an answer of ``n`` choices (``samples`` a prompt) held
    ``got``: its answers are used, the ones left out asked again. ``answered``: the prompts
    it answered whole; with some, the fault may be the prompts left out (``partial``)."""
    if got >= n:
        return None
    why = f"malformed answer: {n - got} of {n} choices missing"
    return EndpointMalformed(endpoint, why, samples=samples, partial=answered > 0)


def answered_whole(indices: Iterable[int], sizes: Sequence[int]) -> int:
    """How many prompts have all their choices among ``indices``, each prompt's choices (or
    vectors) ``sizes[i]`` consecutive ones in order."""
    present, at, whole = set(indices), 0, 0
    for size in sizes:
        whole += all(at + j in present for j in range(size))
        at += size
    return whole


def map_choices(
    endpoint: str, items: list[PromptItem], body: CompletionBody, attempts: int, n: int
) -> list[Result | None]:
    """One result per item, matched by ``choice.index`` (never by position), its ``n``
    samples at ``i * n .. i * n + n - 1``; None where the server left out any (indices
    already checked by :func:`check_choice_indices`)."""
    by_index = {c.index: c for c in body.choices}
    exact_usage = len(items) == 1 and body.usage is not None
    # (token ids only where a server sent them: the per-prompt work is skipped otherwise)
    with_ids = not exact_usage and bool(body.choices) and body.choices[0].token_ids is not None
    out: list[Result | None] = []
    for i, item in enumerate(items):
        picked = [by_index.get(i * n + j) for j in range(n)]
        if any(c is None for c in picked):
            out.append(None)
            continue
        choice = picked[0]
        assert choice is not None
        usage = None
        if exact_usage and body.usage is not None:
            usage = body.usage.usage()
        elif with_ids:
            usage = choices_usage([c for c in picked if c is not None])
        out.append(
            Result(
                index=item.index,
                text=choice.text,
                finish_reason=choice.finish_reason,
                usage=usage,
                endpoint=endpoint,
                attempts=attempts,
                custom_id=item.custom_id,
                model=body.model,
                samples=[c.text for c in picked if c is not None] if n > 1 else None,
                finishes=[c.finish_reason for c in picked if c is not None] if n > 1 else None,
                fingerprint=body.system_fingerprint,
            )
        )
    return out


def check_vectors(
    endpoint: str, vectors: Sequence[Sequence[float | None]], dim: int | None
) -> None:
    """Refuse (:class:`EndpointMalformed`) vectors of different lengths, of another length
    than the job's ``dim`` (fixed by its first answer), or with a value that is not finite."""
    lengths = {len(v) for v in vectors}
    if dim is not None:
        lengths.add(dim)
    if len(lengths) > 1:
        want = f" (the job's vectors have {dim})" if dim is not None else ""
        raise EndpointMalformed(
            endpoint,
            f"malformed answer: vectors of {', '.join(map(str, sorted(lengths)))} dimensions"
            + want,
            route=EMBEDDINGS,
        )
    for v in vectors:
        # A sum of finite float32 values is finite; a NaN or an inf anywhere makes it not,
        # and a null (NaN as some write it) makes it no number at all.
        try:
            total = math.fsum(v)  # type: ignore[arg-type]
        except (TypeError, OverflowError, ValueError):
            total = math.nan
        if not math.isfinite(total):
            raise EndpointMalformed(
                endpoint, "malformed answer: a vector holds NaN or inf", route=EMBEDDINGS
            )
