"""Every Redis key name swarm-queue uses, built by one helper.

All keys of one job carry the hash tag ``{job}`` (``swarm:{job}:...``) so that a job lives in
one Redis Cluster slot and the multi-key Lua commit can touch its stream, results and meta
together. Job names are validated so that no name can reach another job's keys or a global key.

A job's reduce stages are jobs of their own to the workers, named ``job:r1``, ``job:r2``...
(see :func:`stage_name`); their keys sit under the parent's hash tag, ``swarm:{job}:r1:q``, so
the whole job, stages included, stays in one slot. Users cannot name a job with a ``:``.
"""

from __future__ import annotations

import re

from common.errors import ConfigError, JobNameError

__all__ = [
    "DEFAULT_PREFIX",
    "GROUP",
    "Keys",
    "parse_stage",
    "stage_name",
    "validate_job_name",
]

DEFAULT_PREFIX = "swarm"
# The consumer group every worker of every job reads through.
GROUP = "workers"

# The hash tag of arq's keys: the slot of arq's own fixed key ``arq:abort`` (see arq_queue).
ARQ_TAG = "{arq:abort}"
# The hash tag of the response cache: '~' is in no job name, so no job shares its keys.
CACHE_TAG = "{~cache}"

_JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_STAGE_RE = re.compile(r"r[1-9][0-9]{0,3}")
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_job_name(job: str) -> str:
    """Return ``job`` if it is a safe job name, else raise :class:`JobNameError`.

    Letters, digits, ``.``, ``_`` and ``-`` only (no ``{``, ``}``, ``:`` or spaces), at most
    128 characters, starting with a letter or digit.
    """
    if not _JOB_RE.fullmatch(job):
        raise JobNameError(
            f"invalid job name {job!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return job


def stage_name(job: str, level: int) -> str:
    """The name of ``job``'s reduce stage ``level`` (level 0 is the job itself)."""
    validate_job_name(job)
    return job if level == 0 else f"{job}:r{level}"


def parse_stage(name: str) -> tuple[str, int]:
    """``(job, level)`` of a job or stage name; raises :class:`JobNameError` if invalid."""
    job, sep, stage = name.partition(":")
    validate_job_name(job)
    if not sep:
        return job, 0
    if not _STAGE_RE.fullmatch(stage):
        raise JobNameError(f"invalid stage name {name!r}: expected JOB:rN")
    return job, int(stage[1:])


class Keys:
    """Key names under one prefix (``SWARM_PREFIX``, default ``swarm``)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(
                f"invalid key prefix {prefix!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        self.prefix = prefix

    def _job(self, job: str, part: str) -> str:
        parent, level = parse_stage(job)
        stage = f"r{level}:" if level else ""
        return f"{self.prefix}:{{{parent}}}:{stage}{part}"

    def stream(self, job: str) -> str:
        """The job's Redis Stream of queued prompts; entry ID ``0-(index+1)``."""
        return self._job(job, "q")

    def results(self, job: str) -> str:
        """Hash: decimal prompt index -> msgpack-encoded :class:`common.models.Result`."""
        return self._job(job, "results")

    def meta(self, job: str) -> str:
        """Hash: the job spec, counters and timestamps (see :mod:`common.store`)."""
        return self._job(job, "meta")

    def failed(self, job: str) -> str:
        """Hash: decimal index -> the original queued entry of each failed prompt, so that
        ``swarm-retry`` can queue it again (acknowledged entries are deleted from the stream)."""
        return self._job(job, "failed")

    def cached(self, job: str) -> str:
        """Hash: decimal index -> the original queued entry of each prompt answered from the
        response cache, so that ``swarm-retry --uncached`` can ask an endpoint again."""
        return self._job(job, "cached")

    def running(self, job: str) -> str:
        """Hash: entry ID -> how many times a worker started that entry and neither committed
        nor released it: each one a worker that died running it. What dead-lettering counts."""
        return self._job(job, "running")

    def copies(self, job: str) -> str:
        """Set: entry IDs copied speculatively at the job's tail, so each is copied once."""
        return self._job(job, "copies")

    def final(self, job: str) -> str:
        """String: the JSON :class:`common.models.ReduceOutput` of a job with a reduce stage,
        written once when the reduce has finished."""
        return self._job(job, "final")

    def endpoints(self, job: str) -> str:
        """Hash: consumer (``worker|endpoint``) -> msgpack :class:`common.fleet.EndpointStats`,
        what each drain loop did for the job, refreshed every few seconds."""
        return self._job(job, "endpoints")

    def producer_lock(self, job: str) -> str:
        """String: ``host:pid`` of the swarm-enqueue writing the job, with a TTL."""
        return self._job(job, "lock")

    @property
    def jobs(self) -> str:
        """Set of all known job names; outside any job's hash slot."""
        return f"{self.prefix}:jobs"

    @property
    def fleet(self) -> str:
        """Hash: consumer (``worker|endpoint``) -> msgpack :class:`common.fleet.EndpointInfo`,
        the models each live endpoint serves; like ``jobs``, outside any job's slot."""
        return f"{self.prefix}:fleet"

    @property
    def cache_answers(self) -> str:
        """Hash: answer key (see :mod:`common.cache`) -> msgpack answer, shared by every job
        of this prefix. All of the cache has one hash tag, ``{~cache}``, that no job name can
        take: its scripts touch both of its keys, so on a Cluster it lives on one shard."""
        return f"{self.prefix}:{CACHE_TAG}:answers"

    @property
    def cache_used(self) -> str:
        """Sorted set: answer key -> when it was last written or read (s): what the cache's
        TTL and least-recently-used eviction go by."""
        return f"{self.prefix}:{CACHE_TAG}:used"

    @property
    def arq_queue(self) -> str:
        """arq's own queue (sorted set) for the worker-side arq functions.

        arq's keys must share one Redis Cluster slot (its transactions span them): its fixed
        ``arq:abort`` set, and keys named after its job IDs (``arq:job:<id>``...). So the
        queue and every job ID (see :meth:`advance_job_id`) carry the hash tag
        ``{arq:abort}``, which hashes exactly as the key ``arq:abort`` does."""
        return f"{ARQ_TAG}:{self.prefix}:arq:queue"

    @property
    def arq_health_check(self) -> str:
        """String: what a live arq worker of this prefix writes every few seconds."""
        return f"{self.arq_queue}:health-check"

    def advance_job_id(self, job: str, level: int) -> str:
        """The arq job ID of advancing ``job``'s reduce past stage ``level``: one per stage,
        so arq refuses a second while one is queued or running."""
        return f"{ARQ_TAG}:{self.prefix}:{validate_job_name(job)}:advance:{level}"

    def job_pattern(self, job: str) -> str:
        """A SCAN pattern matching every key of ``job``, its reduce stages' included."""
        return f"{self.prefix}:{{{validate_job_name(job)}}}:*"
