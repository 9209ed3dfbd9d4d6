"""Each prompt's own usage when several shared a request: vLLM reports a list's total only.

Completions carry their choices' token ids (asked for with ``return_token_ids``); embeddings
carry nothing per input, so each text is counted by the server's ``/tokenize`` and the counts
kept only when they add up to the request's total. Where a count cannot be had it is None,
written as null: never a guessed 0 that reads as a count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from swarm_queue.common.models import Usage
from swarm_queue.worker.backend import Backend
from swarm_queue.worker.replies import Choice, CompletionUsage

__all__ = ["EmbeddingCounts", "choices_usage"]


def choices_usage(choices: Sequence[Choice]) -> Usage | None:
    """A prompt's usage from its choices' token ids (its prompt's once, every sample's
    answer), where the server gave them; else None."""
    prompt = next((c.prompt_token_ids for c in choices if c.prompt_token_ids is not None), None)
    if prompt is None or any(c.token_ids is None for c in choices):
        return None
    return Usage(len(prompt), sum(len(c.token_ids or ()) for c in choices))


class EmbeddingCounts:
    """Counts one endpoint's embedding inputs with its ``/tokenize``; after one unanswered
    count (a server without the route) it asks no more, and usage stays unknown."""

    def __init__(self, client: Backend) -> None:
        self.client = client
        self.works = True

    async def usage(
        self,
        model: str,
        groups: Sequence[Sequence[str]],
        total: CompletionUsage | None,
        timeout_s: float,
    ) -> list[Usage | None]:
        """Each group's (an item's texts') prompt tokens, from one request whose usage was
        ``total``: exact from ``total`` for a single group, else counted text by text."""
        if total is not None and len(groups) == 1:
            return [Usage(total.prompt_tokens, 0)]
        flat = [t for group in groups for t in group]
        unknown: list[Usage | None] = [None] * len(groups)
        if not self.works or not flat:
            return unknown
        counts = await asyncio.gather(
            *(self.client.tokenize(t, model, timeout_s=timeout_s) for t in flat)
        )
        known = [c for c in counts if c is not None]
        if len(known) < len(counts):
            self.works = False
            return unknown
        if total is not None and sum(known) != total.prompt_tokens:
            return unknown  # counted otherwise than the request (its special tokens, say)
        out: list[Usage | None] = []
        at = 0
        for group in groups:
            out.append(Usage(sum(known[at : at + len(group)]), 0))
            at += len(group)
        return out
