"""Token counts: a batch's totals across retries and bisection (:class:`Tally`), and a
prompt's own usage when several shared a request: vLLM reports a list's total only,
unless a choice carries its token ids (``return_token_ids``, asked only for a job with
``line_usage``: it costs a third of the throughput at large batches). Where a count cannot be
had it is None, written as null: never a guessed 0 that reads as a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from swarm_queue.common.models import Result, Usage
from swarm_queue.worker.replies import Choice, CompletionUsage

__all__ = ["Tally", "choices_usage"]


class Tally:
    """Token totals of one batch, across retries and bisection: prompt, completion, and of
    them cached and reasoning (where the engine reports them, else 0)."""

    __slots__ = ("_tokens",)

    def __init__(self) -> None:
        self._tokens = [0, 0, 0, 0]

    def add(self, usage: CompletionUsage) -> None:
        for i, n in enumerate(usage.usage().counts()):
            self._tokens[i] += n

    def take(self, results: Iterable[Result]) -> None:
        """Take off what the results carry as their own usage (counted with them): the rest,
        a list answered with its total only, is what no result says."""
        for r in results:
            if r.usage is not None and not r.cached:
                for i, n in enumerate(r.usage.counts()):
                    self._tokens[i] = max(0, self._tokens[i] - n)

    @property
    def rest(self) -> Usage:
        """What no result carries, as one usage."""
        return Usage(*self._tokens)


def choices_usage(choices: Sequence[Choice]) -> Usage | None:
    """A prompt's usage from its choices' token ids (its prompt's once, every sample's
    answer), where the server gave them; else None."""
    prompt = next((c.prompt_token_ids for c in choices if c.prompt_token_ids is not None), None)
    if prompt is None or any(c.token_ids is None for c in choices):
        return None
    return Usage(len(prompt), sum(len(c.token_ids or ()) for c in choices))
