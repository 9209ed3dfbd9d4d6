"""Queuing prompts into a job, idempotently: what ``swarm-enqueue``, the Python API and the
reduce stage (a tree level's supervisor prompts) all do.

Each prompt gets its 0-based input index and the stream entry ID ``0-(index+1)``. A rerun after
a crash skips the prompts the stream already holds and queues the rest: no duplicate, no gap;
the job keeps a hash chain of its input, so a rerun with another input is refused. When the
whole input is queued the job is sealed with its total. One writer per job, by a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import sys
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from swarm_queue.common.affinity import Affinities, Levels, levels
from swarm_queue.common.chat import Message
from swarm_queue.common.errors import (
    ConfigError,
    InputError,
    JobCancelledError,
    JobConflictError,
    ProducerBusyError,
    StoreFull,
    SwarmError,
)
from swarm_queue.common.models import JobSpec, PromptItem, SamplingParams, encode
from swarm_queue.common.progress import Progress
from swarm_queue.common.room import Room
from swarm_queue.common.shards import BLOCK_ENTRIES
from swarm_queue.common.store import ProducerStore, producer_token
from swarm_queue.common.vocab import Meta

__all__ = ["CHUNK", "LOCK_TTL_MS", "EnqueueReport", "PromptInput", "enqueue_prompts", "take_lock"]

CHUNK = 1000
LOCK_TTL_MS = 30_000
# After Redis refused a chunk for want of memory, before the room is looked at again.
_FULL_RETRY_S = 0.5

log = logging.getLogger("swarm.producer")


class EnqueueReport(msgspec.Struct, frozen=True):
    job: str
    total: int
    added: int
    already_queued: int


def _holder_is_dead(holder: str) -> bool:
    """True when the lock holder ``host:pid[/writer]`` is a process on this host that no longer
    runs."""
    host, _, pid = holder.partition("/")[0].rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class _InputDigest:
    """A hash chain over every prompt of an input, in order: what the job keeps to recognise
    the input it was queued from."""

    def __init__(self) -> None:
        self.value = ""

    def add(self, item: PromptItem) -> None:
        h = hashlib.blake2b(self.value.encode(), digest_size=16)
        h.update(encode(item))
        self.value = h.hexdigest()


async def take_lock(store: ProducerStore, job: str, token: str) -> None:
    """Take (or keep) ``job``'s producer lock for writer ``token``: :class:`ProducerBusyError`
    while another writer that is alive holds it."""
    holder = await store.acquire_producer_lock(job, token, LOCK_TTL_MS)
    if holder is not None and _holder_is_dead(holder):
        await store.release_producer_lock(job, holder)
        holder = await store.acquire_producer_lock(job, token, LOCK_TTL_MS)
    if holder is not None:
        raise ProducerBusyError(
            f"another swarm-enqueue ({holder}) is writing job {job!r}; if it died, its lock "
            f"expires {LOCK_TTL_MS // 1000} s after its last write"
        )


async def _wait_for_room(
    store: ProducerStore, job: str, token: str, upto: int, window: int
) -> None:
    """Wait until queuing prompts up to index ``upto`` leaves at most ``window`` unfinished."""
    while True:
        status = await store.status(job)
        if upto - status.done - status.failed <= window or status.cancelled:
            return
        await take_lock(store, job, token)  # still alive: keep the lock while waiting
        await asyncio.sleep(0.05)


# A prompt to queue: its text (or conversation), its custom_id, and optionally its own settings.
PromptInput = (
    tuple[str | tuple[Message, ...], str | None]
    | tuple[str | tuple[Message, ...], str | None, SamplingParams | None]
)


async def enqueue_prompts(
    store: ProducerStore,
    spec: JobSpec,
    prompts: Iterable[PromptInput],
    *,
    chunk: int = CHUNK,
    progress: bool = False,
    window: int | None = None,
    token: str | None = None,
    affinity: bool = True,
) -> EnqueueReport:
    """Queue ``(prompt, custom_id[, params])`` for ``spec.job``, resuming after what is queued.
    A prompt is a text, or (for a chat job) a whole conversation of messages; ``params``, if
    given and not None, are its own request settings instead of the job's.

    ``window``: keep at most this many prompts of the job unfinished in Redis, waiting for
    results before queuing more, so a huge input streams through with bounded memory. Without
    it, a Redis with a ``maxmemory`` still bounds the job (see :mod:`common.room`); what the
    producer waits for is said on stderr with ``progress``, else logged.
    ``token`` names this writer in the job's producer lock (default: ``host:pid``).
    ``affinity``: give prompts that share a long prefix one key, so the fleet sends them to the
    engine that computed it (see :mod:`common.affinity`); False only to measure without.
    """

    if window is not None:
        if window < 1:
            raise ConfigError(f"--window must be >= 1, got {window}")
        # Small enough chunks that the window stays mostly full while the producer waits.
        chunk = min(chunk, max(1, window // 4))
    feeder = _Feeder(store, spec, token or producer_token(), window, progress, affinity)
    # A new job is registered only when its first prompts are ready: an input refused on its
    # first lines leaves nothing behind. An existing one has its settings checked at once.
    if (await store.meta(spec.job)).get(Meta.SPEC) is not None:
        await feeder.ensure_created()
    await feeder.keep_lock()
    try:
        return await feeder.run(prompts, chunk)
    finally:
        feeder.bar.close()
        with contextlib.suppress(SwarmError):
            await store.release_producer_lock(spec.job, feeder.token)


class _Chunk(NamedTuple):
    """Prompts read and not yet queued: their items, the input's digest and count after them,
    and the levels of their texts as the engines will read them (for their affinity keys;
    none when off)."""

    items: list[PromptItem]
    digest: str
    upto: int
    levels: list[Levels]


class _Feeder:
    """One producer's run over one job: its lock, the job's creation, its chunks, each queued
    once the window and Redis's memory leave room for it. Every write carries the generation
    found (or made) when the job was first touched: if the job is deleted while this producer
    runs, it stops instead of writing into whatever takes the name next."""

    def __init__(
        self,
        store: ProducerStore,
        spec: JobSpec,
        token: str,
        window: int | None,
        progress: bool,
        affinity: bool = True,
    ) -> None:
        self.store, self.spec, self.job = store, spec, spec.job
        self.token, self.window, self.progress = token, window, progress
        self.stored: JobSpec | None = None
        self.room = Room(store, spec, self.say)
        # The prompts' affinity keys (an embedding has no prefix to keep).
        self.affinities = Affinities() if affinity and not spec.embed else None
        self.bar = Progress(
            "swarm-enqueue", f"job {spec.job}", "prompts read", enabled=progress, after_s=5.0
        )

    def say(self, message: str) -> None:
        if self.progress:
            print(f"swarm-enqueue: {message}", file=sys.stderr, flush=True)
        else:
            log.warning("%s", message)

    async def ensure_created(self) -> str:
        if self.stored is None:
            self.stored = await self.store.create_job(self.spec)
        return self.stored.generation

    async def keep_lock(self) -> None:
        await take_lock(self.store, self.job, self.token)

    async def run(self, prompts: Iterable[PromptInput], chunk: int) -> EnqueueReport:
        """Queue ``prompts`` after what the job holds, checking that the input is the one it
        was queued from, then seal the job with its total."""
        job = self.job
        meta = await self.store.meta(job)
        if Meta.CANCELLED_S in meta:
            raise JobCancelledError(
                f"job {job!r} was cancelled (swarm-cancel); 'swarm-retry {job} --kind cancelled' "
                "resumes what it had queued"
            )
        # (a job's over its shards, if it has several: its meta holds shard 0's)
        sealed_total = (await self.store.status(job)).total if Meta.TOTAL in meta else None
        start, stored_digest = await self.store.resume_point(job)
        digest = _InputDigest()
        count, added = 0, 0
        buf: list[PromptItem] = []
        # Calls are cut where a stream chunk ends (none is split between two) and where a
        # shard's block ends (each call's digest is where its shard ends); worked out once,
        # not a prompt (a job's chunk never changes; ``auto`` shards cut as if several).
        per = (self.stored or self.spec).chunk
        block = per * BLOCK_ENTRIES if (self.stored or self.spec).shards != 1 else 0
        # A chunk of prompts that may carry affinity keys is queued once the next is read:
        # their keys look one chunk ahead (see common.affinity).
        held: _Chunk | None = None
        try:
            for index, entry in enumerate(prompts):
                item = self._item(index, entry, sealed_total)
                count = index + 1
                digest.add(item)
                if index < start:
                    if index == start - 1 and stored_digest not in (None, digest.value):
                        raise JobConflictError(
                            f"job {job!r} already holds {start} prompts queued from another "
                            "input (they differ from this input's first ones): use another job "
                            "name, or the input the job was queued from"
                        )
                    continue
                buf.append(item)
                if (len(buf) >= chunk and count % per == 0) or (block and count % block == 0):
                    read = self._chunk(buf, digest.value, count)
                    buf = []
                    if held is not None:
                        added += await self._flush(held, read.levels)
                        held = None
                    if any(digests for _, digests in read.levels):  # some may carry a key
                        held = read
                    else:
                        added += await self._flush(read)
        except InputError:
            if held is not None or (buf and (added or start)):
                # A job under way: it ends with the lines before.
                await self._flush_rest(held, buf, digest.value, count)
            raise
        gen = await self.ensure_created()
        added += await self._flush_rest(held, buf, digest.value, count)
        if count < start:
            raise JobConflictError(
                f"job {job!r} already holds {start} prompts but this input has only {count}. "
                "Use another job name."
            )
        await self.store.seal(job, count, gen=gen)
        return EnqueueReport(job=job, total=count, added=added, already_queued=count - added)

    def _item(self, index: int, entry: PromptInput, sealed_total: int | None) -> PromptItem:
        """Prompt ``index`` of the input as queued; refused if the job cannot take it."""
        prompt, custom_id, *own = entry
        if sealed_total is not None and index >= sealed_total:
            raise JobConflictError(
                f"job {self.job!r} was sealed with {sealed_total} prompts; this input has more. "
                "Use another job name."
            )
        if not isinstance(prompt, str) and not self.spec.chat:
            raise ConfigError(f"prompt {index} is a conversation: only a --chat job can send one")
        return PromptItem.of(index, prompt, custom_id, own[0] if own else None)

    def _chunk(self, items: list[PromptItem], digest: str, upto: int) -> _Chunk:
        """``items`` as a chunk, the levels of their texts read if their affinity keys are
        wanted."""
        leveled: list[Levels] = []
        if self.affinities is not None:
            leveled = [
                levels(
                    msgspec.json.encode(it.messages).decode()
                    if it.messages
                    else self.spec.render(it.prompt)
                )
                for it in items
            ]
        return _Chunk(items, digest, upto, leveled)

    async def _flush_rest(
        self, held: _Chunk | None, buf: list[PromptItem], digest: str, upto: int
    ) -> int:
        """Queue what is left at the input's end: the chunk held back, then the last prompts."""
        rest = self._chunk(buf, digest, upto) if buf else None
        added = await self._flush(held, rest.levels if rest else []) if held else 0
        return added + (await self._flush(rest) if rest else 0)

    async def _flush(self, chunk: _Chunk, ahead: list[Levels] | None = None) -> int:
        """Queue one chunk, its prompts' affinity keys given the prompts ``ahead`` of it, once the
        window and Redis's memory leave room for it and its answers; then refresh the lock and
        show progress. How many prompts it held. A resumed producer's keys start from the
        prompts it queues, not those before: only where the prompts are answered can differ,
        never an answer."""
        items, digest, upto, leveled = chunk
        gen = await self.ensure_created()
        keys = self.affinities.keys_of(leveled, ahead or []) if self.affinities is not None else []
        while True:
            if self.window is not None:
                await _wait_for_room(self.store, self.job, self.token, upto, self.window)
            size = lambda: sum(len(encode(it)) for it in items)  # noqa: E731
            await self.room.wait(len(items), size, self.keep_lock, items[0].index)
            try:
                size_of = self.stored.chunk if self.stored is not None else 1
                await self.store.add_items(
                    self.job, items, digest, gen=gen, affinity=keys, chunk=size_of
                )
                break
            except StoreFull:  # another writer took the room meanwhile: wait for it again
                await self.keep_lock()
                await asyncio.sleep(_FULL_RETRY_S)
        await self.keep_lock()
        self.bar.update(upto, None)
        return len(items)
