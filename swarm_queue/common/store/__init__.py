"""All of swarm-queue's Redis traffic, in one package with one error boundary.

Layout of one job (keys from :class:`common.keys.Keys`, all in the job's hash slot):

* stream ``q``: one entry per prompt, entry ID ``0-(index+1)``, field ``d`` = msgpack
  :class:`~common.models.PromptItem`; or, for a job of ``chunk`` K > 1, one entry per K
  consecutive prompts (ID its first's, ``d`` the chunk: see ``entries``); the hash
  ``chunks`` holds the size of one that holds fewer, until it is acknowledged. Explicit IDs
  make enqueueing idempotent: a rerun resumes after the stream's last generated ID. A
  commit trims the stream's acknowledged head (up to the oldest entry still in a worker's
  hands) every 512 results and once the job is finished (``TRIM_EVERY``), so it holds the
  work not yet done and what was finished after that oldest entry or since the last trim;
  what is left to do is read from the consumer group (``lua/backlog.lua``) and the
  counters, never from the stream's length.
* hash ``results``: decimal index -> msgpack :class:`~common.models.Result`; first write wins.
* hash ``meta``: the fields of :class:`common.vocab.Meta` (spec, counters, timestamps).
* hash ``running``: entry ID -> runs started and never finished (see ``JobStore.start``);
  a count left behind is a worker that died running the entry. An entry pending with none
  counts one, its read's: a read writes 0 only for what it hands on (``lua/lib/streams.lua``).

Rooms: ``connection`` (client, retry, the error boundary), ``scripts`` and ``lua/`` (the atomic
steps), ``entries`` (entry IDs and payloads), and the parts of :class:`JobStore`:
``registry``, ``feeding``, ``delivery``, ``lanes``, ``results``, ``stages``, ``steps``,
``blackboards``, ``tools``, ``outcomes``, ``status``, ``projects``.
"""

from swarm_queue.common.store.base import Memory
from swarm_queue.common.store.boundary import redis_errors
from swarm_queue.common.store.connection import (
    NO_CLIENT_SETINFO,
    RETRY_ON,
    cluster_node_of,
    connect,
    primary_of_slot,
    redis_retry,
)
from swarm_queue.common.store.delivery import RELEASED_IDLE_MS, Commit
from swarm_queue.common.store.entries import decode_entry, index_of, requeued
from swarm_queue.common.store.feeding import producer_token
from swarm_queue.common.store.jobstore import JobStore
from swarm_queue.common.store.lanes import Hungry
from swarm_queue.common.store.outcomes import OutcomeCounts
from swarm_queue.common.store.roles import CollectorStore, FlowStore, ProducerStore, WorkerStore
from swarm_queue.common.store.status import JobStatus
from swarm_queue.common.store.toolstreams import ToolCall

__all__ = [
    "NO_CLIENT_SETINFO",
    "RELEASED_IDLE_MS",
    "RETRY_ON",
    "CollectorStore",
    "Commit",
    "FlowStore",
    "Hungry",
    "JobStatus",
    "JobStore",
    "Memory",
    "OutcomeCounts",
    "ProducerStore",
    "ToolCall",
    "WorkerStore",
    "cluster_node_of",
    "connect",
    "decode_entry",
    "index_of",
    "primary_of_slot",
    "producer_token",
    "redis_errors",
    "redis_retry",
    "requeued",
]
