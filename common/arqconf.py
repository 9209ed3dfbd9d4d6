"""What every arq queue of swarm-queue shares (the workers' reduce steps, the tool runners'
calls): its connection to the Redis of the settings, and its payloads as msgpack through
msgspec (arq's default is pickle: nothing read from Redis is ever unpickled)."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from arq.connections import RedisSettings

from common.settings import Settings
from common.store import RETRY_ON, cluster_node_of, redis_retry

__all__ = ["arq_redis_settings", "job_deserializer", "job_serializer"]

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
