"""The flows every worker runs beside its drain loops, in the order each round runs them, and
how the commands find a job's flow. A new workflow is a room of its own in flows/ with its line
here; nothing in worker/ names it."""

from __future__ import annotations

from typing import Any

from swarm_queue.common.keys import group_of
from swarm_queue.common.models import JobSpec
from swarm_queue.common.output import JobOutput
from swarm_queue.flows.agents.flow import AgentFlow
from swarm_queue.flows.bestof.flow import BestOfFlow
from swarm_queue.flows.flow import Flow
from swarm_queue.flows.pipeline.flow import PipelineFlow
from swarm_queue.flows.reduce.flow import ReduceFlow

__all__ = ["FLOWS", "output_of"]

FLOWS: tuple[type[Flow], ...] = (PipelineFlow, AgentFlow, BestOfFlow, ReduceFlow)


def output_of(spec: JobSpec) -> type[JobOutput[Any]] | None:
    """How the job of ``spec`` (a workflow's first step) is written, when its flow writes its
    own lines (see :mod:`common.output`); None for any other job (a plain job's)."""
    if spec.flow is None or group_of(spec.job)[1]:
        return None
    return next((f.output for f in FLOWS if f.name == spec.flow.kind), None)
