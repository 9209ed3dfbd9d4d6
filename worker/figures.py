"""What one drain loop counts for ``swarm-status``: prompts finished per job, and the recent
rate, sampled at each publish."""

from __future__ import annotations

from collections import deque

__all__ = ["RATE_SPAN_S", "JobCount"]


# The span (s) over which the published per-endpoint rate is measured.
RATE_SPAN_S = 10.0


class JobCount:
    """One drainer's prompts finished for one job, with recent samples for a rate."""

    __slots__ = ("done", "failed", "samples")

    def __init__(self, start: float) -> None:
        self.done = 0
        self.failed = 0
        self.samples: deque[tuple[float, int]] = deque([(start, 0)])

    def rate(self, now: float) -> float:
        """Prompts per second over the last :data:`RATE_SPAN_S` (sampled at each publish)."""
        self.samples.append((now, self.done + self.failed))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_SPAN_S:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
