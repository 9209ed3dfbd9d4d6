"""A workflow the product has never seen, as a new one is written: one folder, its flow on the
seam of :mod:`swarm_queue.flows.flow`, registered by one line (see test_new_workflow.py)."""
