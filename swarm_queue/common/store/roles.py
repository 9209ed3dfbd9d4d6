"""The job store's operations by the role of who uses them: each process (or part of one) is
given the store as its role, and sees what it uses; :class:`common.store.JobStore` is all of
them at once (and what an operator's command needs besides). A role is the parts it uses, as
one class: no operation is declared twice.

* :class:`ProducerStore`: a job created and its prompts queued (``swarm-enqueue``, the API),
  over its shards (:class:`common.store.sharded.Sharded`, as collectors and operators see it);
* :class:`WorkerStore`: the drain path: work read, reclaimed, committed; the response cache;
  the figures published; projects' caps kept;
* :class:`FlowStore`: a flow: answers landed taken and moved on into the next job, which it
  feeds and seals; a workflow's inputs between their steps; tool calls; blackboards; the
  reduce's stages;
* :class:`CollectorStore`: results read in order, evicted, their outcomes and reduce output.
"""

from __future__ import annotations

from swarm_queue.common.store.blackboards import Blackboards
from swarm_queue.common.store.cache import ResponseCache
from swarm_queue.common.store.delivery import Delivery
from swarm_queue.common.store.lanes import Lanes
from swarm_queue.common.store.outcomes import Outcomes
from swarm_queue.common.store.projects import Projects
from swarm_queue.common.store.registry import Registry
from swarm_queue.common.store.results import Results
from swarm_queue.common.store.sharded import Sharded
from swarm_queue.common.store.stages import Stages
from swarm_queue.common.store.status import Status
from swarm_queue.common.store.steps import StepMap, Steps
from swarm_queue.common.store.toolstreams import Tools

__all__ = ["CollectorStore", "FlowStore", "ProducerStore", "WorkerStore"]


class ProducerStore(Sharded):
    """What a producer does with a job: create it, queue its prompts, seal it."""


class WorkerStore(Registry, Delivery, Lanes, Status, ResponseCache, Projects):
    """What the drain path does: take work, run it, commit it; publish."""


class FlowStore(ProducerStore, Results, Steps, Tools, Blackboards, Stages, Outcomes):
    """What a flow does: take what landed, move it on into the job it feeds, seal that job;
    keep a workflow's inputs between their steps; ask tools; keep blackboards; take a
    reduce a step (read a stage's results, queue the next, write the output)."""


class CollectorStore(Sharded, StepMap, Stages, Outcomes):
    """What a collector does: read results in input order (a workflow's through its steps, its
    inputs' outcomes, the reduce's output), evict what it wrote."""
