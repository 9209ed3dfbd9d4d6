"""Settings, parsed once at each entry point into one typed, immutable object.

Nothing else in swarm-queue reads ``os.environ``: the commands call :meth:`Settings.from_env`
with the environment and their command-line overrides, and hand the result down.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from swarm_queue.common.declare import declared, say, table
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.hostfile import Endpoint, endpoints_from_env
from swarm_queue.common.keys import DEFAULT_PREFIX, Keys
from swarm_queue.common.redisurl import mask_url, validate_redis_url

__all__ = ["DEFAULT_REDIS_URL", "Settings", "mask_url"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The largest batch: a batch's entries and results go through one Redis script call each, and
# Redis's Lua expands at most ~8,000 values into one command (a batch of 5,000 failed every
# commit). Engines run a few hundred sequences at once: more in one request only waits.
MAX_BATCH_SIZE = 2048

_FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*:(?:[A-Za-z_]\w*|\*)")


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every tunable of swarm-queue, with units in the names. Each is declared once, here:
    its type, default and bounds, one line of doc and who reads it; its variable
    (``SWARM_`` and its name in capitals), its parsing, its checks and docs/SETTINGS.md are
    derived from that declaration."""

    redis_url: Annotated[
        str,
        say(
            "`redis://`, `rediss://` (TLS), `unix://` (a socket, as `swarm-redis` gives), password "
            "in the URL; never printed unmasked. A Redis never reached fails within 5 s; one that "
            "was reached is waited for",
            default="`redis://127.0.0.1:6379/0` (said by every command that uses it)",
            read_by="every command",
        ),
    ] = DEFAULT_REDIS_URL
    redis_ca_file: Annotated[
        str,
        say(
            "with `rediss://`: the CA certificate file to verify the server with (default: the "
            "system's; docs/SECURITY.md)",
            read_by="every command",
        ),
    ] = ""
    redis_cluster: Annotated[
        bool,
        say(
            "`on`: `SWARM_REDIS_URL` names one node of a Redis Cluster, whose slot map the client "
            "follows; every command needs it (docs/SCALE.md)",
            read_by="every command",
        ),
    ] = False
    prefix: Annotated[
        str, say("key prefix, e.g. one per project on a shared Redis", read_by="every command")
    ] = DEFAULT_PREFIX
    batch_size: Annotated[
        int,
        say(
            "prompts per `/v1/completions` request (at most 2048: a batch goes through one Redis "
            "script call)",
            ge=1,
            le=MAX_BATCH_SIZE,
        ),
    ] = 32
    inflight_max: Annotated[
        int,
        say(
            "requests in flight per endpoint follow vLLM's `/metrics` gauges, from 2 up to this: "
            "engines full, queues short, first results at once (docs/BENCHMARKS.md); 0 turns "
            "this off",
            ge=0,
        ),
    ] = 32
    inflight: Annotated[
        int,
        say(
            "requests in flight when the endpoint has no vLLM gauges (another server, a proxy) or "
            "adaptation is off; batch x in-flight must exceed `max_num_seqs` (256) by the ratio of "
            "longest to mean output, since a list request holds its slots until its longest "
            "sequence ends",
            ge=1,
        ),
    ] = 16
    max_attempts: Annotated[
        int,
        say(
            "tries on connection errors, timeouts, 429, 502-504 and unusable answers before "
            "handing the batch to other workers; an HTTP 500 bisects a list and is blamed on a "
            "prompt alone that failed all its tries if the endpoint then passes its probe "
            "(docs/RELIABILITY.md, the liveness rule)",
            ge=1,
        ),
    ] = 6
    circuit_failures: Annotated[
        int,
        say(
            "consecutive failed requests (all slots together) that open an endpoint's circuit: "
            "its batches released, the endpoint probed until it answers",
            ge=1,
        ),
    ] = 5
    probe_timeout_s: Annotated[float, say("how long a probe of an endpoint may take", gt=0)] = 10.0
    endpoint_dead_s: Annotated[
        float,
        say(
            "a `--burst` worker gives up on an endpoint that answered before and has not answered "
            "since for this long (its engine died), leaving its work to others; when every "
            "endpoint of the worker died it exits 1 naming them. An endpoint that never answered "
            "(a model still loading) is waited for. 0: never",
            ge=0,
        ),
    ] = 300.0
    request_timeout_s: Annotated[
        float,
        say(
            "per request; 0 (auto): 120 s + 0.5 s per `max_tokens`, per wave of 256 prompts (a "
            "stalled endpoint is noticed in minutes, a slow one is not cut off)",
            default="auto",
            ge=0,
        ),
    ] = 0.0
    max_deliveries: Annotated[
        int,
        say(
            "a prompt whose runs never ended more often than this (its worker died, or its server "
            "hung or dropped the request: no answer within the timeout, the connection cut) is "
            "dead-lettered; from the second such run it runs alone (a refused connection, an "
            "error status, a restart do not count)",
            ge=1,
        ),
    ] = 8
    claim_idle_ms: Annotated[
        int,
        say(
            "an unacknowledged batch (or tool call) idle this long is taken over (its worker or "
            "runner died); live ones refresh their claims every third of it",
            ge=1,
            read_by="workers and `swarm-tools`",
        ),
    ] = 60_000
    backoff_base_s: Annotated[float, say("the first retry's delay (doubling, jittered)", gt=0)] = (
        0.5
    )
    backoff_cap_s: Annotated[float, say("the longest delay between retries", gt=0)] = 30.0
    poll_ms: Annotated[
        int,
        say("how long an idle drain loop blocks on a stream before looking at other jobs", ge=1),
    ] = 200
    speculate: Annotated[
        bool,
        say(
            "at a job's tail, once every prompt is out, an endpoint with nothing in flight runs "
            "copies of the batches other endpoints have held longer than its own take (each "
            "prompt copied once; the first answer wins, nothing is counted twice): a slow or "
            "stuck node no longer sets the job's end. `off` turns it off",
        ),
    ] = True
    lane_wait_ms: Annotated[
        int,
        say(
            "an agent's next turn waits in the lane of the endpoint that served its turn before "
            "(its prefix is in that engine's cache) up to this long; then any endpoint with "
            "nothing else to do takes it. 0 takes it at once",
            ge=0,
        ),
    ] = 3_000
    hand_on: Annotated[
        bool,
        say(
            "an agent's turns waiting in a busy engine's queue (sent, not started) are handed to "
            "the open lane while another endpoint has nothing else to do and answers at least 1.5 "
            "times as fast; the prefix is computed again there (docs/BENCHMARKS.md, sections 12 "
            "and 14). `off` keeps every turn in its lane until `SWARM_LANE_WAIT_MS`",
        ),
    ] = True
    hand_on_young_ms: Annotated[
        int,
        say(
            "with `SWARM_HAND_ON`, also the newest batch of turns sent to the busy engine this "
            "recently, none of it answered though begun, to an endpoint with nothing to do that "
            "decodes at least 1.5 times as fast (what it decoded is thrown away). 0: only turns "
            "still waiting",
            ge=0,
        ),
    ] = 800
    shutdown_grace_s: Annotated[
        float,
        say(
            "on SIGTERM/SIGINT: stop taking work, let batches in flight finish this long, then "
            "cancel",
            ge=0,
        ),
    ] = 30.0
    api_key: Annotated[str, say("sent to the endpoints as the bearer token")] = "EMPTY"
    worker_name: Annotated[
        str,
        say(
            "names the worker's consumers; a restarted worker with the same name finishes its own "
            "leftovers first",
            default="host name",
        ),
    ] = ""
    jobs_refresh_s: Annotated[
        float,
        say("how often the worker re-reads the job registry for new and finished jobs", gt=0),
    ] = 1.0
    models_refresh_s: Annotated[
        float,
        say(
            "how often each endpoint's served models are re-read from `/v1/models` (sooner after "
            "a 404 for a model)",
            gt=0,
        ),
    ] = 30.0
    stats_period_s: Annotated[
        float,
        say(
            "how often each worker publishes its per-endpoint figures for `swarm-status` and the "
            "models each endpoint serves",
            gt=0,
        ),
    ] = 2.0
    reduce_functions: Annotated[
        tuple[str, ...],
        say(
            "the user aggregators this worker may import, comma-separated "
            "`package.module:function` or `package.module:*`; none by default",
        ),
    ] = ()
    reduce_timeout_s: Annotated[
        float,
        say(
            "the longest one reduce step may take (a tree's level grouped and queued, an "
            "aggregator run); past it the reduce ends with that error",
            gt=0,
        ),
    ] = 600.0
    metrics_port: Annotated[
        int,
        say(
            "serve the worker's Prometheus metrics at `/metrics` on this port, one page for all "
            "its endpoints (docs/METRICS.md); 0: off",
            default="off",
            ge=0,
            le=65535,
        ),
    ] = 0
    metrics_addr: Annotated[
        str, say("the address that page listens on (`127.0.0.1`: this host only)")
    ] = "0.0.0.0"
    cache_ttl_s: Annotated[
        float,
        say(
            "the response cache drops an answer unused (not written or read) for this long",
            default="2592000 (30 days)",
            gt=0,
        ),
    ] = 30 * 86400.0
    cache_max_answers: Annotated[
        int,
        say(
            "beyond this many answers the cache evicts the least recently used first; give every "
            "worker of one Redis the same value",
            ge=1,
        ),
    ] = 1_000_000
    tools: Annotated[
        tuple[str, ...],
        say(
            "the tools it may run for agents, `package.module:function` or `package.module:*`, "
            "comma-separated; none by default",
            read_by="`swarm-tools`",
        ),
    ] = ()
    tool_timeout_s: Annotated[
        float,
        say(
            "the longest a call runs (the runner: its error then the tool's answer), and from it "
            "how long a call's claim lasts unrenewed (the workers)",
            gt=0,
            read_by="`swarm-tools` and workers",
        ),
    ] = 60.0
    tool_concurrency: Annotated[
        int,
        say(
            "calls one runner process runs at once, for each tool it serves",
            ge=1,
            read_by="`swarm-tools`",
        ),
    ] = 64
    tool_max_bytes: Annotated[
        int,
        say(
            "an answer longer than this (UTF-8 bytes) is cut, with a note to the model (a 10 MB "
            "answer once took Redis to 38 MB)",
            ge=1,
            read_by="`swarm-tools`",
        ),
    ] = 1_048_576
    tool_wait_s: Annotated[
        float,
        say(
            "an agent waiting on a tool no live runner serves fails after this, naming the tool; "
            "a call a runner serves waits for its answer however long its queue is",
            gt=0,
        ),
    ] = 600.0
    gateway_dir: Annotated[
        str,
        say(
            "where uploaded and output files' bytes live, a directory every gateway process "
            "reaches",
            default="`~/.local/share/swarm-queue/gateway`",
            read_by="`swarm-gateway`",
        ),
    ] = ""
    gateway_keys: Annotated[
        str,
        say(
            "the file of API keys, one `KEY PROJECT` a line (docs/GATEWAY.md); none: localhost "
            "only, no keys",
            read_by="`swarm-gateway`",
        ),
    ] = ""
    # Not from a variable of its own: the endpoints (SWARM_ENDPOINTS or SWARM_HOSTFILE, see
    # common/hostfile.py), and whether redis_url is the default because none was given (what
    # commands then say).
    endpoints: tuple[Endpoint, ...] = ()
    redis_defaulted: bool = False
    # Internal tuning, no variable: how often (s) the window of requests in flight is adapted
    # to the engine's gauges, which vLLM updates about this often (tests make it shorter).
    adapt_period_s: float = 0.25

    def request_timeout_for(self, n_prompts: int, max_tokens: int) -> float:
        """The timeout of one request of ``n_prompts`` prompts (see ``request_timeout_s``)."""
        if self.request_timeout_s > 0:
            return self.request_timeout_s
        waves = max(1, -(-n_prompts // 256))
        return (120.0 + 0.5 * max_tokens) * waves

    def __post_init__(self) -> None:
        validate_redis_url(self.redis_url)
        if self.redis_cluster and self.redis_url.startswith("unix:"):
            raise ConfigError("SWARM_REDIS_CLUSTER needs a redis:// or rediss:// URL of a node")
        if self.redis_ca_file and not Path(self.redis_ca_file).is_file():
            raise ConfigError(f"SWARM_REDIS_CA_FILE {self.redis_ca_file}: no such file")
        Keys(self.prefix)  # validates the prefix
        for setting in _SETTINGS:
            setting.check(getattr(self, setting.name))
        for var, names in (
            ("SWARM_REDUCE_FUNCTIONS", self.reduce_functions),
            ("SWARM_TOOLS", self.tools),
        ):
            for name in names:
                if not _FUNCTION_RE.fullmatch(name):
                    raise ConfigError(
                        f"{var}: {name!r} is not package.module:function (or package.module:*)"
                    )
        if self.backoff_cap_s < self.backoff_base_s:
            raise ConfigError("backoff_cap_s must be >= backoff_base_s")

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
        for setting in _SETTINGS:
            raw = env.get(setting.var, "").strip()
            if raw:
                values[setting.name] = setting.parse(raw)
        endpoints = endpoints_from_env(env)
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


_SETTINGS = declared(Settings)


# The endpoint variables, read together (common/hostfile.py), and swarm-redis's own directory.
_ENDPOINT_ROWS = """\
| `SWARM_ENDPOINTS` | | workers | comma-separated base URLs, e.g. `http://127.0.0.1:8000` |
| `SWARM_HOSTFILE` | | workers | instead: the Aurora-Swarm hostfile \
(`host<TAB>port<TAB>key=value...`, port optional, default 8000) |
| `SWARM_ENDPOINT_TAG` / `SWARM_ENDPOINT_HOST` | | workers | keep only the hostfile's endpoints \
with tag `key=value` / on this host (docs/HPC.md) |
| `SWARM_REDIS_DIR` | `~/.local/share/swarm-queue/redis` | `swarm-redis` | where `swarm-redis` \
keeps its Redis (its `--dir` wins) |"""


def settings_page() -> str:
    """docs/SETTINGS.md, derived from the declarations (``python -m
    swarm_queue.common.settings`` prints it; a test holds the file to it)."""
    return (
        "# Settings\n\nEvery setting of swarm-queue, read from the environment by each "
        "process that uses it (a command's flag, where it has one, wins). Generated from the "
        "declarations in `swarm_queue/common/settings.py` by `python -m "
        "swarm_queue.common.settings`: edit those, not this page.\n\n"
        "| variable | default | read by | meaning |\n| --- | --- | --- | --- |\n"
        f"{_ENDPOINT_ROWS}\n{table(_SETTINGS)}\n"
    )


if __name__ == "__main__":
    print(settings_page(), end="")
