"""swarm-queue's own error tree.

Third-party errors (redis, openai, httpx) are translated into these at one boundary each
(:mod:`common.store` for Redis, :mod:`worker.endpoint` for the inference endpoints), and retry
decisions are taken from the class, never from message text.
"""

from __future__ import annotations

__all__ = [
    "BadKeyError",
    "BadRecordError",
    "ConfigError",
    "EndpointError",
    "EndpointMalformed",
    "EndpointRejected",
    "EndpointRetryable",
    "EndpointServerError",
    "EndpointUnusable",
    "InputError",
    "JobCancelledError",
    "JobConflictError",
    "JobGoneError",
    "JobNameError",
    "JobNotFoundError",
    "ModelNotServed",
    "ProducerBusyError",
    "ResultsEvictedError",
    "RouteMissing",
    "StoreAccessDenied",
    "StoreCommandDenied",
    "StoreFull",
    "StoreRefused",
    "StoreUnavailable",
    "StoreUnreached",
    "SwarmError",
]


class SwarmError(Exception):
    """Base of every error swarm-queue raises on purpose."""


class ConfigError(SwarmError):
    """A setting, URL, hostfile or command-line value is invalid."""


class InputError(SwarmError):
    """A prompt input line is malformed; the message names the file and line."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{source}:{line}: {reason}")
        self.source = source
        self.line = line
        self.reason = reason


class JobNameError(ConfigError):
    """A job name that could reach keys outside its own job."""


class JobNotFoundError(SwarmError):
    """The named job does not exist in this Redis."""


class JobConflictError(SwarmError):
    """The job exists with settings different from the ones asked for."""


class JobGoneError(SwarmError):
    """The job this work was taken from is gone: deleted, or lost with a Redis restarted
    empty, and perhaps queued again under its name (another generation). The work is dropped,
    never written into the job that now holds the name."""

    def __init__(self, job: str) -> None:
        super().__init__(
            f"job {job!r} is gone: deleted, or lost with a Redis restarted empty (and perhaps "
            "queued again under its name); its work in hand is dropped"
        )
        self.job = job


class ProducerBusyError(JobConflictError):
    """Another live producer holds the job's producer lock."""


class JobCancelledError(SwarmError):
    """The job was cancelled with ``swarm-cancel``."""


class ResultsEvictedError(SwarmError):
    """The results asked for were collected with ``--evict`` (into another output) and have
    left Redis for good."""


class BadRecordError(SwarmError):
    """A record in Redis cannot be read (written by another tool, or damaged): what it belongs
    to is skipped and shown, never fatal to the other jobs. ``job``: the job it belongs to,
    if one."""

    def __init__(self, message: str, job: str = "") -> None:
        super().__init__(message)
        self.job = job


class BadKeyError(BadRecordError):
    """A key holds another type than swarm-queue keeps under its name (Redis's WRONGTYPE):
    written by another tool or by hand. What needs that key is skipped and reported; the
    operator deletes the key (swarm-queue never deletes what it did not write)."""

    def __init__(self, keys: tuple[str, ...] = (), job: str = "") -> None:
        where = (
            f"the key {keys[0]!r}"
            if len(keys) == 1
            else f"one of the keys {', '.join(map(repr, keys))}"
            if keys
            else f"a key of job {job!r}"
            if job
            else "a key"
        )
        super().__init__(
            f"{where} in Redis holds another type of value than swarm-queue keeps there "
            "(WRONGTYPE): another tool or a person wrote it. Look at it (redis-cli TYPE KEY) "
            "and delete it (redis-cli DEL KEY): until then what needs it is skipped",
            job,
        )
        self.keys = keys


class StoreRefused(SwarmError):
    """Redis refused a command for a reason no wait will fix and swarm-queue has no class for;
    the message carries Redis's own words."""


class StoreUnavailable(SwarmError):
    """Redis could not be reached or answered with a connection-level error."""


class StoreUnreached(SwarmError):
    """Redis never answered this process (a wrong host or port, nothing listening, a listener
    that is no Redis): not an outage to wait out, since there was never a Redis to come back
    (see ``FIRST_CONTACT_S``)."""


class StoreFull(StoreUnavailable):
    """Redis refuses writes: its ``maxmemory`` is reached. Waited out like an outage (results
    collected with ``--evict``, or jobs deleted, make room); a producer stops with it."""


class StoreAccessDenied(SwarmError):
    """Redis refused the credentials or the ACL forbids a command or key: waiting won't help."""


class StoreCommandDenied(StoreAccessDenied):
    """The credentials are right but the user's ACL forbids a command or a key (NOPERM): what
    only reads the server's state (INFO) can do without it."""


class EndpointError(SwarmError):
    """An inference endpoint call failed.

    ``status`` is the HTTP status when the server answered, else ``None``; ``tries``: the
    requests that ended in it (the retry loop counts them).
    """

    def __init__(self, endpoint: str, message: str, status: int | None = None) -> None:
        super().__init__(
            f"{endpoint}: {message}" if status is None else f"{endpoint}: HTTP {status}: {message}"
        )
        self.endpoint = endpoint
        self.message = message
        self.status = status
        self.tries = 1


class EndpointRetryable(EndpointError):
    """Transient: connection refused or reset, timeout, 429 or 5xx. Worth retrying.

    ``lost``: the request was in the server when it failed without an answer (no answer in
    time, the connection cut mid-request): a server that hung or died under its prompts, which
    count it as a worker's death (see ``SWARM_MAX_DELIVERIES``); a refused connection or an
    error status is not."""

    lost = False


class EndpointServerError(EndpointRetryable):
    """HTTP 500: the server failed on this request. Its content may be the cause (vLLM fails a
    whole list with a 500 when its tokenizer or chat template raises on one odd input), or the
    server fails everything: a list is bisected as a rejected one is, a prompt alone is asked
    again, then the endpoint's probe tells which (see :mod:`worker.retry`). Counted against
    the endpoint's circuit only when its probe fails."""


class EndpointMalformed(EndpointRetryable):
    """The server answered, but its answer cannot be used (choice indices repeated, shifted or
    missing, too few choices, vectors of another dimension or not finite, an unreadable body):
    a failure of the endpoint like a 5xx, retried here, then elsewhere; a prompt no other
    endpoint can take fails with it (kind ``malformed``). ``route``: ``embeddings`` when it
    was a vectors' answer; ``samples``: the samples a prompt it asked for (vLLM's ``n``): what
    a probe then asks for too, since a server may answer n = 1 well and n = 7 wrongly.
    ``partial``: the answer left some prompts out but answered others whole, so the fault may
    be the prompts': it does not count against the endpoint (see :mod:`worker.retry`)."""

    def __init__(
        self,
        endpoint: str,
        message: str,
        status: int | None = None,
        *,
        route: str = "",
        samples: int = 1,
        partial: bool = False,
    ) -> None:
        super().__init__(endpoint, message, status)
        self.route = route
        self.samples = samples
        self.partial = partial


class EndpointRejected(EndpointError):
    """The server refused this request's content (400, 413, 422): retrying it as is will not help.

    For a list request, some prompts of the batch may be fine: the worker bisects.
    """


class EndpointUnusable(EndpointError):
    """The endpoint cannot serve any job (401, 403: wrong key; no OpenAI ``/v1/models`` at the
    URL): it takes no more work."""


class ModelNotServed(EndpointError):
    """The endpoint does not serve the model a job asks for (404 on a generation route).

    A fact about one job on one endpoint, never about the endpoint: the job waits for an
    endpoint that serves its model, and this one goes on serving the others.
    """


class RouteMissing(ModelNotServed):
    """The server has no such route (a 404 without the OpenAI error object a server answers
    for a model it does not serve: a vLLM started without the pooling runner has no
    ``/v1/embeddings``). Handled as a model not served; said as what it is."""
