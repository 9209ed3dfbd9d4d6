"""A prompt's own usage when several shared a request: vLLM reports a list's total only,
unless a choice carries its token ids (``return_token_ids``, asked only for a job with
``line_usage``: it costs a third of the throughput at large batches). Where a count cannot be
had it is None, written as null: never a guessed 0 that reads as a count.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm_queue.common.models import Usage
from swarm_queue.worker.replies import Choice

__all__ = ["choices_usage"]


def choices_usage(choices: Sequence[Choice]) -> Usage | None:
    """A prompt's usage from its choices' token ids (its prompt's once, every sample's
    answer), where the server gave them; else None."""
    prompt = next((c.prompt_token_ids for c in choices if c.prompt_token_ids is not None), None)
    if prompt is None or any(c.token_ids is None for c in choices):
        return None
    return Usage(len(prompt), sum(len(c.token_ids or ()) for c in choices))
