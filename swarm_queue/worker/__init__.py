"""swarm-queue workers: one drain loop per inference endpoint, run under arq.

Start with ``swarm-worker`` or ``arq swarm_queue.worker.WorkerSettings`` (add ``--burst`` to
exit when no job has work left). ``WorkerSettings`` is built when arq reads it, from the
environment of that moment: importing any worker module reads no environment.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WorkerSettings"]


def __getattr__(name: str) -> Any:
    if name == "WorkerSettings":
        from swarm_queue.worker.app import load_worker_settings

        return load_worker_settings()
    raise AttributeError(f"module 'swarm_queue.worker' has no attribute {name!r}")
