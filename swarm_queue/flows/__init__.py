"""Workflows above the queue: each turns a user's workflow into jobs and, as a flow
(:mod:`flows.flow`), turns each committed answer into the next unit of work; the queue, the
store's jobs and the drain engine stay what they are.

* :mod:`flows.flow`: the seam every flow is built on; :mod:`flows.registry`: the flows every
  worker runs; :mod:`flows.output`: how a flow's jobs are written, one line per input;
* :mod:`flows.pipeline` and :mod:`flows.pipelineflow`: steps, each step's answers queued into
  the next as each is committed;
* :mod:`flows.agents` and :mod:`flows.agentflow`: agents, a turn a job, their tools asked of
  the tool runners (:mod:`flows.toolcalls`);
* :mod:`flows.bestof`: best-of-N with a judge, every candidate judged as it is answered;
* :mod:`flows.rounds`: rounds of roles on a shared board;
* :mod:`flows.steps`: a workflow's later steps, as the commands speak of them.

This package builds on :mod:`common` alone: the workers run its flows, the commands
(:mod:`producer`) queue its jobs and write its output.
"""
