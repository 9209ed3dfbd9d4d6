"""The words swarm-queue writes into Redis and output files besides key names (those are
:mod:`common.keys`'): the fields of a job's meta hash, and why a prompt failed. The Lua
scripts get both from here (see :mod:`common.store.scripts`), so Python and Lua cannot drift."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "FAILED_KIND_PREFIX",
    "RESULT_CHUNK_PREFIX",
    "RETRYABLE_KINDS",
    "FailureKind",
    "Meta",
    "failed_field",
]


class FailureKind(StrEnum):
    """Why a prompt failed: a result's ``error_kind``, counted per kind in the job's meta
    (``failed:<kind>``) and what ``swarm-retry --kind`` selects."""

    REJECTED = "rejected"  # the server refused it (HTTP 400: over the context, bad values)
    NO_CHOICE = "no_choice"  # the server never returned a choice for it
    # Every endpoint that tried it failed with HTTP 500 on it alone, and answered its probe
    SERVER_ERROR = "server_error"
    # The endpoint's answers could not be used (see EndpointMalformed), and no other took it
    MALFORMED = "malformed"
    SCHEMA = "schema"  # answered, but not matching the job's --schema (its text kept)
    # A chat answer with no text (message.content null: tool calls, or reasoning only)
    NO_CONTENT = "no_content"
    DEAD_LETTER = "dead_letter"  # workers kept dying while running it
    CANCELLED = "cancelled"  # swarm-cancel
    BAD_ENTRY = "bad_entry"  # its stream entry or stored result could not be read
    # Its samples were answered, but their per-prompt measure could not be computed
    MEASURE = "measure"
    MISSING = "missing"  # no result in Redis any more (collected with --evict)


# The kinds swarm-retry can queue again: every failure that kept its original entry.
RETRYABLE_KINDS = tuple(k for k in FailureKind if k is not FailureKind.MISSING)


class Meta(StrEnum):
    """The fields of a job's meta hash (``Keys.meta``): its spec, counters and timestamps."""

    SPEC = "spec"  # msgpack JobSpec, written once by the first producer
    # A token written with the spec when the job is created: a job deleted (or lost) and
    # queued again under its name is another generation, and every write of work taken from
    # the old one is refused (see lua/lib/jobs.lua).
    GENERATION = "gen"
    REDUCE = "reduce"  # the reduce kind, when the job has one: where workers look for it
    STAGE = "stage"  # the reduce tree level running (0: the job's own prompts)
    ENQUEUED = "enqueued"  # prompts queued so far: the producer's resume point
    # A shard's (common/shards.py): the input index after its last queued prompt (where the
    # producer resumes is the highest of its shards'); its ``enqueued`` counts its own.
    NEXT = "next"
    # How many shards the job is spread over, written at its creation when more than one.
    SHARDS = "shards"
    INPUT_DIGEST = "input_digest"  # digest of the input up to ``enqueued``
    TOTAL = "total"  # set once all input is queued (the job is sealed)
    DONE = "done"  # prompts answered
    FAILED = "failed"  # prompts failed, all kinds (per kind: ``failed_field``)
    CACHE_HITS = "cache_hits"  # prompts answered from the response cache (counted in DONE)
    PROMPT_TOKENS = "prompt_tokens"
    COMPLETION_TOKENS = "completion_tokens"
    CACHED_TOKENS = "cached_tokens"  # of the prompt tokens, those the engines found cached
    REASONING_TOKENS = "reasoning_tokens"  # of the completion tokens, those spent reasoning
    # Every index below it was collected into a file and its result deleted (--evict): a late
    # commit there is neither stored nor counted, and swarm-retry cannot reach it.
    EVICTED = "evicted"
    REVISION = "revision"  # swarm-retry rounds that queued something: results may have changed
    RETRY_ROUND = "retry_round"  # swarm-retry rounds so far: the ms part of requeued entry IDs
    SEALED_S = "sealed_s"
    FIRST_RESULT_S = "first_result_s"
    FINISHED_S = "finished_s"  # every prompt has a result
    CANCELLED_S = "cancelled_s"  # swarm-cancel
    REDUCED_S = "reduced_s"  # the reduce output is written
    # The job's chunk (``JobSpec.chunk``, prompts an entry), written at its creation: what a
    # commit takes an entry's size to be where the ``chunks`` hash says nothing (none: a job
    # from before, whose every chunk's size is in that hash).
    CHUNK = "chunk"
    # Of the job's entries, how many are partly answered (each marked in its ``chunks`` hash
    # until it is whole), written 0 at its creation: while none is, a commit of whole entries
    # still pending writes without reading for earlier answers (lua/commit.lua).
    PARTIAL = "partial"
    # Written 1 at the job's creation: a whole chunk answered in one commit may keep its
    # results in one field of the results hash (:data:`RESULT_CHUNK_PREFIX` and its first
    # index; common/store/resultfields.py), which every reader of this version looks for.
    # A job from before has none: its readers know only a field an index.
    PACKED = "packed"
    # An embeddings job's dimension, fixed by its first answer: a vector of another is
    # the endpoint's failure, never a result
    DIM = "dim"


# A commit trims its job's stream (its acknowledged head: lua/lib/streams.lua) when the job's
# results pass a multiple of this, and at every commit once the job is finished: the trim is
# two commands, which at every commit were a tenth of Redis's commands a prompt (issue 50),
# and what it leaves meanwhile is a few hundred acknowledged prompts' entries.
TRIM_EVERY = 512

# A whole chunk's results, kept together: the results hash's field ``c<first index>``.
RESULT_CHUNK_PREFIX = "c"

# Per-kind failure counters are meta fields ``failed:<kind>``.
FAILED_KIND_PREFIX = "failed:"


def failed_field(kind: str) -> str:
    """The meta field counting failures of ``kind``."""
    return FAILED_KIND_PREFIX + kind
