"""Best-of-N with a judge: N candidates a prompt, each judged as it is answered, the best
written with every candidate beside it (:mod:`.flow`)."""
