"""The tool runner (``swarm-tools``): a drain loop over each tool's stream of calls whose
"endpoint" is a Python function the operator's ``SWARM_TOOLS`` allows (:mod:`.runner`), with
the limits a tool declares kept across runners (:mod:`.limits`). Builds on :mod:`common`
alone; the agents' flow asks for calls, the runners answer them."""
