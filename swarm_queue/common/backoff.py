"""Capped exponential backoff with jitter, as a pure function."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["backoff_s"]


def backoff_s(
    attempt: int,
    *,
    base_s: float = 0.5,
    cap_s: float = 30.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    "Equal jitter": half of the capped exponential delay is fixed, half is random, so retries
    from many workers spread out but never collapse to zero delay against a struggling server.
    ``rand`` returns a float in [0, 1); pass a fixed one in tests.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if base_s <= 0 or cap_s < base_s:
        raise ValueError(f"need 0 < base_s <= cap_s, got base_s={base_s}, cap_s={cap_s}")
    # min() before the power would overflow for very large attempt counts.
    delay = cap_s if attempt >= 64 else min(cap_s, base_s * (2.0**attempt))
    return delay / 2.0 + rand() * delay / 2.0
