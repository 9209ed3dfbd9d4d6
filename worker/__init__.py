"""swarm-queue workers: one drain loop per inference endpoint, run under arq.

Start with ``arq worker.WorkerSettings`` (add ``--burst`` to exit when no job has work left).
``WorkerSettings`` is loaded lazily so that importing ``worker.engine`` reads no environment.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WorkerSettings"]


def __getattr__(name: str) -> Any:
    if name == "WorkerSettings":
        from worker.app import WorkerSettings

        return WorkerSettings
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
