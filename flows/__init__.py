"""Workflows above the queue: each a room of its own that turns a user's workflow into jobs
and moves work between them as it is committed; the queue, the store's jobs and the drain
engine stay what they are.

* :mod:`flows.pipeline`: steps, each step's answers queued into the next as each is committed
  (the specs, the templates, the filters);
* :mod:`flows.pump`: what moves them, run by every worker.

This package builds on :mod:`common` alone: the workers run its pump, the commands
(:mod:`producer`) queue its jobs and write its output (a pipeline's: ``producer/chains.py``).
"""
