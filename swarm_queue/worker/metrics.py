"""What a worker reports as it works, for Prometheus (see :mod:`worker.prometheus`).

The drain loops call these hooks on every commit, batch and request. :class:`Metrics` itself
does nothing, so a worker without ``SWARM_METRICS_PORT`` pays one empty call per event and
never imports ``prometheus_client``.
"""

from __future__ import annotations

from typing import Literal

from swarm_queue.common.store import Commit

__all__ = ["NO_METRICS", "Metrics", "RequestOutcome"]

# How a request ended: answered, failed in a way worth retrying, refused (a bad prompt), or
# unusable (a wrong key, a model not served).
RequestOutcome = Literal["ok", "retryable", "rejected", "unusable"]


class Metrics:
    """The hooks; this base records nothing."""

    def committed(self, job: str, endpoint: str, commit: Commit) -> None:
        """Results of ``job`` committed from ``endpoint`` (new ones only)."""

    def batch(self, job: str, endpoint: str, prompts: int) -> None:
        """A batch of ``prompts`` of ``job`` starts on ``endpoint``."""

    def request(self, job: str, endpoint: str, seconds: float, outcome: RequestOutcome) -> None:
        """A generation request ended after ``seconds``."""

    def retry(self, job: str, endpoint: str) -> None:
        """A failed request of ``job`` will be sent again to ``endpoint``."""


NO_METRICS = Metrics()
