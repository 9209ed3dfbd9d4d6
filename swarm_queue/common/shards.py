"""A job spread over several Redis Cluster slots: which shard holds which prompt.

A job's keys share one hash tag, so one job is one slot, one Redis core. A plain job asked
for with ``shards=K`` (``swarm-enqueue --shards K``) is K jobs to the workers, each its own
stream, results and counters under its own tag: shard 0 is the job itself, each other a job
``job#N`` (:func:`common.keys.shard_name`), its tag chosen to land on its own primary of a
cluster (:func:`aimed_names`). Its input is dealt out in blocks of
:data:`BLOCK_ENTRIES` stream entries, block ``b`` to shard ``b % K``, so that each shard's
indices are known without asking Redis; a result is kept under its input index in its
shard's hash, and a collector reads each index where this layout says. Everything that works
on a job as a whole (status, collecting, retry, cancel, delete) goes through
:class:`common.store.sharded.Sharded`; the workers know nothing of it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.keys import MAX_SHARD_TAG, MAX_SHARDS, shard_name, shard_of

__all__ = [
    "AUTO",
    "BLOCK_ENTRIES",
    "MAX_SHARDS",
    "Shards",
    "check_shards",
    "job_of",
    "parse_shards",
]

# Stream entries a block: a producer's flush of 1,000 prompts mostly goes to one shard, a
# collector's read of 2,000 to two or three, and the shards' sizes differ by one block at most.
BLOCK_ENTRIES = 64


class Shards(NamedTuple):
    """The layout of ``job``: ``shards`` of them, blocks of ``block`` consecutive prompts."""

    job: str
    shards: int = 1
    block: int = BLOCK_ENTRIES

    @classmethod
    def of(cls, job: str, shards: int, chunk: int) -> Shards:
        """The layout of a job of ``shards`` shards and ``chunk`` prompts an entry."""
        return cls(job, shards, BLOCK_ENTRIES * max(1, chunk))

    @property
    def names(self) -> list[str]:
        """Every shard's job name, shard 0 (the job's own) first (see :func:`aimed_names`)."""
        return list(aimed_names(self.job, self.shards))

    def shard(self, index: int) -> int:
        """The shard holding prompt ``index``."""
        return (index // self.block) % self.shards

    def name_of(self, index: int) -> str:
        """The job name of the shard holding prompt ``index``."""
        return aimed_names(self.job, self.shards)[self.shard(index)]

    def split(self, indices: Iterable[int]) -> dict[str, list[int]]:
        """``indices`` by the shard that holds each (in their order), only shards with some."""
        out: dict[str, list[int]] = {}
        for i in indices:
            out.setdefault(self.name_of(i), []).append(i)
        return out

    def runs(self, start: int, end: int) -> list[tuple[int, int]]:
        """``[start, end)`` cut where a block ends: each run is one shard's."""
        out, at = [], start
        while at < end:
            stop = min(end, (at // self.block + 1) * self.block)
            out.append((at, stop))
            at = stop
        return out

    def after_before(self, first: int) -> int:
        """The index after the prompts the shard of ``first`` holds below it (0: none): where
        its stream must have ended for ``first`` to be queued next."""
        if first % self.block:
            return first  # inside a block: the prompt before it is this shard's
        earlier = first // self.block - self.shards  # this shard's block before
        return (earlier + 1) * self.block if earlier >= 0 else 0

    def shares(self, total: int) -> list[int]:
        """How many of prompts ``0 .. total-1`` each shard holds (its total, once sealed)."""
        whole, rest = divmod(total, self.block)
        counts = [(whole // self.shards) * self.block] * self.shards
        for b in range(whole - whole % self.shards, whole):
            counts[b % self.shards] += self.block
        counts[whole % self.shards] += rest
        return counts


@functools.lru_cache(maxsize=4096)
def aimed_names(job: str, shards: int) -> tuple[str, ...]:
    """The names of ``job``'s ``shards`` shards, shard 0 (the job itself) first.

    A Redis Cluster serves its 16,384 slots in ranges, one a primary, equal ones as
    ``redis-cli --cluster create`` deals them. Shard ``s`` takes the first tag whose slot lies
    in the ``s``-th of ``shards`` equal slot ranges after the job's own: K shards on a cluster
    of K such primaries are one on each, and on 2K two on each, whatever the job's name. The
    same names from the same job and count, in every process, without asking Redis."""
    if shards == 1:
        return (job,)
    home = _slot_range(job, shards)
    found: dict[int, str] = {}
    for tag in range(1, MAX_SHARD_TAG + 1):
        name = shard_name(job, tag)
        aim = _slot_range(name, shards)
        if aim != home and aim not in found:
            found[aim] = name
            if len(found) == shards - 1:
                return (job, *(found[(home + s) % shards] for s in range(1, shards)))
    raise ConfigError(f"no shard names found for job {job!r} over {shards} slot ranges")


def _slot_range(tag: str, shards: int) -> int:
    """Which of ``shards`` equal ranges of the cluster's slots hash tag ``tag`` falls in."""
    return key_slot(tag.encode()) * shards // SLOTS


def job_of(name: str) -> str:
    """The job a job or shard name belongs to (a shard's figures are its job's)."""
    return shard_of(name)[0] if "#" in name else name


# ``shards`` asked for as ``auto``: one a primary of the Redis Cluster (1 on one Redis server),
# decided when the job is created (a job that exists keeps its own).
AUTO = 0


def check_shards(count: int) -> int:
    """``count`` if a job may be spread over that many shards (or :data:`AUTO`)."""
    if not (1 <= count <= MAX_SHARDS or count == AUTO):
        raise ConfigError(f"shards must be 1..{MAX_SHARDS} or auto, got {count}")
    return count


def parse_shards(text: str) -> int:
    """A ``--shards`` value: a count, or ``auto`` (:data:`AUTO`)."""
    if text == "auto":
        return AUTO
    try:
        return check_shards(int(text))
    except ValueError:
        raise ConfigError(f"--shards takes a count or 'auto', not {text!r}") from None
