"""Blackboard rounds: roles answering in rounds over a board kept in Redis (:mod:`.blackboard`)."""
