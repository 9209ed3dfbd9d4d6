"""The workers' side: taking entries (new, own leftovers, orphans), marking them running,
heartbeats and releases, and the atomic commit of their results.

Every write carries the generation of the job the work was taken from (``JobSpec.generation``):
a job deleted, or lost, and queued again under its name refuses it with :class:`JobGoneError`."""

from __future__ import annotations

import contextlib
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from swarm_queue.common.errors import JobGoneError
from swarm_queue.common.keys import GROUP
from swarm_queue.common.models import Result, Usage, encode
from swarm_queue.common.store.base import StoreBase
from swarm_queue.common.store.boundary import redis_errors, replies
from swarm_queue.common.store.entries import deaths, id_key, index_of, requeued
from swarm_queue.common.store.resultfields import pack_chunk
from swarm_queue.common.vocab import Meta

__all__ = ["RELEASED_IDLE_MS", "Commit", "Delivery"]

# What "released" entries are marked idle for: longer than any sane claim_idle_ms.
RELEASED_IDLE_MS = 10**10


class Strikes(NamedTuple):
    """An entry's give-backs so far: by how many endpoints (consumers, each counted once),
    how many times in all, and the requests that carried it to them."""

    endpoints: int
    times: int
    tries: int


# (entry_id, payload, deaths): an entry taken by a worker, with how often workers died running it.
Taken = tuple[bytes, bytes | None, int]


class Commit(msgspec.Struct, frozen=True):
    """What one commit changed: new results written (duplicates of a redelivery are not counted)."""

    done: int
    failed: int
    # The new failures by kind (common.vocab.FailureKind values).
    failed_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    # Of ``done``, the answers that came from the response cache.
    cache_hits: int = 0
    # A read riding with the commit (``commit(read=...)``): the new entries it took, each
    # ID, payload and affinity key.
    taken: list[tuple[bytes, bytes | None, str]] = msgspec.field(default_factory=list)

    @property
    def marked(self) -> frozenset[bytes]:
        """The entries ``taken`` that run now (as :meth:`Delivery.take_new`'s): all but an
        affinity key's; the commit was of their generation."""
        return frozenset(eid for eid, _, key in self.taken if not key)


class Delivery(StoreBase):
    """A job's entries through the consumer group, from read to acknowledged result."""

    async def read_new(
        self, job: str, consumer: str, count: int, block_ms: int | None = None
    ) -> list[tuple[bytes, bytes | None]]:
        """Up to ``count`` never-delivered entries for ``consumer``: ``(entry_id, payload)``.

        ``block_ms`` None returns at once; otherwise waits up to that long for new entries.
        """
        return [(e, p) for e, p, _ in await self.read_keyed(job, consumer, count, block_ms)]

    async def read_keyed(
        self, job: str, consumer: str, count: int, block_ms: int | None = None
    ) -> list[tuple[bytes, bytes | None, str]]:
        """Up to ``count`` never-delivered entries for ``consumer`` (``block_ms`` None
        returns at once, else waits up to that long for some), each with its affinity key ("" for
        none: see :mod:`common.affinity`)."""
        async with redis_errors(self.url, job):
            return _read(await self._read_new(self.redis, job, consumer, count, block_ms))

    def _read_new(
        self, on: Any, job: str, consumer: str, count: int, block_ms: int | None = None
    ) -> Any:
        """``consumer``'s read of ``job``'s new entries, sent ``on`` the client or queued on a
        pipeline: the one read of new entries, whoever makes it (:func:`_read` reads it)."""
        stream = {self.keys.stream(job): ">"}
        return on.xreadgroup(GROUP, consumer, stream, count=count, block=block_ms)

    async def take_new(
        self, job: str, consumer: str, count: int, *, gen: str
    ) -> tuple[list[tuple[bytes, bytes | None, str]], set[bytes]]:
        """As :meth:`read_keyed` without waiting, with the job's generation read in the same
        round trip: the entries, and those running at once as :meth:`start` would run them
        (all but an affinity key's, which run from their start where they run). Nothing is
        written: an entry pending with no mark counts as running once (see
        :func:`~common.store.entries.deaths`). A job of another generation than ``gen`` (queued
        again under its name) has what the read took handed back at once, no death counted,
        and is :class:`JobGoneError`, as a stream gone under the reader is."""
        async with redis_errors(self.url, job):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(self.keys.meta(job), Meta.GENERATION)
                self._read_new(pipe, job, consumer, count)
                have, read = replies(await pipe.execute(raise_on_error=False))
            for reply in (have, read):
                if isinstance(reply, Exception):
                    raise reply
            taken = _read(read)
            if have is None or have.decode() != gen:
                await self._hand_back(job, consumer, taken)
                raise JobGoneError(job)
        return taken, {eid for eid, _, key in taken if not key}

    async def claim_own_pending(
        self,
        job: str,
        consumer: str,
        count: int,
        after: bytes = b"-",
        exclude: Container[bytes] = (),
    ) -> tuple[list[Taken], bytes | None]:
        """Re-deliver to ``consumer`` its own unacknowledged entries (a restarted worker's
        leftovers, or entries whose read reply was lost), and the last ID looked at (None when
        done). ``exclude``: entries this consumer is still working on."""
        stream = self.keys.stream(job)
        start = after if after == b"-" else b"(" + after
        async with redis_errors(self.url, job):
            pending = await self.redis.xpending_range(stream, GROUP, start, "+", count, consumer)
            if not pending:
                return [], None
            ids = [p["message_id"] for p in pending if p["message_id"] not in exclude]
            claimed = await self.redis.xclaim(stream, GROUP, consumer, 0, ids) if ids else []
            entries = await self._with_deaths(job, claimed)
        return entries, pending[-1]["message_id"]

    async def autoclaim(self, job: str, consumer: str, min_idle_ms: int, count: int) -> list[Taken]:
        """Take over up to ``count`` entries idle for ``min_idle_ms`` in any consumer's hands
        (released, or orphaned by a dead worker)."""
        stream = self.keys.stream(job)
        async with redis_errors(self.url, job):
            reply = await self.redis.xautoclaim(
                stream, GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            )
            return await self._with_deaths(job, reply[1])

    async def _with_deaths(
        self, job: str, claimed: list[tuple[bytes, dict[bytes, bytes] | None]]
    ) -> list[Taken]:
        """Claimed entries with their death counts (called inside a redis_errors block)."""
        if not claimed:
            return []
        marks = await self.redis.hmget(self.keys.running(job), [eid for eid, _ in claimed])
        return [
            (eid, f.get(b"d") if f else None, deaths(mark))
            for (eid, f), mark in zip(claimed, marks, strict=True)
        ]

    async def copies(
        self, job: str, consumer: str, count: int, *, gen: str, min_idle_ms: int = 0
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``count`` entries other consumers hold, to run again as speculative copies
        (see ``lua/copy.lua``): only at the job's tail, only entries in their hands for at
        least ``min_idle_ms``, each entry once. Nothing is claimed."""
        keys = [self.keys.stream(job), self.keys.copies(job), self.keys.meta(job)]
        args = [GROUP, consumer, count, gen, min_idle_ms]
        async with redis_errors(self.url, job):
            flat = await self.scripts.copy(keys=keys, args=args)
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

    async def start(self, job: str, deaths: Mapping[bytes, int], *, gen: str) -> None:
        """Mark entries as running: a mark is taken back by their commit or release, so a mark
        still there when the entry is taken again is a worker that died running it (an entry
        with none counts one, its read's: :func:`~common.store.entries.deaths`). ``deaths``
        are the marks found when the entries were taken (0 for a first delivery): the taker
        owns them now, so each is written plus one, with no read. Refused with
        :class:`JobGoneError` before anything is sent if the job is not of generation ``gen``."""
        if deaths:
            marks = [x for eid, n in deaths.items() for x in (eid, n + 1)]
            keys = [self.keys.running(job), self.keys.meta(job)]
            async with redis_errors(self.url, job):
                await self.scripts.start(keys=keys, args=[gen, *marks])

    async def touch(self, job: str, consumer: str, entry_ids: Sequence[bytes], *, gen: str) -> int:
        """Reset the idle time of entries this consumer still owns, so none takes them as
        orphaned; returns how many it still owns."""
        return await self._claim_own(job, consumer, entry_ids, "", gen)

    async def release(
        self,
        job: str,
        consumer: str,
        entry_ids: Sequence[bytes],
        *,
        gen: str,
        strike: bool = False,
        lost: bool = False,
        tries: int = 0,
    ) -> int:
        """Hand entries back at once: mark the ones still ours long idle, so any worker's
        reclaim takes them without waiting for the claim idle time. ``strike``: given back
        because this endpoint's answers could not be used (see :meth:`strikes`), after
        ``tries`` requests that carried each of them. ``lost``:
        their request was lost in the server (it hung or died under it): their running marks
        stay, counted as a death (see :meth:`start`)."""
        idle = str(RELEASED_IDLE_MS)
        return await self._claim_own(
            job, consumer, entry_ids, idle, gen, strike=strike, lost=lost, tries=tries
        )

    async def answered(self, job: str, indices: Sequence[int]) -> set[int]:
        """Those of ``indices`` that have a result, or had one collected and evicted (a chunk
        taken again skips them)."""
        if not indices:
            return set()
        async with redis_errors(self.url, job):
            evicted = int(await self.redis.hget(self.keys.meta(job), Meta.EVICTED) or 0)
        have = await self.result_blobs(job, indices)
        return {i for i, h in zip(indices, have, strict=True) if h is not None or i < evicted}

    async def chunk_sizes(self, job: str, entry_ids: Sequence[bytes], chunk: int) -> list[int]:
        """How many prompts each entry of a job of ``chunk`` (``JobSpec.chunk``) holds: as
        the chunks hash says, else ``chunk`` (one if swarm-retry queued it: see lua/add.lua)."""
        if not entry_ids:
            return []
        async with redis_errors(self.url, job):
            sizes = await self.redis.hmget(self.keys.chunks(job), list(entry_ids))
        return [
            int(n) if n else 1 if requeued(eid) else chunk
            for eid, n in zip(entry_ids, sizes, strict=True)
        ]

    async def job_dim(self, job: str) -> int | None:
        """An embeddings job's dimension, once its first answer has fixed it."""
        async with redis_errors(self.url, job):
            raw = await self.redis.hget(self.keys.meta(job), Meta.DIM)
        return int(raw) if raw is not None else None

    async def fix_dim(self, job: str, dim: int, *, gen: str) -> int:
        """Fix ``job``'s dimension at ``dim`` unless an answer has fixed it already; returns
        the job's dimension. :class:`JobGoneError` for work of another generation."""
        async with redis_errors(self.url, job):
            return int(await self.scripts.dim(keys=[self.keys.meta(job)], args=[gen, dim]))

    async def strikes(self, job: str, entry_ids: Sequence[bytes]) -> list[Strikes]:
        """What each entry's give-backs so far add up to (see :class:`Strikes`)."""
        if not entry_ids:
            return []
        fields = [f for eid in entry_ids for f in (eid, eid + b"|n", eid + b"|t")]
        async with redis_errors(self.url, job):
            raw = await self.redis.hmget(self.keys.strikes(job), fields)
        counts = [int(x or 0) for x in raw]
        return [Strikes(*counts[i : i + 3]) for i in range(0, len(counts), 3)]

    async def _claim_own(
        self,
        job: str,
        consumer: str,
        entry_ids: Sequence[bytes],
        idle: str,
        gen: str,
        *,
        strike: bool = False,
        lost: bool = False,
        tries: int = 0,
    ) -> int:
        if not entry_ids:
            return 0
        ids = sorted(entry_ids, key=id_key)
        keys = [self.keys.stream(job), self.keys.running(job), self.keys.meta(job)]
        if strike:
            keys.append(self.keys.strikes(job))
        async with redis_errors(self.url, job):
            return int(
                await self.scripts.claim_mine(
                    keys=keys, args=[GROUP, consumer, idle, gen, "1" if lost else "", tries, *ids]
                )
            )

    async def commit(
        self,
        job: str,
        entries: Iterable[tuple[bytes, Result, bytes | None]],
        rest: Usage | None = None,
        *,
        gen: str,
        moves_on: bool = False,
        failures_move: bool = False,
        whole: Sequence[bytes] = (),
        chunk: int = 1,
        read: tuple[str, int] | None = None,
    ) -> Commit:
        """Write each result under its index (first write wins) and ack its entry, atomically.

        ``entries`` are ``(entry_id, result, original payload)``; the payload of a failure, or of
        an answer from the response cache, is kept so that ``swarm-retry`` can queue the prompt
        again. ``moves_on``: the job is a pipeline step, each new answer is appended to its
        ``landed`` stream with its entry, in the same step. Work of another generation of the
        job than ``gen`` is refused whole with :class:`JobGoneError`. ``failures_move`` (an
        agent's turn): each new failure is appended too, for its pump to end the agent with.
        Tokens count as results do: each result's own usage once it is written (so a copy
        that lost counts nothing), and ``rest``, those of the batch's requests that no result
        carries. ``whole``: chunks taken again whose every prompt had its result already,
        acknowledged with nothing written. ``chunk``: the job's (``JobSpec.chunk``); a whole
        chunk on its block whose every prompt was answered goes as its chunk's field.
        ``read``: a consumer and a count: that consumer's next read of the job's new
        entries, as :meth:`take_new`'s, made in the same call (``Commit.taken``).
        """
        # (lua/commit.lua's arguments: two a prompt, index and result, grouped by entry and
        # numbered in that order, but for a whole chunk answered: one, its field
        # (store/resultfields.py); each entry's ID and count; the few prompts that carry
        # more, apart.)
        by_entry: dict[bytes, list[tuple[Result, bytes | None]]] = {}
        indices: set[int] = set()
        for entry_id, result, payload in entries:
            if result.index not in indices:  # (the first of a prompt's results is written)
                indices.add(result.index)
                by_entry.setdefault(entry_id, []).append((result, payload))
        heads: list[Any] = [len(by_entry)]
        prompts: list[Any] = []
        extras: list[Any] = []
        own: list[str] = []
        totals = [0, 0, 0, 0]
        for entry_id, held in by_entry.items():
            held.sort(key=lambda rp: rp[0].index)  # (a whole chunk's field is in index order)
            blobs = [encode(result) for result, _ in held]
            if _packs(entry_id, held, chunk, moves_on):
                heads += [entry_id, len(held), pack_chunk(blobs)]
            else:
                heads += [entry_id, len(held), ""]
                for (result, _), blob in zip(held, blobs, strict=True):
                    prompts += [result.index, blob]
            for result, payload in held:
                kind = result.error_kind or "error" if not result.ok else "+" * result.cached
                if moves_on or kind:
                    extras += [len(own) + 1, kind, payload or b""]
                # Its own tokens count once, when it is written (a cached answer cost nothing).
                if result.usage is not None and not result.cached:
                    counts = result.usage.counts()
                    totals = [t + c for t, c in zip(totals, counts, strict=True)]
                    own.append(" ".join(map(str, counts)))
                else:
                    own.append("")
        args: list[Any] = [GROUP, gen, "1" if failures_move else "", len(own)]
        args += [*(rest.counts() if rest else (0, 0, 0, 0)), *totals]
        args += [",".join(own) if any(own) else "", len(whole), len(extras) // 3, *whole]
        args += extras + heads + prompts
        keys = self.script_keys(job)
        if moves_on:
            keys.append(self.keys.landed(job))
        taken: list[tuple[bytes, bytes | None, str]] = []
        async with redis_errors(self.url, job):
            if read is None:
                done, failed, hits, _, *kinds = await self.scripts.commit(keys=keys, args=args)
            else:
                reply, taken = await self._commit_reading(job, keys, args, *read)
                done, failed, hits, _, *kinds = reply
        by_kind = {_text(k): int(n) for k, n in zip(kinds[::2], kinds[1::2], strict=True)}
        return Commit(int(done), int(failed), by_kind, int(hits), taken)

    async def _commit_reading(
        self, job: str, keys: list[str], args: list[Any], consumer: str, count: int
    ) -> tuple[list[Any], list[tuple[bytes, bytes | None, str]]]:
        """The commit, and the consumer's next read sent right after it in the same round trip:
        a plain XREADGROUP, its entries never carried through Lua (a fifth of what a commit
        carrying it cost Redis at the default batch). A commit refused as of another
        generation (the job queued again under its name) hands what the read took back to
        the fleet at once, no death counted; a stream gone (NOGROUP) read nothing."""
        reply, (read,) = await self.scripts.commit.pipelined(
            keys, args, lambda pipe: self._read_new(pipe, job, consumer, count)
        )
        taken = [] if isinstance(read, Exception) else _read(read)
        if isinstance(reply, Exception):
            await self._hand_back(job, consumer, taken)
            raise reply
        return reply, taken

    async def _hand_back(
        self, job: str, consumer: str, taken: list[tuple[bytes, bytes | None, str]]
    ) -> None:
        """Entries a read took for a generation of ``job`` that is not the reader's: given back
        under the generation the job has now (none to give back to: the job is gone)."""
        if not taken:
            return
        gen = await self.redis.hget(self.keys.meta(job), Meta.GENERATION)
        if gen is not None:
            ids = [eid for eid, _, _ in taken]
            with contextlib.suppress(JobGoneError):
                await self.release(job, consumer, ids, gen=gen.decode())


def _read(reply: Any) -> list[tuple[bytes, bytes | None, str]]:
    """An XREADGROUP's reply of one stream: each entry's ID, payload and affinity key."""
    if not reply:
        return []
    return [
        (eid, f.get(b"d"), (f.get(b"a") or b"").decode())
        for eid, f in ((eid, fields or {}) for eid, fields in reply[0][1])
    ]


def _packs(
    entry_id: bytes, held: list[tuple[Result, bytes | None]], chunk: int, moves_on: bool
) -> bool:
    """Whether an entry's results go as its chunk's field: a producer's whole chunk on its
    block (indices ``first .. first+chunk-1``, sorted), every prompt answered by an endpoint,
    of a job whose answers do not move on."""
    if chunk < 2 or moves_on or len(held) != chunk or not entry_id.startswith(b"0-"):
        return False
    first = index_of(entry_id)
    return (
        first % chunk == 0
        and held[0][0].index == first
        and held[-1][0].index == first + chunk - 1
        and all(r.ok and not r.cached for r, _ in held)
    )


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
