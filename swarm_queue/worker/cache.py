"""The worker's side of the response cache (:mod:`common.cache`): a batch's prompts whose
answers are kept are answered from the cache before any request, and the endpoint's answers
to the rest are kept after their commit. A job with ``cache_refresh``, and a prompt queued again
by ``swarm-retry``, is never answered from the cache: it is asked again and its answer replaces
the kept one. The cache only saves work: when Redis cannot serve it, every prompt goes to the
endpoint as if it were empty."""

from __future__ import annotations

import logging

import msgspec

from swarm_queue.common.cache import answer_key, cacheable, decode_answer, encode_answer
from swarm_queue.common.errors import BadRecordError, StoreRefused, StoreUnavailable
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import WorkerStore, requeued
from swarm_queue.worker.deliveries import Decoded, Finished

__all__ = ["AnswerCache"]

log = logging.getLogger("swarm.worker")

# What the cache may meet in Redis: an outage or a full Redis, or its keys holding another
# tool's values. Either way the prompts go to the endpoint, as if nothing were cached.
_CACHE_TROUBLE = (StoreUnavailable, BadRecordError, StoreRefused)


class AnswerCache:
    """Looks a batch up in the cache and keeps new answers, for one endpoint's drainer."""

    def __init__(self, store: WorkerStore, settings: Settings, label: str) -> None:
        self.store = store
        self.ttl_s = settings.cache_ttl_s
        self.max_answers = settings.cache_max_answers
        self.label = label

    async def answered(
        self, spec: JobSpec, items: list[Decoded]
    ) -> tuple[list[Finished], list[Decoded], list[str | None]]:
        """``(hits, rest, keys)``: the results of the prompts the cache answers, as the commit
        takes them; the prompts still to send; and their answers' keys, for :meth:`keep`
        (None: not to be cached)."""
        keys = [answer_key(spec, item) for _, _, item in items]
        wanted = [
            k
            for (eid, _, _), k in zip(items, keys, strict=True)
            if k is not None and not spec.cache_refresh and not requeued(eid)
        ]
        if not wanted:
            return [], items, keys
        try:
            found = dict(zip(wanted, await self.store.cache_get(wanted, self.ttl_s), strict=True))
        except _CACHE_TROUBLE as exc:
            self._trouble(f"response cache not read ({exc}): asking the endpoint", exc)
            return [], items, keys
        hits: list[Finished] = []
        rest: list[Decoded] = []
        rest_keys: list[str | None] = []
        for (eid, payload, item), key in zip(items, keys, strict=True):
            blob = found.get(key) if key is not None and not requeued(eid) else None
            try:
                answer = decode_answer(blob) if blob is not None else None
            except msgspec.DecodeError:  # not an answer of ours: asked again, and replaced
                answer = None
            if answer is None:
                rest.append((eid, payload, item))
                rest_keys.append(key)
            else:
                hits.append((eid, answer.result(item), payload))
        return hits, rest, rest_keys

    async def keep(self, keys: list[str | None], results: list[Result]) -> None:
        """Keep the answers in ``results`` under ``keys`` (in order, from :meth:`answered`)
        where they may be cached (see :func:`common.cache.cacheable`), replacing what was kept,
        stamped with Redis's time."""
        kept = [
            (key, r)
            for key, r in zip(keys, results, strict=True)
            if key is not None and cacheable(r)
        ]
        if not kept:
            return
        try:
            now = await self.store.server_time()
            answers = [(key, encode_answer(r, now)) for key, r in kept]
            await self.store.cache_put(answers, self.ttl_s, self.max_answers)
        except _CACHE_TROUBLE as exc:
            self._trouble(f"{len(kept)} answers not kept in the response cache ({exc})", exc)

    def _trouble(self, what: str, exc: Exception) -> None:
        """Say what the cache could not do: each time for an outage, once for a bad key (it
        stays bad until someone deletes it, and every batch would say so again)."""
        if isinstance(exc, BadRecordError):
            self.store.warn_once("the response cache", f"{self.label}: {exc}")
        else:
            log.warning("%s: %s", self.label, what)
