"""The connection to Redis: one server or a cluster, redis-py's own retries riding out a
restart or a failover, the first contact bounded, TLS. Its errors become swarm-queue's at one
boundary (:mod:`common.store.boundary`)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
import weakref
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from swarm_queue.common.errors import (
    StoreUnavailable,
)
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store.packing import packed_by_hiredis

__all__ = [
    "NO_CLIENT_SETINFO",
    "RETRY_ON",
    "Client",
    "cluster_node_of",
    "connect",
    "connection_losses",
    "first_contact_failure",
    "primary_of_slot",
    "reachable",
    "redis_code",
    "redis_retry",
]

log = logging.getLogger("swarm.store")

# One Redis server, or a Redis Cluster (every key of a job shares one hash slot).
Client = aioredis.Redis | RedisCluster

# Retried by redis-py itself: a Redis restart (or failover) of up to about a minute and a half
# is ridden out inside a single command; swarm-queue's own loops retry beyond that.
# OSError matters: redis-py's connect retry only catches its own ConnectionError, but a refused
# connection (Redis restarting) arrives as the builtin ConnectionRefusedError.
RETRY_ON: list[type[Exception]] = [RedisConnectionError, RedisTimeoutError, OSError]


class _Refused(Exception):
    """Carries an authentication error past the retry loop, which would otherwise retry it
    (redis-py's AuthenticationError is a ConnectionError)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


# How long a client that has never had an answer from Redis waits for its first: a wrong host
# or port (or a listener that is no Redis and never answers) fails within it, naming the URL,
# instead of waiting out the patience meant for a Redis that restarts under a running job.
FIRST_CONTACT_S = 5.0


class _Health:
    """Whether Redis answers now: ``failing_since`` is the monotonic time of the first failed
    attempt since the last answer (None: it answers). ``answered``: whether Redis ever replied
    (until then, attempts are bounded by the first contact's time), ``first_try``: when the
    client first tried. ``url`` (masked) is what it says when Redis stops answering and when
    it answers again."""

    def __init__(self, url: str = "", *, answered: bool = True) -> None:
        self.url = url
        self.failing_since: float | None = None
        self.answered = answered
        self.first_try: float | None = None
        self._said = False  # whether the outage under way was said
        # Connections lost: attempts failed on one (redis-py tries them again on a new one),
        # and connections made again (redis-py reconnects one it finds closed before using
        # it, silently). A reply lost with its connection may have delivered stream entries
        # no one received.
        self.losses = 0
        self.connected: weakref.WeakSet[Any] = weakref.WeakSet()  # connections made once

    def failed(self) -> None:
        self.losses += 1
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        # Said once it lasts: a restart's stale pooled connections each fail once, and a
        # blip of a few milliseconds is no news.
        elif not self._said and self.answered and self.url and now - self.failing_since >= 1:
            self._said = True
            log.warning("Redis at %s does not answer: reconnecting", self.url)

    def ok(self) -> None:
        if self._said and self.failing_since is not None:
            log.warning(
                "Redis at %s answers again after %.1f s",
                self.url,
                time.monotonic() - self.failing_since,
            )
        self._said = False
        self.failing_since = None


# Set while an attempt runs under the first contact's deadline: the attempts redis-py nests in
# it (a connect, a health check) run under that one deadline, not one of their own (two
# deadlines expiring together lose a cancellation in Python 3.11's asyncio.timeout).
_BOUNDED: contextvars.ContextVar[bool] = contextvars.ContextVar("_BOUNDED", default=False)


class _NeverReached(Exception):
    """Carries the last failure of a client that never reached Redis within
    :data:`FIRST_CONTACT_S` past the retry loop, which would otherwise go on."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__(str(error))
        self.error = error


class _FirstContactFailed(RedisConnectionError):
    """Redis never answered within :data:`FIRST_CONTACT_S`."""


class _Retry(Retry):
    """redis-py's retry, recording in ``health`` whether Redis answers now: what a worker
    reports at once, while a command still waits out an outage. redis-py gives each
    connection a deep copy of its client's retry; the copies share the client's record.
    Until Redis first answers, every attempt ends by :data:`FIRST_CONTACT_S` after the first."""

    def __init__(
        self, retries: int, health: _Health | None = None, *, slot_moves: bool = False
    ) -> None:
        super().__init__(ExponentialBackoff(cap=5.0, base=0.05), retries)
        self.retries = retries
        self.health = health or _Health()
        self.slot_moves = slot_moves

    def __deepcopy__(self, memo: dict[int, Any]) -> _Retry:
        return _Retry(self.retries, self.health, slot_moves=self.slot_moves)

    async def _first_contact(self, do: Any) -> Any:
        """``do()`` bounded by what is left of the first contact's time."""
        health = self.health
        if health.first_try is None:
            health.first_try = time.monotonic()
        left = health.first_try + FIRST_CONTACT_S - time.monotonic()
        if left <= 0:
            raise _NeverReached(None)
        if _BOUNDED.get():  # inside a bounded attempt (redis-py's connect, its health check)
            return await do()
        token = _BOUNDED.set(True)
        deadline = asyncio.timeout(left)
        try:
            async with deadline:
                return await do()
        except TimeoutError:
            if deadline.expired():
                raise _NeverReached(None) from None
            raise
        finally:
            _BOUNDED.reset(token)

    async def on_connect(self, connection: Any) -> None:
        """A new connection's handshake (AUTH, SELECT...; redis-py's ``redis_connect_func``).
        Until Redis first answers, it is bounded like a command (redis-py runs it outside any
        retry: a listener that is no Redis would hold it for ever), and ends with a PING
        whose reply is the first answer: a TCP connection accepted is not one."""
        if connection in self.health.connected:
            self.health.losses += 1  # made again: the one before was lost
        else:
            self.health.connected.add(connection)
        if self.health.answered:
            await connection.on_connect()
            return

        async def handshake() -> None:
            await connection.on_connect()
            await connection.send_command("PING", check_health=False)
            await connection.read_response()

        try:
            await self._first_contact(handshake)
        except _NeverReached:
            self.health.failed()
            raise _FirstContactFailed(_no_answer(None)) from None
        self.health.answered = True

    async def call_with_retry(self, do: Any, fail: Any) -> Any:
        last: list[BaseException] = []

        async def once() -> Any:
            try:
                result = await (do() if self.health.answered else self._first_contact(do))
            except (AuthenticationError, AuthorizationError) as exc:
                raise _Refused(exc) from None
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                last[:] = [exc]
                self.health.failed()
                raise
            except ResponseError as exc:  # an error reply: Redis answered
                self.health.ok()
                if self.slot_moves and redis_code(exc) in _SLOT_MOVES:
                    # A client that knows no cluster, on a node that no longer serves the
                    # slot (or a cluster failing over): another try, on a new connection.
                    raise _SlotMoved(str(exc)) from None
                raise
            except _NeverReached:
                self.health.failed()
                raise
            except RedisError:
                self.health.ok()
                raise
            self.health.ok()
            return result

        try:
            return await super().call_with_retry(once, fail)
        except _Refused as refused:
            raise refused.error from None
        except _NeverReached as never:
            why = never.error or (last[0] if last else None)
            said = first_contact_failure(why)
            if said is not None:  # said by an inner retry (the connect's)
                raise said from None
            raise _FirstContactFailed(_no_answer(why)) from None


def first_contact_failure(exc: BaseException | None) -> _FirstContactFailed | None:
    """The first-contact failure ``exc`` is or wraps (redis-py wraps what a connect raises
    in a ConnectionError of its own), if any."""
    while exc is not None:
        if isinstance(exc, _FirstContactFailed):
            return exc
        exc = exc.__cause__
    return None


def _no_answer(why: BaseException | None) -> str:
    """What a client that never reached Redis says."""
    return (
        f"no answer within {FIRST_CONTACT_S:g} s"
        + (f" ({type(why).__name__}: {why})" if why and str(why) else "")
        + ": is the host and port right, and is a Redis listening there?"
    )


class _SlotMoved(RedisConnectionError):
    """A slot's primary moved (MOVED, ASK) or the cluster is failing over (CLUSTERDOWN,
    TRYAGAIN): for a connection that follows one slot's primary, a connection to drop and
    make again, where the cluster says."""


# The error codes of a slot that moved, or of a cluster failing over.
_SLOT_MOVES = frozenset({"MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN"})


def redis_retry(retries: int = 30, *, slot_moves: bool = False) -> Retry:
    """Capped exponential backoff for reconnecting to Redis (shared with arq's pool); wrong
    credentials fail at once, since no wait will fix them. ``slot_moves``: a client that
    follows one Redis Cluster slot's primary (arq's) also tries again, reconnected, when
    the slot moved or the cluster fails over."""
    return _Retry(retries, slot_moves=slot_moves)


# redis-py names itself on each new connection (CLIENT SETINFO), ignoring a refusal; an ACL
# without the dangerous commands refuses CLIENT, and each refusal lands in Redis's ACL LOG,
# which an operator reads as a violation.
NO_CLIENT_SETINFO: dict[str, Any] = {"lib_name": None, "lib_version": None}


# The retry of each client connect() made: what reachable() reads.
_RETRIES: weakref.WeakKeyDictionary[Client, _Retry] = weakref.WeakKeyDictionary()


def reachable(client: Client) -> bool:
    """Whether ``client``'s last attempt at Redis was answered (a client made by
    :func:`connect`; any other counts as reachable)."""
    retry = _RETRIES.get(client)
    return retry is None or retry.health.failing_since is None


def connection_losses(client: Client) -> int:
    """How many of ``client``'s attempts failed on a lost connection so far (a client made by
    :func:`connect`; any other: 0)."""
    retry = _RETRIES.get(client)
    return 0 if retry is None else retry.health.losses


# How long a command waits for a free connection of a bounded pool before it is an outage
# (and retried as one): far longer than any command holds one (a blocking read: a poll).
POOL_WAIT_S = 30

# How many times a cluster client re-reads the cluster's layout and tries a command again
# after a node fails or the cluster is down (a failover under way), before it says so.
CLUSTER_TRIES = 10


def connect(
    url: str,
    *,
    patient: bool = True,
    ca_file: str = "",
    cluster: bool = False,
    connections: int | None = None,
) -> Client:
    """A Redis client for ``url`` that rides out connection loss with capped backoff.

    ``patient`` (workers, producer, collector) waits out a Redis restart of a minute or two;
    otherwise (one-shot commands such as swarm-status) a missing Redis is reported at once.
    Responses stay bytes (``decode_responses=False``): payloads are msgpack. ``ca_file``
    verifies a ``rediss://`` server against that CA. ``cluster``: ``url`` is one node of a
    Redis Cluster, and the client finds the others from it. ``connections``: at most that
    many connections to a lone Redis, a command waiting for one to be free (None: as many as
    commands run at once).
    """
    # On a cluster, a node that stops answering is given up on at once: the cluster layer
    # then asks the others for the slots' new primaries (a failover) and tries there, and the
    # callers' own loops wait out a cluster that is down. A node retried for minutes (the
    # patience a lone Redis restarting deserves) held every command on a dead primary.
    # A lone Redis's first contact is bounded (see FIRST_CONTACT_S); a cluster client makes
    # its own handshakes, and goes by its own tries.
    retry = _Retry(2 if cluster else 30 if patient else 3, _Health(mask_url(url), answered=cluster))
    options: dict[str, Any] = {
        "retry": retry,
        "retry_on_error": RETRY_ON,
        "health_check_interval": 30,
        # (Not on a cluster: its clients without a name were seen to hang at close after a
        # failover, 4 runs of 6 in test_cluster_failover, none of 7 with it.)
        **({} if cluster else NO_CLIENT_SETINFO),
        **_tls(ca_file),
    }
    if not url.startswith("unix:"):  # (a Unix socket has none: redis-py refuses the option)
        options["socket_keepalive"] = True
    try:
        client: Client
        if cluster:
            client = RedisCluster.from_url(
                url, cluster_error_retry_attempts=CLUSTER_TRIES, **options
            )
        elif connections is not None:
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=connections,
                timeout=POOL_WAIT_S,
                redis_connect_func=retry.on_connect,
                **options,
            )
            client = packed_by_hiredis(aioredis.Redis(connection_pool=pool))
            client.auto_close_connection_pool = True  # (closed with the client, as from_url's)
        else:
            client = packed_by_hiredis(
                aioredis.from_url(url, redis_connect_func=retry.on_connect, **options)
            )
    except ValueError as exc:
        raise StoreUnavailable(f"invalid Redis URL {mask_url(url)}: {exc}") from None
    _RETRIES[client] = retry
    return client


def _tls(ca_file: str) -> dict[str, Any]:
    """The client options that verify a ``rediss://`` server against ``ca_file`` (if any)."""
    return {"ssl_ca_certs": ca_file} if ca_file else {}


def cluster_node_of(url: str, key: str, *, ca_file: str = "") -> tuple[str, int]:
    """``(host, port)`` of the Redis Cluster primary that serves ``key``, asked of the node at
    ``url``: where a client that knows no cluster (arq's) must connect for that key's slot."""
    try:
        client = SyncRedisCluster.from_url(url, **_tls(ca_file))
    except (RedisError, OSError) as exc:
        raise StoreUnavailable(f"Redis Cluster at {mask_url(url)} unavailable: {exc}") from None
    try:
        node = client.get_node_from_key(key)
        return node.host, int(node.port)
    finally:
        client.close()


def primary_of_slot(
    nodes: list[tuple[str, int]], key: str, *, ca_file: str = ""
) -> tuple[str, int] | None:
    """``(host, port)`` of the primary serving ``key`` now, asked of the first of ``nodes``
    (cluster nodes) that answers; ``nodes`` is extended with every node the cluster knows,
    so that a later ask finds one alive though the first is gone. None if none answers."""
    for host, port in list(nodes):
        try:
            client = SyncRedisCluster(host=host, port=port, **_tls(ca_file))
        except (RedisError, RedisClusterException, OSError):
            continue
        try:
            for node in client.get_nodes():
                if (node.host, int(node.port)) not in nodes:
                    nodes.append((node.host, int(node.port)))
            found = client.get_node_from_key(key)
            return found.host, int(found.port)
        except (RedisError, RedisClusterException, OSError):
            continue
        finally:
            client.close()
    return None


# redis-py prefixes the reply of a pipeline's failed command with this (then the command).
_PIPELINE_PREFIX = re.compile(r"Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)
# Redis before 7.0 words an error raised inside a script "Error running script (call to
# f_<sha>): @user_script:1: WRONGTYPE ..." (7.0 puts the code first and the script after).
_SCRIPT_PREFIX = re.compile(r"(?:ERR )?Error running script \(call to [^)]*\): (?:@\w+:\d+: )+-?")


def redis_code(exc: ResponseError) -> str:
    """The error code of a Redis error reply: its first word (``BUSYGROUP``, ``OOM``...), the
    protocol's machine-readable part, as redis-py itself maps replies to classes. A pipeline's
    reply carries it after redis-py's note of which command failed."""
    text = str(exc.args[0]) if exc.args else ""
    match = _PIPELINE_PREFIX.match(text)
    if match:
        text = text[match.end() :].lstrip("('\"")
    match = _SCRIPT_PREFIX.match(text)
    if match:
        text = text[match.end() :]
    return text.split(" ", 1)[0]
