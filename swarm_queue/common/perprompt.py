"""What a job makes of each prompt's several samples (``--samples K --per-prompt KIND``), by
name: the per-prompt reduces. Each is a function of one prompt's samples (and, for the
uncertainty measures, of their embeddings, asked of an embeddings model of the fleet); its
value goes into the prompt's result, and its ``answer`` is the result's text: what a next
pipeline step's ``{answer}`` receives.

* ``vote``: self-consistency, the majority answer (normalised as the job-level vote does) and
  its share;
* ``semantic-entropy``: the samples' embeddings clustered by cosine similarity (average
  linkage, merged while the mean similarity between two clusters is at least ``similarity``),
  and the entropy, in nats, of the cluster sizes;
* ``kernel-entropy``: the von Neumann entropy, in nats, of the samples' cosine kernel
  normalised to unit trace (kernel language entropy).

numpy is needed by the two uncertainty measures only, and imported there.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.reduce import normalise
from swarm_queue.common.vectors import pack_vector
from swarm_queue.common.vocab import FailureKind

__all__ = [
    "KERNEL_ENTROPY",
    "PER_PROMPT_KINDS",
    "SEMANTIC_ENTROPY",
    "VOTE",
    "PerPromptKind",
    "answered",
    "cluster",
    "embedded",
    "kernel_entropy",
    "semantic_entropy",
    "value_fields",
    "vote",
]

VOTE = "vote"
SEMANTIC_ENTROPY = "semantic-entropy"
KERNEL_ENTROPY = "kernel-entropy"


def vote(samples: Sequence[str], **_: Any) -> dict[str, Any]:
    """The majority answer of ``samples`` (as first written), its votes and share; a tie goes
    to the answer sampled first."""
    forms = [normalise(s) for s in samples]
    counts = Counter(forms)
    winner = min(counts, key=lambda f: (-counts[f], forms.index(f)))
    return {
        "answer": samples[forms.index(winner)],
        "votes": counts[winner],
        "share": counts[winner] / len(samples),
        "distinct": len(counts),
    }


def _unit_rows(vectors: Sequence[Sequence[float]]) -> Any:
    import numpy as np

    x = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def cluster(vectors: Sequence[Sequence[float]], similarity: float) -> list[list[int]]:
    """Agglomerative clustering with average linkage on cosine similarity: the two clusters
    of highest mean pairwise similarity merge while that mean is at least ``similarity``.
    Clusters in order of their first member."""
    import numpy as np

    if not vectors:
        return []
    x = _unit_rows(vectors)
    sim = x @ x.T
    groups = [[i] for i in range(len(vectors))]
    while len(groups) > 1:
        best, pair = -math.inf, (0, 0)
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                mean = float(np.mean(sim[np.ix_(groups[a], groups[b])]))
                if mean > best:
                    best, pair = mean, (a, b)
        if best < similarity:
            break
        a, b = pair
        groups[a] = sorted(groups[a] + groups[b])
        del groups[b]
    return sorted(groups, key=lambda g: g[0])


def _entropy(sizes: Sequence[int]) -> float:
    total = sum(sizes)
    return -sum(n / total * math.log(n / total) for n in sizes if n)


def semantic_entropy(
    samples: Sequence[str], vectors: Sequence[Sequence[float]], similarity: float = 0.9, **_: Any
) -> dict[str, Any]:
    """Semantic entropy of one prompt's samples: their clusters of meaning, the entropy of the
    cluster sizes, and the answer: the first sample of the largest cluster."""
    groups = cluster(vectors, similarity)
    largest = min(groups, key=lambda g: (-len(g), g[0]))
    return {
        "answer": samples[largest[0]],
        "entropy": _entropy([len(g) for g in groups]),
        "clusters": groups,
        "share": len(largest) / len(samples),
    }


def kernel_entropy(
    samples: Sequence[str], vectors: Sequence[Sequence[float]], **_: Any
) -> dict[str, Any]:
    """Kernel language entropy of one prompt's samples: the von Neumann entropy
    ``-sum(l * log l)`` over the eigenvalues ``l`` of their cosine kernel divided by its trace;
    the answer: the sample most similar to the others."""
    import numpy as np

    x = _unit_rows(vectors)
    kernel = x @ x.T
    eigen = np.linalg.eigvalsh(kernel / np.trace(kernel))
    eigen = eigen[eigen > 1e-12]  # 0 log 0 is 0; numerical dust below zero is dropped
    central = int(np.argmax(kernel.sum(axis=1)))
    return {
        "answer": samples[central],
        "entropy": float(-np.sum(eigen * np.log(eigen))),
    }


@dataclass(frozen=True)
class PerPromptKind:
    """One per-prompt reduce: its help line, its function, and whether it needs the samples'
    embeddings (asked of an embeddings model of the fleet)."""

    help: str
    fn: Callable[..., dict[str, Any]]
    embeddings: bool = False


PER_PROMPT_KINDS: dict[str, PerPromptKind] = {
    VOTE: PerPromptKind("self-consistency: the majority answer and its share", vote),
    SEMANTIC_ENTROPY: PerPromptKind(
        "the entropy of the samples' clusters of meaning (embedded, clustered by cosine)",
        semantic_entropy,
        embeddings=True,
    ),
    KERNEL_ENTROPY: PerPromptKind(
        "the von Neumann entropy of the samples' embedding kernel", kernel_entropy, embeddings=True
    ),
}


def answered(spec: JobSpec, result: Result) -> Result:
    """``result`` with its job's per-prompt reduce made of its samples, where that reduce
    needs nothing but them: its value kept, its answer the result's text."""
    per = spec.per_prompt
    if per is None or not result.ok or not result.samples:
        return result
    kind = PER_PROMPT_KINDS[per.kind]
    if kind.embeddings:
        return result
    value = kind.fn(result.samples, similarity=per.similarity)
    return msgspec.structs.replace(result, text=value["answer"], value=value)


def embedded(spec: JobSpec, found: Result, texts: list[str], vectors: list[list[float]]) -> Result:
    """An embeddings answer: its vector; or, in an uncertainty measure's step, what the
    measure makes of a prompt's samples and their vectors (the vectors are not kept)."""
    per = spec.per_prompt
    if per is None:
        return msgspec.structs.replace(found, embedding=pack_vector(vectors[0]))
    try:
        value = PER_PROMPT_KINDS[per.kind].fn(texts, vectors, similarity=per.similarity)
    except ImportError as exc:
        why = f"{per.kind} needs numpy on the workers (pip install 'swarm-queue[uq]'): {exc}"
        return msgspec.structs.replace(found, error=why, error_kind=FailureKind.MEASURE)
    return msgspec.structs.replace(found, text=value["answer"], value=value, samples=texts)


# The scalar fields each measure's value has, and their types: a value's typed columns
# (``value.answer``, ``value.share``...) in CSV and Parquet output, beside its JSON.
VALUE_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {
    VOTE: (("answer", str), ("votes", int), ("share", float), ("distinct", int)),
    SEMANTIC_ENTROPY: (("answer", str), ("entropy", float), ("share", float)),
    KERNEL_ENTROPY: (("answer", str), ("entropy", float)),
}


def value_fields(spec: JobSpec | None) -> tuple[tuple[str, type], ...]:
    """The typed value fields of ``spec``'s per-prompt measure (none without one)."""
    if spec is None or spec.per_prompt is None:
        return ()
    return VALUE_FIELDS.get(spec.per_prompt.kind, ())
