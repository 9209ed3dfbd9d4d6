"""swarm-queue: very large batches of LLM prompts, and the workflows built on them, through
a fleet of self-hosted inference servers, durably and in order.

The Python API is here (``from swarm_queue import Swarm``), imported lazily so that the
command-line tools start without loading the drain engine (typed: ``py.typed``, and a type
checker reads the names where they are defined). The rooms below it: ``common``
(wire structs, settings, keys, every Redis operation), ``flows`` (the workflows above the
queue), ``worker`` (the drain path: ``swarm-worker``, ``arq swarm_queue.worker.WorkerSettings``),
``producer`` (the commands and the API), ``sim`` (swarm-sim, a stand-in for vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an editor see; loaded on first use (below)
    from swarm_queue.producer.api import Swarm, scatter_gather
    from swarm_queue.producer.specs import (
        Concat,
        JsonMerge,
        Stats,
        Step,
        TreeReduce,
        UserReduce,
        Vote,
    )
    from swarm_queue.producer.sync import SyncSwarm, gather_prompts

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

# Where each public name lives.
_HOMES = {
    "Swarm": "api",
    "scatter_gather": "api",
    "SyncSwarm": "sync",
    "gather_prompts": "sync",
    **dict.fromkeys(
        ("Concat", "JsonMerge", "Stats", "Step", "TreeReduce", "UserReduce", "Vote"), "specs"
    ),
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"swarm_queue.producer.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'swarm_queue' has no attribute {name!r}")
