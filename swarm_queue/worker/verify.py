"""What an endpoint's answer must be to be used: choice indices each of the list's at most
once, the choices a request asked for, vectors of one finite length. A server that breaks one
is malformed (:class:`EndpointMalformed`): its answer is retried, never committed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarm_queue.common.errors import EndpointMalformed

__all__ = ["EMBEDDINGS", "check_choice_indices", "check_vectors", "missing_choices"]

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


def missing_choices(endpoint: str, got: int, n: int, samples: int = 1) -> EndpointMalformed | None:
    """The endpoint's failure when an answer of ``n`` choices (``samples`` a prompt) held
    ``got``: its answers are used, the ones left out asked again, but it counts against the
    endpoint."""
    if got >= n:
        return None
    why = f"malformed answer: {n - got} of {n} choices missing"
    return EndpointMalformed(endpoint, why, samples=samples)


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
