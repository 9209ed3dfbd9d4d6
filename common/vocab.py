"""The words swarm-queue writes into Redis and output files besides key names (those are
:mod:`common.keys`'): here, why a prompt failed."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RETRYABLE_KINDS", "FailureKind"]


class FailureKind(StrEnum):
    """Why a prompt failed: a result's ``error_kind``, counted per kind in the job's meta
    (``failed:<kind>``) and what ``swarm-retry --kind`` selects."""

    REJECTED = "rejected"  # the server refused it (HTTP 400: over the context, bad values)
    NO_CHOICE = "no_choice"  # the server never returned a choice for it
    SCHEMA = "schema"  # answered, but not matching the job's --schema (its text kept)
    DEAD_LETTER = "dead_letter"  # workers kept dying while running it
    CANCELLED = "cancelled"  # swarm-cancel
    BAD_ENTRY = "bad_entry"  # its stream entry or stored result could not be read
    MISSING = "missing"  # no result in Redis any more (collected with --evict)


# The kinds swarm-retry can queue again: every failure that kept its original entry.
RETRYABLE_KINDS = tuple(k for k in FailureKind if k is not FailureKind.MISSING)
