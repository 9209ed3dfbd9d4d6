"""The worker's side of the response cache (:mod:`common.cache`): a batch's prompts whose
answers are kept are answered from the cache before any request, and the endpoint's answers
to the rest are kept after their commit. The cache only saves work: when Redis cannot serve
it, every prompt goes to the endpoint as if it were empty."""

from __future__ import annotations

import logging

import msgspec

from common.cache import answer_key, decode_answer, encode_answer
from common.errors import StoreUnavailable
from common.models import JobSpec, Result
from common.settings import Settings
from common.store import JobStore
from worker.deliveries import Decoded, Finished

__all__ = ["AnswerCache"]

log = logging.getLogger("swarm.worker")


class AnswerCache:
    """Looks a batch up in the cache and keeps new answers, for one endpoint's drainer."""

    def __init__(self, store: JobStore, settings: Settings, label: str) -> None:
        self.store = store
        self.ttl_s = settings.cache_ttl_s
        self.max_answers = settings.cache_max_answers
        self.label = label

    async def answered(
        self, spec: JobSpec, items: list[Decoded]
    ) -> tuple[list[Finished], list[Decoded]]:
        """``(hits, rest)``: the results of the prompts the cache answers, as the commit takes
        them, and the prompts still to send."""
        keys = [answer_key(spec, item) for _, _, item in items]
        wanted = [k for k in keys if k is not None]
        if not wanted:
            return [], items
        try:
            found = dict(zip(wanted, await self.store.cache_get(wanted, self.ttl_s), strict=True))
        except StoreUnavailable as exc:
            log.warning("%s: response cache not read (%s): asking the endpoint", self.label, exc)
            return [], items
        hits: list[Finished] = []
        rest: list[Decoded] = []
        for (eid, payload, item), key in zip(items, keys, strict=True):
            blob = found.get(key) if key is not None else None
            try:
                answer = decode_answer(blob) if blob is not None else None
            except msgspec.DecodeError:  # not an answer of ours: asked again, and replaced
                answer = None
            if answer is None:
                rest.append((eid, payload, item))
            else:
                hits.append((eid, answer.result(item), payload))
        return hits, rest

    async def keep(self, spec: JobSpec, items: list[Decoded], results: list[Result]) -> None:
        """Keep the answers in ``results`` (to ``items``, in order) that may be cached:
        successes only, never a failure."""
        answers = []
        for (_, _, item), r in zip(items, results, strict=True):
            if r.ok and not r.cached and (key := answer_key(spec, item)) is not None:
                answers.append((key, encode_answer(r)))
        if not answers:
            return
        try:
            await self.store.cache_put(answers, self.ttl_s, self.max_answers)
        except StoreUnavailable as exc:
            log.warning(
                "%s: %d answers not kept in the response cache (%s)", self.label, len(answers), exc
            )
