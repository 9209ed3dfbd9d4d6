"""Every Redis key name swarm-queue uses, built by one helper.

All keys of one job carry the hash tag ``{job}`` (``swarm:{job}:...``) so that a job lives in
one Redis Cluster slot and the multi-key Lua commit can touch its stream, results and meta
together. Job names are validated so that no name can reach another job's keys or a global key.

A job's reduce stages are jobs of their own to the workers, named ``job:r1``, ``job:r2``...
(see :func:`stage_name`), and so are the later steps of a pipeline, ``job:s1``, ``job:s2``...
(see :func:`step_name`), and the rounds of a blackboard, ``board:b1``... (see
:func:`round_name`); their keys sit under the parent's hash tag, ``swarm:{job}:r1:q``, so
the whole job, stages included, stays in one slot. Users cannot name a job with a ``:``.

A plain job may be spread over K slots (``JobSpec.shards``): shard 0 is the job itself, each
other a job to the workers, ``job#N`` under the tag ``{job#N}`` (see :func:`shard_name`)."""

from __future__ import annotations

import hashlib
import re

from swarm_queue.common.errors import ConfigError, JobNameError

__all__ = [
    "ARQ_ABORT",
    "ARQ_TAG",
    "DEFAULT_PREFIX",
    "GROUP",
    "LANE_PREFIX",
    "OPEN_LANE",
    "PUMP_GROUP",
    "Keys",
    "group_of",
    "lane_name",
    "parse_stage",
    "round_name",
    "shard_name",
    "shard_of",
    "stage_name",
    "step_name",
    "step_of",
    "validate_job_name",
    "validate_tool_name",
]

DEFAULT_PREFIX = "swarm"
# The consumer group every worker of every job reads through (and the tool runners, their
# tools' calls).
GROUP = "workers"
# The consumer group of a pipeline step's ``landed`` stream, read by the pumps that feed the
# next step (see flows/pipeline).
PUMP_GROUP = "pump"
# Consumers of GROUP that are no worker: an endpoint's lane, holding the agent turns queued
# for the endpoint that served the turn before (see :func:`lane_name`).
LANE_PREFIX = "lane:"
# The lane no endpoint owns: turns an endpoint handed on because its engine was too busy for
# them (``give_back.lua``), taken at once by any endpoint with nothing else to do.
OPEN_LANE = LANE_PREFIX + "open"

# arq's own fixed key (the set of aborted job IDs), and the hash tag of arq's keys: that key's
# slot (see arq_queue).
ARQ_ABORT = "arq:abort"
ARQ_TAG = "{" + ARQ_ABORT + "}"
# The hash tag of the response cache: '~' is in no job name, so no job shares its keys.
CACHE_TAG = "{~cache}"
# The hash tag of the tool calls agents share across jobs (their claims and answers).
TOOLS_TAG = "{~tools}"
# The hash tag of the OpenAI Batch API's files and batches (swarm-gateway's records).
BATCHES_TAG = "{~batches}"

# OpenAI's rule for a function's name: what a tool may be called, and so what its keys hold.
_TOOL_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_STAGE_RE = re.compile(r"[rsb][1-9][0-9]{0,3}")
_SHARD_RE = re.compile(r"[1-9][0-9]{0,5}")
# The most slots one job is spread over (JobSpec.shards), and the highest tag of a shard's name.
MAX_SHARDS = 256
MAX_SHARD_TAG = 999_999
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_tool_name(name: str) -> str:
    """``name`` if it is a tool's name as OpenAI allows one (letters, digits, ``_``, ``-``,
    at most 64); ConfigError otherwise."""
    if not isinstance(name, str) or not _TOOL_RE.fullmatch(name):
        raise ConfigError(
            f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-' (OpenAI's rule)"
        )
    return name


def lane_name(endpoint: str) -> str:
    """The lane of an endpoint (its label, as results name it): a consumer of GROUP that
    holds the entries queued for that endpoint until one of its drain loops takes them."""
    digest = hashlib.blake2b(endpoint.encode(), digest_size=6).hexdigest()
    return f"{LANE_PREFIX}{digest}"


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
    """The name of ``job``'s reduce stage ``level`` (level 0 is the job itself, which may be
    a pipeline's last step: its reduce has no further levels)."""
    if level == 0:
        parse_stage(job)
        return job
    validate_job_name(job)
    return f"{job}:r{level}"


def step_name(job: str, step: int) -> str:
    """The name of pipeline ``job``'s step ``step`` (step 0 is the job itself)."""
    validate_job_name(job)
    return job if step == 0 else f"{job}:s{step}"


def round_name(board: str, n: int) -> str:
    """The job of round ``n`` (from 1) of blackboard ``board``."""
    validate_job_name(board)
    if not 1 <= n <= 9999:
        raise ConfigError(f"a blackboard has rounds 1..9999, not {n}")
    return f"{board}:b{n}"


def step_of(name: str) -> tuple[str, int] | None:
    """``(job, step)`` of a later step's (or agent turn's) name, ``job:s2``; None for any
    other name."""
    job, sep, stage = name.partition(":")
    if not sep or not stage.startswith("s") or not stage[1:].isdigit():
        return None
    return job, int(stage[1:])


def group_of(name: str) -> tuple[str, int]:
    """The group job ``name`` is served in, and its place there: a workflow's later step or
    agent turn (``job:s2``) goes with its first job, after it; a shard (``job#4``) with its
    job, beside it; any other job is a group of its own at place 0."""
    if "#" in name and ":" not in name:
        return shard_of(name)[0], 0
    return step_of(name) or (name, 0)


def shard_name(job: str, tag: int) -> str:
    """``job``'s shard tagged ``tag`` (tag 0: the job; which ones: :mod:`common.shards`)."""
    validate_job_name(job)
    if not 0 <= tag <= MAX_SHARD_TAG:
        raise ConfigError(f"a shard's tag is 0..{MAX_SHARD_TAG}, not {tag}")
    return job if tag == 0 else f"{job}#{tag}"


def shard_of(name: str) -> tuple[str, int]:
    """``(job, tag)`` of a job or shard name (``study#7``: ``("study", 7)``); a name of no
    shard is tag 0, the job itself. Raises :class:`JobNameError` if invalid."""
    job, sep, tag = name.partition("#")
    validate_job_name(job)
    if not sep:
        return job, 0
    if not _SHARD_RE.fullmatch(tag):
        raise JobNameError(f"invalid shard name {name!r}: expected JOB#N, N in 1..{MAX_SHARD_TAG}")
    return job, int(tag)


def parse_stage(name: str) -> tuple[str, int]:
    """``(job, level)`` of a job, reduce stage or pipeline step name (a step's reduce level is
    0), or of a job's shard (``job#2``: the job's, level 0); raises :class:`JobNameError` if
    invalid."""
    job, sep, stage = name.partition(":")
    if "#" in job and not sep:
        return shard_of(job)[0], 0
    validate_job_name(job)
    if not sep:
        return job, 0
    if not _STAGE_RE.fullmatch(stage):
        raise JobNameError(f"invalid stage name {name!r}: expected JOB:rN, JOB:sN or JOB:bN")
    return job, int(stage[1:]) if stage[0] == "r" else 0


class Keys:
    """Key names under one prefix (``SWARM_PREFIX``, default ``swarm``)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(
                f"invalid key prefix {prefix!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        self.prefix = prefix

    def _job(self, job: str, part: str) -> str:
        parse_stage(job)  # validates
        parent, sep, stage = job.partition(":")
        return f"{self.prefix}:{{{parent}}}:{stage + ':' if sep else ''}{part}"

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

    def reopened(self, job: str) -> str:
        """Hash: decimal index -> the entry ID ``swarm-retry`` queued it again under, for a
        prompt below the job's eviction mark (its line is in a collected file): the one
        commit that may still write that index, so that the answer reaches the file when the
        collector brings it up to date, and a late copy of an earlier try does not."""
        return self._job(job, "reopened")

    def running(self, job: str) -> str:
        """Hash: entry ID -> how many times a worker started that entry and neither committed
        nor released it: each one a worker that died running it. What dead-lettering counts."""
        return self._job(job, "running")

    def chunks(self, job: str) -> str:
        """Hash: entry ID -> how many prompts that entry holds, for an entry of a chunked job
        (:mod:`common.store.entries`) that holds other than the job's chunk (its last, one
        cut short by an affinity key); gone with its entry's acknowledgement."""
        return self._job(job, "chunks")

    def hungry(self, job: str) -> str:
        """String with a TTL: set while some endpoint with nothing else to do looked in vain
        for the job's laned turns; an endpoint with turns waiting in a busy engine hands them
        on (to the open lane) only then (see ``give_back.lua``)."""
        return self._job(job, "hungry")

    def owners(self, job: str) -> str:
        """Hash: an affinity key (see :mod:`common.affinity`) -> the lane of the endpoint its
        prompts go to; ``#`` and a lane -> how many keys that lane was given (see
        ``route.lua``)."""
        return self._job(job, "owners")

    def strikes(self, job: str) -> str:
        """Hash: entry ID -> how many endpoints gave it back because their answers could not be
        used (malformed, or its choice left out): past a few, it fails rather than going
        round the fleet again; ``ID|consumer``: that consumer has struck it."""
        return self._job(job, "strikes")

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

    def landed(self, job: str) -> str:
        """Stream of a pipeline step's answers as they are committed (fields ``i``: index,
        ``d``: the prompt's entry), read through :data:`PUMP_GROUP` by the pump that queues
        them into the next step; trimmed as the pump acknowledges them."""
        return self._job(job, "landed")

    def fed(self, job: str) -> str:
        """Hash on a pipeline step: the input index an item came from -> its index in this
        step (items are numbered in the order their answers reached the step before)."""
        return self._job(job, "fed")

    def dropped(self, job: str) -> str:
        """Hash on a pipeline step: input index -> why its item was not queued into this step
        (its answer before failed the step's filter)."""
        return self._job(job, "dropped")

    def board(self, name: str) -> str:
        """Hash of blackboard ``name``: ``round`` (rounds finished) and ``state`` (msgpack:
        its sections and what each round wrote there)."""
        return self._job(validate_job_name(name), "board")

    def input_states(self, job: str) -> str:
        """Hash of a workflow job: input index -> msgpack state its flow keeps between the
        input's steps (an agent's turns, tool calls, tokens so far) while it runs. (Named
        ``agents`` in Redis, as when agents were its only users.)"""
        return self._job(job, "agents")

    def parked(self, job: str) -> str:
        """Hash of a workflow job: input index -> what the input waits on outside the fleet
        (an agent's tool calls, and its conversation): an input here holds no slot of any
        endpoint."""
        return self._job(job, "waiting")

    def outcomes(self, job: str) -> str:
        """Hash of a workflow job: input index -> its outcome as its flow wrote it (msgpack:
        an agent's :class:`flows.agents.spec.AgentResult`), written once, when the input is
        through (answered, or failed with its reason)."""
        return self._job(job, "done")

    def finished(self, job: str) -> str:
        """Stream of a workflow job: each input as it finished (field ``a``), in that order."""
        return self._job(job, "finished")

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
    def project_caps(self) -> str:
        """Hash: project -> the most lines its jobs may have in flight across the fleet
        (``swarm-jobs --cap``); like ``jobs``, outside any job's slot."""
        return f"{self.prefix}:project-caps"

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
        """arq's own queue (sorted set) of the worker's arq functions (only ``ping``).

        arq's keys must share one Redis Cluster slot (its transactions span them): its fixed
        ``arq:abort`` set, and keys named after its job IDs (``arq:job:<id>``...). So every
        queue carries the hash tag ``{arq:abort}``, which hashes exactly as the key
        ``arq:abort`` does."""
        return f"{ARQ_TAG}:{self.prefix}:arq:queue"

    def tool_claim(self, key: str) -> str:
        """String, with a TTL: the stream entry of the tool call ``key`` (a digest of the tool
        and its arguments) while it waits for a runner or runs; who asks again meanwhile
        waits for its answer. Its runner renews it while the call runs."""
        return f"{self.prefix}:{TOOLS_TAG}:claim:{key}"

    def tool_answer(self, key: str) -> str:
        """String, with a TTL: the answer of the tool call ``key`` (msgpack
        :class:`common.tools.ToolAnswer`), kept for its waiters, and as a cache if the tool
        asks for one."""
        return f"{self.prefix}:{TOOLS_TAG}:answer:{key}"

    def tool_runs(self, key: str) -> str:
        """String, with a TTL: how many times the tool call ``key`` was run (a runner that
        died mid-call has it run again): what its answer's ``runs`` says."""
        return f"{self.prefix}:{TOOLS_TAG}:runs:{key}"

    def tool_rate(self, tool: str) -> str:
        """String, with a TTL: the next moment a run of rate-limited ``tool`` may start
        (Redis's clock, seconds), shared by every runner."""
        return f"{self.prefix}:{TOOLS_TAG}:rate:{tool}"

    @property
    def tool_stats(self) -> str:
        """Hash: tool calls ``queued`` for a runner, ``shared`` (answered by a run another
        asker started, or kept), and ``runs`` (what the runners ran), since Redis started."""
        return f"{self.prefix}:{TOOLS_TAG}:stats"

    def tool_calls(self, tool: str) -> str:
        """Stream of the calls of ``tool`` waiting for a runner or in one's hands (fields
        ``k``: the call's key, ``a``: its arguments), read through :data:`GROUP`
        only by the runners whose ``SWARM_TOOLS`` allow the tool, so that a call never
        reaches a runner that would refuse it. An entry goes once its answer is kept."""
        return f"{self.prefix}:{TOOLS_TAG}:calls:{validate_tool_name(tool)}"

    def tool_runners(self, tool: str) -> str:
        """Sorted set: runner label -> until when (Redis's clock, ms) it serves ``tool``,
        renewed every few seconds by each live runner that allows it."""
        return f"{self.prefix}:{TOOLS_TAG}:runners:{validate_tool_name(tool)}"

    def batch_files(self, project: str) -> str:
        """Hash of the Batch API: file id -> msgpack :class:`common.batchapi.FileObject`, the
        files of ``project`` (their bytes live on disk, see ``swarm-gateway``)."""
        return f"{self.prefix}:{BATCHES_TAG}:files:{validate_job_name(project)}"

    def batch(self, project: str, batch: str) -> str:
        """Hash of one batch of ``project``: ``obj`` (msgpack
        :class:`common.batchapi.BatchObject`, written by the gateway driving it) and
        ``cancel`` (when a cancel was asked, written once by whoever asked)."""
        return f"{self.prefix}:{BATCHES_TAG}:batch:{validate_job_name(project)}:{batch}"

    def batch_order(self, project: str) -> str:
        """List: ``project``'s batch ids, newest first (what ``GET /v1/batches`` pages)."""
        return f"{self.prefix}:{BATCHES_TAG}:order:{validate_job_name(project)}"

    @property
    def batches_active(self) -> str:
        """Set: ``project/batch`` of every batch not over yet: what the gateways drive."""
        return f"{self.prefix}:{BATCHES_TAG}:active"

    @property
    def batch_expiring(self) -> str:
        """Sorted set: ``project/file`` of every file with an expiry, scored by its
        ``expires_at`` (seconds): what the gateways delete once it has passed."""
        return f"{self.prefix}:{BATCHES_TAG}:expiring"

    def batch_lease(self, batch: str) -> str:
        """String, with a TTL: the token of the gateway process driving ``batch``."""
        return f"{self.prefix}:{BATCHES_TAG}:lease:{batch}"

    @property
    def acl_keys(self) -> tuple[str, ...]:
        """The key patterns a Redis ACL user of this prefix needs (docs/HPC.md): its own
        keys, arq's queues under arq's hash tag, and arq's records, whose names arq fixes
        (``arq:job:ID``, ``arq:abort``...)."""
        return (f"{self.prefix}:*", f"{ARQ_TAG}:{self.prefix}:*", "arq:*")

    @property
    def arq_health_check(self) -> str:
        """String: what a live arq worker of this prefix writes every few seconds."""
        return f"{self.arq_queue}:health-check"

    def job_pattern(self, job: str) -> str:
        """A SCAN pattern matching every key of ``job`` (or of one shard of it), its reduce
        stages' included."""
        shard_of(job)  # validates
        return f"{self.prefix}:{{{job}}}:*"
