"""swarm-queue's client side: the producer, the collector, the operator commands, and the
Python API (:class:`Swarm`, :func:`scatter_gather`, the reduce specs), imported lazily so the
command-line tools start without loading the drain engine."""

from __future__ import annotations

from typing import Any

__all__ = [
    "Concat",
    "JsonMerge",
    "Stats",
    "Step",
    "Swarm",
    "SyncSwarm",
    "TreeReduce",
    "UserReduce",
    "Vote",
    "gather_prompts",
    "scatter_gather",
]

# Where each public name lives (the rest: producer.api).
_SYNC = frozenset({"SyncSwarm", "gather_prompts"})


def __getattr__(name: str) -> Any:
    if name in _SYNC:
        from producer import sync

        return getattr(sync, name)
    if name in __all__:
        from producer import api

        return getattr(api, name)
    raise AttributeError(f"module 'producer' has no attribute {name!r}")
