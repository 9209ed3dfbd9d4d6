"""The reduce: what is made of a job's answers once they are all in (an aggregate, or a tree
of supervisor prompts level by level), taken a step at a time by the workers' flows
(:mod:`flows.reduce.flow`), each step by :class:`flows.reduce.reducer.Reducer`."""
