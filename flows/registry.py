"""The flows every worker runs beside its drain loops, in the order each round runs them. A
new workflow is a room of its own in flows/ with its line here; nothing in worker/ names
it."""

from __future__ import annotations

from swarm_queue.flows.agentflow import AgentFlow
from swarm_queue.flows.flow import Flow
from swarm_queue.flows.pipelineflow import PipelineFlow

__all__ = ["FLOWS"]

FLOWS: tuple[type[Flow], ...] = (PipelineFlow, AgentFlow)
