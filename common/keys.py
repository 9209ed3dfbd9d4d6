"""Every Redis key name swarm-queue uses, built by one helper.

All keys of one job carry the hash tag ``{job}`` (``swarm:{job}:...``) so that a job lives in
one Redis Cluster slot and the multi-key Lua commit can touch its stream, results and meta
together. Job names are validated so that no name can reach another job's keys or a global key.
"""

from __future__ import annotations

import re

from common.errors import ConfigError, JobNameError

__all__ = ["DEFAULT_PREFIX", "GROUP", "Keys", "validate_job_name"]

DEFAULT_PREFIX = "swarm"
# The consumer group every worker of every job reads through.
GROUP = "workers"

_JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
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


class Keys:
    """Key names under one prefix (``SWARM_PREFIX``, default ``swarm``)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(
                f"invalid key prefix {prefix!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        self.prefix = prefix

    def _job(self, job: str, part: str) -> str:
        return f"{self.prefix}:{{{validate_job_name(job)}}}:{part}"

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

    def producer_lock(self, job: str) -> str:
        """String: ``host:pid`` of the swarm-enqueue writing the job, with a TTL."""
        return self._job(job, "lock")

    @property
    def jobs(self) -> str:
        """Set of all known job names; the one key outside any job's hash slot."""
        return f"{self.prefix}:jobs"

    @property
    def arq_queue(self) -> str:
        """arq's own queue (sorted set) for the worker-side arq functions."""
        return f"{self.prefix}:arq:queue"

    def job_pattern(self, job: str) -> str:
        """A SCAN pattern matching every key of ``job``."""
        return f"{self.prefix}:{{{validate_job_name(job)}}}:*"
