"""Workflows above the queue, one folder each: each turns a user's workflow into jobs and, as
a flow (:mod:`flows.flow`), turns each committed answer into the next unit of work; the
queue, the store's jobs and the drain engine stay what they are.

* :mod:`flows.flow`: the seam every flow is built on; :mod:`flows.registry`: the flows every
  worker runs, and each one's output (a :class:`common.output.JobOutput`);
* :mod:`flows.pipeline`: steps, each step's answers queued into the next as each is
  committed, a chain per input written;
* :mod:`flows.agents`: agents, a turn a job, their tools asked of the tool runners, an
  agent's end written;
* :mod:`flows.bestof`: best-of-N with a judge, every candidate judged as it is answered;
* :mod:`flows.reduce`: a job's reduce, an aggregate or a tree of supervisor prompts;
* :mod:`flows.rounds`: rounds of roles on a shared board;
* :mod:`flows.steps`: a workflow's later steps, as the commands speak of them.

This package builds on :mod:`common` alone: the workers run its flows, the commands
(:mod:`producer`) queue its jobs and write its output.
"""
