"""Pipelines: a job's answers fed into its next step's prompts (``job:s1``, ``job:s2``...) as
each is committed. The steps as jobs (:mod:`.spec`), the flow that moves answers on
(:mod:`.flow`), and one chain per input written (:mod:`.output`)."""
