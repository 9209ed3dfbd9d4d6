"""Agents: each input a conversation, each turn a job (``job:s1``...), its tools asked of the
tool runners. The agent jobs (:mod:`.spec`), the flow that takes each turn on (:mod:`.flow`,
what it keeps of an agent in :mod:`.state`, its tool calls in :mod:`.toolcalls`, a cancelled
job's agents ended in :mod:`.end`), and one line per agent written (:mod:`.output`)."""
