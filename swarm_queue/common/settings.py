"""Settings, parsed once at each entry point into one typed, immutable object.

Nothing else in swarm-queue reads ``os.environ``: the commands call :meth:`Settings.from_env`
with the environment and their command-line overrides, and hand the result down.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.hostfile import Endpoint, parse_endpoints, parse_hostfile
from swarm_queue.common.keys import DEFAULT_PREFIX, Keys

__all__ = ["DEFAULT_REDIS_URL", "Settings", "mask_url"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The largest batch: a batch's entries and results go through one Redis script call each, and
# Redis's Lua expands at most ~8,000 values into one command (a batch of 5,000 failed every
# commit). Engines run a few hundred sequences at once: more in one request only waits.
MAX_BATCH_SIZE = 2048

_FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*:(?:[A-Za-z_]\w*|\*)")


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, in the user part or in a ``password=``
    query parameter: the only form a URL is ever printed in. A URL that cannot be parsed is
    not printed at all."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{field.partition('=')[0]}=***"
        if field.partition("=")[0].lower() in _SECRET_PARAMS
        else field
        for field in parts.query.split("&")
    )
    masked = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its form
        masked = masked.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return masked


# Query parameters whose values are secrets (redis-py takes the password as one).
_SECRET_PARAMS = frozenset({"password", "pass", "pwd", "api_key", "token"})


def _validate_redis_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {mask_url(url)}: {exc}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)!r}: expected redis://, rediss:// or unix://"
        )
    return url


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every tunable of swarm-queue, with units in the names."""

    redis_url: str = DEFAULT_REDIS_URL
    # Whether redis_url is the default because none was given (what commands then say).
    redis_defaulted: bool = False
    # With rediss://: the CA certificate file to verify the server with ("" : the system's).
    redis_ca_file: str = ""
    # The URL names one node of a Redis Cluster: the client follows the cluster's slot map.
    redis_cluster: bool = False
    prefix: str = DEFAULT_PREFIX
    endpoints: tuple[Endpoint, ...] = ()
    # Prompts per /v1/completions request, and requests in flight per endpoint. A list request
    # answers when its LONGEST sequence ends, so its short ones have freed their slots long
    # before: batch x inflight must exceed vLLM's max_num_seqs (default 256) by the ratio of
    # the longest to the mean output length to keep the engine full (docs/BENCHMARKS.md).
    batch_size: int = 32
    inflight: int = 16
    # With vLLM's /metrics readable, the window of requests in flight starts at 2 and adapts
    # up to max(inflight, inflight_max) so the engine stays full without queuing far ahead:
    # full GPUs, short queues, first results at once. Without gauges (another server, a
    # proxy) the window is inflight. 0 turns adaptation off: always inflight.
    inflight_max: int = 32
    adapt_period_s: float = 0.25
    # The longest one step of a reduce may take (grouping and queuing a tree level, or running
    # an aggregator); a worker killed inside one hands it over after this plus 10 s.
    reduce_timeout_s: float = 600.0
    # 0 sizes each request's timeout from the batch: 120 s + 0.5 s per max_token, per wave of
    # 256 sequences (a stalled endpoint is then noticed in minutes, a slow one is not cut off).
    request_timeout_s: float = 0.0
    max_attempts: int = 6
    # Consecutive failed requests (all slots together) that open an endpoint's circuit: its
    # batches in flight are released to other workers and it is probed until it answers.
    circuit_failures: int = 5
    probe_timeout_s: float = 10.0
    # A burst worker gives up on an endpoint that answered once and has not answered since
    # for this long (its engine died): its work is left to others; with every endpoint of it
    # so, the worker exits 1 naming them (not burning an allocation). 0: never.
    endpoint_dead_s: float = 300.0
    # An entry whose runs never ended more often than this (its worker died, its server hung
    # or dropped the request) is dead-lettered.
    max_deliveries: int = 8
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    # How long an idle drain loop blocks on a stream before looking at other jobs.
    poll_ms: int = 200
    api_key: str = "EMPTY"
    worker_name: str = ""
    # Grace period for in-flight batches on SIGTERM/SIGINT before they are cancelled.
    shutdown_grace_s: float = 30.0
    # An entry unacknowledged this long is presumed orphaned (its worker died) and reclaimed.
    # Live workers refresh their claims every claim_idle_ms / 3, so slow batches are never stolen.
    claim_idle_ms: int = 60_000
    # How often (s) the worker re-reads the job registry for new and finished jobs.
    jobs_refresh_s: float = 1.0
    # How often (s) each endpoint's served models (/v1/models) are re-read; a 404 for a model
    # re-reads them sooner.
    models_refresh_s: float = 30.0
    # The user aggregators (``package.module:function``, or ``package.module:*``) this
    # worker may import for a job's ``--reduce package.module:function``; none by default.
    reduce_functions: tuple[str, ...] = ()
    # The tools (``package.module:function``, or ``package.module:*``) a tool runner
    # (``swarm-tools``) may run for agents; none by default. Each call is cut at
    # ``tool_timeout_s``, its error then the tool's answer.
    tools: tuple[str, ...] = ()
    tool_timeout_s: float = 60.0
    # Tool calls one runner process runs at once, for each tool it serves.
    tool_concurrency: int = 64
    # How long an agent waits for a tool call that no live runner serves (no runner's
    # SWARM_TOOLS allows its tool) before it fails with that reason; a call a runner serves
    # waits for its answer however long its queue is.
    tool_wait_s: float = 600.0
    # The most of a tool's answer (UTF-8 bytes) kept and handed to the model: beyond it the
    # model gets the head and a note saying so (a 10 MB answer once took Redis to 38 MB).
    tool_max_bytes: int = 1_048_576
    # How often (s) each worker publishes its per-endpoint figures for swarm-status.
    stats_period_s: float = 2.0
    # At a job's tail (every entry delivered), an endpoint with nothing else to do runs copies
    # of the batches other endpoints still hold, each entry once; the first commit wins.
    speculate: bool = True
    # An agent's next turn waits this long in the lane of the endpoint that served its turn
    # before (whose engine holds its prefix) before an endpoint with nothing else to do takes
    # it; 0 takes it at once.
    lane_wait_ms: int = 3_000
    # An agent's turns that wait in a busy engine's queue (not started: vLLM serves requests
    # of one priority first come, first served) are handed on to an endpoint that has nothing
    # else to do and answers at least 1.5 times as fast, which starts them at once (their
    # prefix computed again there).
    hand_on: bool = True
    # Handed on too, to an endpoint with nothing to do that decodes at least 1.5 times as
    # fast: a batch of turns sent to this engine this recently, none of it answered yet,
    # though it has begun (at a job's tail nothing waits in a slow engine while the fast ones
    # idle); what it decoded is thrown away, a few tokens a turn. Its decoding, not its
    # queue, is compared: between equal engines an idle one is not worth a turn's prefix.
    # 0: only turns still waiting.
    hand_on_young_ms: int = 800
    # Prometheus metrics of the worker on http://metrics_addr:metrics_port/metrics (0: off).
    metrics_port: int = 0
    metrics_addr: str = "0.0.0.0"
    # The response cache (jobs enqueued with --cache): an answer unused this long is dropped,
    # and beyond this many answers the least recently used go first. Every worker of one
    # Redis should share them.
    cache_ttl_s: float = 30 * 86400.0
    cache_max_answers: int = 1_000_000
    # swarm-gateway (the OpenAI Batch API): where uploaded and output files' bytes live (a
    # directory every gateway process of the fleet reaches; "": ~/.local/share/swarm-queue/
    # gateway), and the file of API keys, one "KEY PROJECT" a line ("": no keys, localhost only).
    gateway_dir: str = ""
    gateway_keys: str = ""

    def request_timeout_for(self, n_prompts: int, max_tokens: int) -> float:
        """The timeout of one request of ``n_prompts`` prompts (see ``request_timeout_s``)."""
        if self.request_timeout_s > 0:
            return self.request_timeout_s
        waves = max(1, -(-n_prompts // 256))
        return (120.0 + 0.5 * max_tokens) * waves

    def __post_init__(self) -> None:
        _validate_redis_url(self.redis_url)
        if self.redis_cluster and self.redis_url.startswith("unix:"):
            raise ConfigError("SWARM_REDIS_CLUSTER needs a redis:// or rediss:// URL of a node")
        if self.redis_ca_file and not Path(self.redis_ca_file).is_file():
            raise ConfigError(f"SWARM_REDIS_CA_FILE {self.redis_ca_file}: no such file")
        Keys(self.prefix)  # validates the prefix
        self._check_bounds()
        for var, names in (
            ("SWARM_REDUCE_FUNCTIONS", self.reduce_functions),
            ("SWARM_TOOLS", self.tools),
        ):
            for name in names:
                if not _FUNCTION_RE.fullmatch(name):
                    raise ConfigError(
                        f"{var}: {name!r} is not package.module:function (or package.module:*)"
                    )
        if self.tool_concurrency < 1:
            raise ConfigError(f"SWARM_TOOL_CONCURRENCY must be >= 1, got {self.tool_concurrency}")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ConfigError("backoff_cap_s must be >= backoff_base_s")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"SWARM_METRICS_PORT must be a port (1-65535; 0 or unset: off), "
                f"got {self.metrics_port}"
            )

    def _check_bounds(self) -> None:
        """Every count at least 1, every period above 0, the rest at least 0."""
        at_least_1 = (
            "batch_size",
            "inflight",
            "max_attempts",
            "poll_ms",
            "claim_idle_ms",
            "circuit_failures",
            "max_deliveries",
            "cache_max_answers",
            "tool_max_bytes",
        )
        above_0 = (
            "probe_timeout_s",
            "backoff_base_s",
            "backoff_cap_s",
            "jobs_refresh_s",
            "models_refresh_s",
            "stats_period_s",
            "adapt_period_s",
            "reduce_timeout_s",
            "cache_ttl_s",
            "tool_timeout_s",
            "tool_wait_s",
        )
        for name in at_least_1:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size > MAX_BATCH_SIZE:
            raise ConfigError(
                f"batch_size must be <= {MAX_BATCH_SIZE} (one Redis script call takes a batch), "
                f"got {self.batch_size}"
            )
        if self.inflight_max < 0:
            raise ConfigError(
                f"inflight_max must be >= 0 (0: no adaptation), got {self.inflight_max}"
            )
        for name in ("request_timeout_s", "lane_wait_ms", "endpoint_dead_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in above_0:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    @property
    def redis_url_masked(self) -> str:
        return mask_url(self.redis_url)

    def __repr__(self) -> str:  # never print secrets
        return (
            f"Settings(redis_url={self.redis_url_masked!r}, prefix={self.prefix!r}, "
            f"endpoints={[e.url for e in self.endpoints]!r}, batch_size={self.batch_size}, "
            f"inflight={self.inflight}, worker_name={self.worker_name!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> Settings:
        """Build settings from ``SWARM_*`` variables, then apply non-None ``overrides``."""
        values: dict[str, Any] = {}
        simple: dict[str, tuple[str, Callable[[str], Any]]] = {
            "SWARM_REDIS_URL": ("redis_url", str),
            "SWARM_REDIS_CA_FILE": ("redis_ca_file", str),
            "SWARM_REDIS_CLUSTER": ("redis_cluster", boolean),
            "SWARM_PREFIX": ("prefix", str),
            "SWARM_BATCH_SIZE": ("batch_size", int),
            "SWARM_INFLIGHT": ("inflight", int),
            "SWARM_INFLIGHT_MAX": ("inflight_max", int),
            "SWARM_ADAPT_PERIOD_S": ("adapt_period_s", float),
            "SWARM_REDUCE_TIMEOUT_S": ("reduce_timeout_s", float),
            "SWARM_REQUEST_TIMEOUT_S": ("request_timeout_s", float),
            "SWARM_MAX_ATTEMPTS": ("max_attempts", int),
            "SWARM_CIRCUIT_FAILURES": ("circuit_failures", int),
            "SWARM_PROBE_TIMEOUT_S": ("probe_timeout_s", float),
            "SWARM_ENDPOINT_DEAD_S": ("endpoint_dead_s", float),
            "SWARM_MAX_DELIVERIES": ("max_deliveries", int),
            "SWARM_POLL_MS": ("poll_ms", int),
            "SWARM_API_KEY": ("api_key", str),
            "SWARM_WORKER_NAME": ("worker_name", str),
            "SWARM_SHUTDOWN_GRACE_S": ("shutdown_grace_s", float),
            "SWARM_CLAIM_IDLE_MS": ("claim_idle_ms", int),
            "SWARM_JOBS_REFRESH_S": ("jobs_refresh_s", float),
            "SWARM_MODELS_REFRESH_S": ("models_refresh_s", float),
            "SWARM_STATS_PERIOD_S": ("stats_period_s", float),
            "SWARM_BACKOFF_BASE_S": ("backoff_base_s", float),
            "SWARM_BACKOFF_CAP_S": ("backoff_cap_s", float),
            "SWARM_SPECULATE": ("speculate", boolean),
            "SWARM_HAND_ON": ("hand_on", boolean),
            "SWARM_HAND_ON_YOUNG_MS": ("hand_on_young_ms", int),
            "SWARM_LANE_WAIT_MS": ("lane_wait_ms", int),
            "SWARM_METRICS_PORT": ("metrics_port", int),
            "SWARM_METRICS_ADDR": ("metrics_addr", str),
            "SWARM_CACHE_TTL_S": ("cache_ttl_s", float),
            "SWARM_CACHE_MAX_ANSWERS": ("cache_max_answers", int),
            "SWARM_TOOL_TIMEOUT_S": ("tool_timeout_s", float),
            "SWARM_TOOL_CONCURRENCY": ("tool_concurrency", int),
            "SWARM_TOOL_WAIT_S": ("tool_wait_s", float),
            "SWARM_TOOL_MAX_BYTES": ("tool_max_bytes", int),
            "SWARM_GATEWAY_DIR": ("gateway_dir", str),
            "SWARM_GATEWAY_KEYS": ("gateway_keys", str),
        }
        for var, (field, typ) in simple.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                values[field] = typ(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw!r} is not a valid {typ.__name__}") from None
        for var, field in (
            ("SWARM_REDUCE_FUNCTIONS", "reduce_functions"),
            ("SWARM_TOOLS", "tools"),
        ):
            functions = [f.strip() for f in env.get(var, "").split(",")]
            if any(functions):
                values[field] = tuple(f for f in functions if f)
        endpoints = _endpoints_from_env(env)
        if endpoints:
            values["endpoints"] = tuple(endpoints)
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["redis_defaulted"] = "redis_url" not in values
        if not values.get("worker_name"):
            values["worker_name"] = socket.gethostname()
        try:
            return cls(**values)
        except (TypeError, msgspec.ValidationError) as exc:
            raise ConfigError(str(exc)) from None


def boolean(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case), as environment switches are written."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _endpoints_from_env(env: Mapping[str, str]) -> list[Endpoint]:
    csv = env.get("SWARM_ENDPOINTS", "").strip()
    hostfile = env.get("SWARM_HOSTFILE", "").strip()
    if csv and hostfile:
        raise ConfigError("set SWARM_ENDPOINTS or SWARM_HOSTFILE, not both")
    filters = env.get("SWARM_ENDPOINT_TAG", "").strip() or env.get("SWARM_ENDPOINT_HOST", "")
    if filters.strip() and not hostfile:
        raise ConfigError("SWARM_ENDPOINT_TAG and SWARM_ENDPOINT_HOST filter SWARM_HOSTFILE")
    if csv:
        return parse_endpoints(csv)
    if hostfile:
        path = Path(hostfile)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read SWARM_HOSTFILE {hostfile}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"SWARM_HOSTFILE {hostfile}: not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from None
        return select_endpoints(
            parse_hostfile(text, source=hostfile),
            tag=env.get("SWARM_ENDPOINT_TAG", "").strip(),
            host=env.get("SWARM_ENDPOINT_HOST", "").strip(),
            source=hostfile,
        )
    return []


def select_endpoints(
    endpoints: list[Endpoint], *, tag: str = "", host: str = "", source: str = "hostfile"
) -> list[Endpoint]:
    """The hostfile endpoints with tag ``key=value`` and on ``host`` (short or full name);
    an empty filter keeps all. ConfigError when nothing is left."""
    if tag:
        key, sep, value = tag.partition("=")
        if not sep or not key:
            raise ConfigError(f"SWARM_ENDPOINT_TAG={tag!r}: expected key=value")
        endpoints = [e for e in endpoints if e.tags.get(key) == value]
    if host:
        short = host.split(".")[0]
        endpoints = [
            e for e in endpoints if (urlsplit(e.url).hostname or "").split(".")[0] == short
        ]
    if not endpoints:
        wanted = " and ".join(
            x for x in (f"tag {tag}" if tag else "", f"host {host}" if host else "") if x
        )
        raise ConfigError(f"{source}: no endpoint with {wanted}")
    return endpoints
