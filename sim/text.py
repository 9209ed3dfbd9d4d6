"""The simulator's deterministic "model": output text is a pure function of prompt and max_tokens.

Tests and benchmarks import :func:`completion_for` to check every result the system returns.
One word is one token; a prompt is ``ceil(chars / 4)`` tokens, a rough stand-in for a tokenizer.
"""

from __future__ import annotations

import zlib

__all__ = ["completion_for", "count_tokens", "natural_length"]

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
