"""What every arq queue of swarm-queue shares (the workers' own, the tool runners' calls): its
connection to the Redis of the settings, and its payloads as msgpack through
msgspec (arq's default is pickle: nothing read from Redis is ever unpickled)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import redis.asyncio as aioredis
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from swarm_queue.common.settings import Settings
from swarm_queue.common.store import RETRY_ON, cluster_node_of, primary_of_slot, redis_retry

__all__ = ["arq_connection", "arq_pool", "arq_redis_settings", "job_deserializer", "job_serializer"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def job_serializer(data: dict[str, Any]) -> bytes:
    """arq job payloads as msgpack (arq's default is pickle)."""
    return _encoder.encode(data)


def job_deserializer(data: bytes) -> dict[str, Any]:
    result: dict[str, Any] = _decoder.decode(data)
    return result


def arq_redis_settings(settings: Settings) -> RedisSettings:
    """arq's connection: the Redis of ``settings``; on a Redis Cluster, the primary serving
    the slot that every arq key shares (see ``Keys.arq_queue``), since arq's client knows
    no cluster."""
    base = RedisSettings.from_dsn(settings.redis_url)
    # arq reads the user and password from the URL's authority only; redis-py, which every
    # other command uses, also from its query (``?password=...``): the worker takes both.
    query = parse_qs(urlsplit(settings.redis_url).query)
    base = dataclasses.replace(
        base,
        username=base.username or next(reversed(query.get("username", [])), None),
        password=base.password or next(reversed(query.get("password", [])), None),
    )
    if settings.redis_cluster:
        host, port = cluster_node_of(
            settings.redis_url, settings.keys.arq_queue, ca_file=settings.redis_ca_file
        )
        base = dataclasses.replace(base, host=host, port=port)
    return dataclasses.replace(
        base,
        retry=redis_retry(),
        retry_on_error=RETRY_ON,
        retry_on_timeout=True,
        conn_retries=30,
        ssl_ca_certs=settings.redis_ca_file or None,
    )


# Attempts at connecting to arq's slot's primary, the cluster asked before each (about as
# patient as a lone Redis's client: two minutes).
_CONNECT_TRIES = 30


class _SlotConnection(aioredis.Connection):
    """A connection to whichever primary serves one slot now, asked of the cluster at each
    connect: arq's client knows no cluster, and after a failover the node it was first
    given is gone (or a replica)."""

    def __init__(self, *, slot_key: str, nodes: list[tuple[str, int]], ca_file: str, **kw: Any):
        super().__init__(**kw)
        self._slot_key, self._nodes, self._ca_file = slot_key, nodes, ca_file

    async def connect(self) -> None:
        """Connect to the slot's primary of the moment, asking the cluster again before each
        attempt (redis-py's own retry of a connect would try the same dead node each time)."""
        if self.is_connected:
            return
        patient, self.retry = self.retry, Retry(NoBackoff(), 0)
        try:
            for attempt in range(_CONNECT_TRIES):
                found = await asyncio.to_thread(
                    primary_of_slot, self._nodes, self._slot_key, ca_file=self._ca_file
                )
                if found is not None:
                    self.host, self.port = found
                try:
                    await super().connect()  # type: ignore[no-untyped-call]
                    return
                except RedisConnectionError:
                    if attempt + 1 == _CONNECT_TRIES:
                        raise
                    await asyncio.sleep(min(5.0, 0.05 * 2**attempt))
        finally:
            self.retry = patient


class _SlotSSLConnection(_SlotConnection, aioredis.SSLConnection):
    """:class:`_SlotConnection` over TLS (``rediss://``)."""


def arq_connection(settings: Settings) -> dict[str, Any]:
    """arq's Worker arguments for its connection: on a Redis Cluster, a pool of its own that
    follows the primary of arq's slot through a failover; else arq's own from the URL."""
    if not settings.redis_cluster:
        return {"redis_settings": arq_redis_settings(settings)}
    return {"redis_pool": _cluster_pool(settings), "redis_settings": arq_redis_settings(settings)}


async def arq_pool(settings: Settings) -> ArqRedis:
    """A client of arq's queues on the settings' Redis (see :func:`arq_connection`)."""
    if settings.redis_cluster:
        return _cluster_pool(settings)
    return await create_pool(
        arq_redis_settings(settings),
        job_serializer=job_serializer,
        job_deserializer=job_deserializer,
    )


def _cluster_pool(settings: Settings) -> ArqRedis:
    base = arq_redis_settings(settings)
    # Where to ask for the slot's primary: the node the URL names and the slot's primary of
    # now, then every node the cluster knows (added at each ask): one of them is alive.
    given = urlsplit(settings.redis_url)
    nodes = [(given.hostname or "127.0.0.1", given.port or 6379), (base.host, base.port)]
    tls = urlsplit(settings.redis_url).scheme == "rediss"
    options: dict[str, Any] = {
        "slot_key": settings.keys.arq_queue,
        "nodes": nodes,
        "ca_file": settings.redis_ca_file,
        "host": base.host,
        "port": base.port,
        "db": base.database,
        "username": base.username,
        "password": base.password,
        "retry": redis_retry(slot_moves=True),
        "retry_on_error": RETRY_ON,
        "socket_keepalive": True,
    }
    if tls and settings.redis_ca_file:
        options["ssl_ca_certs"] = settings.redis_ca_file
    pool = aioredis.ConnectionPool(
        connection_class=_SlotSSLConnection if tls else _SlotConnection, **options
    )
    return ArqRedis(
        pool,
        job_serializer=job_serializer,
        job_deserializer=job_deserializer,
        default_queue_name=settings.keys.arq_queue,
    )
