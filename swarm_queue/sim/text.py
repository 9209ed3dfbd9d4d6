"""The simulator's deterministic "model": output text is a pure function of prompt and max_tokens.

Tests and benchmarks import :func:`completion_for` to check every result the system returns.
One word is one token; a prompt is ``ceil(chars / 4)`` tokens, a rough stand-in for a tokenizer.
An embedding (:func:`embedding_for`) is a pure function of the text too, built so that texts
sharing most of their words lie close (cosine near 1) and unrelated texts do not: clustering
tests have known answers.
"""

from __future__ import annotations

import math
import re
import zlib

__all__ = [
    "EMBED_DIMS",
    "completion_for",
    "count_tokens",
    "embedding_for",
    "natural_length",
    "sample_for",
    "token_ids",
]

# The simulator's embedding size (small real models have 384 to 1024).
EMBED_DIMS = 64

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
]

MIN_LEN = 8
MAX_LEN = 32


def count_tokens(text: str) -> int:
    """Prompt tokens as the simulator counts them."""
    return max(1, -(-len(text) // 4))


def token_ids(text: str, count: int | None = None) -> list[int]:
    """Stand-in token ids of ``text`` (what vLLM's ``return_token_ids`` answers): a prompt's
    :func:`count_tokens` of them, or ``count`` (an answer's tokens); only their number means
    anything."""
    n = count_tokens(text) if count is None else count
    seed = _digest(text)
    return [(seed + 7919 * i) % 32000 for i in range(n)]


def _digest(prompt: str) -> int:
    return zlib.crc32(prompt.encode("utf-8"))


def natural_length(prompt: str) -> int:
    """Tokens the model "wants" to generate for ``prompt`` (MIN_LEN..MAX_LEN), before max_tokens."""
    return MIN_LEN + _digest(prompt) % (MAX_LEN - MIN_LEN + 1)


def completion_for(
    prompt: str, max_tokens: int, *, ignore_eos: bool = False
) -> tuple[str, int, str]:
    """``(text, completion_tokens, finish_reason)`` the simulator answers for ``prompt``;
    with ``ignore_eos`` (vLLM's sampling option) exactly ``max_tokens`` tokens.

    The first word carries the prompt's CRC32 so a result returned under the wrong index shows.
    """
    h = _digest(prompt)
    natural = max_tokens + 1 if ignore_eos else MIN_LEN + h % (MAX_LEN - MIN_LEN + 1)
    n = min(natural, max_tokens)
    words = [f"<{h:08x}>"] + [_WORDS[(h + 7 * i) % len(_WORDS)] for i in range(1, n)]
    return " " + " ".join(words[:n]), n, "length" if natural > max_tokens else "stop"


_TOKEN = re.compile(r"\w+")


def embedding_for(text: str, dims: int = EMBED_DIMS) -> list[float]:
    """The simulator's embedding of ``text``: each word (lower-cased) hashed to one of ``dims``
    axes with a sign, summed, normalised to length 1. Texts with the same words embed the
    same; one word in ten changed still leaves a cosine near 0.9. A text with no word gets a
    fixed unit vector."""
    vec = [0.0] * dims
    for word in _TOKEN.findall(text.lower()):
        h = zlib.crc32(word.encode("utf-8"))
        vec[h % dims] += 1.0 if (h >> 16) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    if norm == 0:
        return [1.0] + [0.0] * (dims - 1)
    return [x / norm for x in vec]


def sample_for(
    prompt: str, max_tokens: int, j: int, *, ignore_eos: bool = False
) -> tuple[str, int, str]:
    """Sample ``j`` of a sampled request (vLLM's ``n``): sample 0 is :func:`completion_for`'s
    answer, each later one one of two others, chosen by the prompt and ``j``: so a prompt's
    samples agree in part, and a majority and an entropy have known values."""
    if j == 0:
        return completion_for(prompt, max_tokens, ignore_eos=ignore_eos)
    variant = 1 + (_digest(prompt) + j) % 2
    return completion_for(f"{prompt}\x00{variant}", max_tokens, ignore_eos=ignore_eos)
