"""The one boundary where redis-py's errors become swarm-queue's: every store method runs its
commands inside :func:`redis_errors`; nothing else in swarm-queue catches a redis-py
exception."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from swarm_queue.common.errors import (
    BadKeyError,
    JobGoneError,
    StoreAccessDenied,
    StoreCommandDenied,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
    StoreUnreached,
)
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store.connection import first_contact_failure, redis_code

__all__ = ["redis_code", "redis_errors", "replies"]


# Error codes that mean the job a command was for is gone: GONE, from a script refusing work
# of another generation (lua/lib/jobs.lua); NOGROUP, a job's stream and consumer group deleted
# (or lost with a Redis restarted empty) under a reader.
_GONE_CODES = ("GONE", "NOGROUP")


@contextlib.asynccontextmanager
async def redis_errors(url: str, job: str = "", *keys: str) -> AsyncIterator[None]:
    """Translate redis-py's failures into swarm-queue's store errors (the one boundary): no
    redis-py exception leaves it. ``job``: the job the commands are for, named by a
    :class:`JobGoneError`; ``keys``: the keys they touch outside any job, named by a
    :class:`BadKeyError` (a key holding another type than swarm-queue keeps there)."""
    try:
        yield
    except NoPermissionError as exc:
        raise StoreCommandDenied(
            f"Redis at {mask_url(url)} refused access: {exc} (the user's ACL: see docs/HPC.md "
            "for the rules a project's user needs)"
        ) from None
    except (AuthenticationError, AuthorizationError) as exc:
        raise StoreAccessDenied(
            f"Redis at {mask_url(url)} refused access: {exc} (check the user and password in "
            "the URL, and the user's ACL: it needs the key prefix's keys and stream commands)"
        ) from None
    except ResponseError as exc:
        raise _error_reply(exc, url, job, keys) from None
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        never = first_contact_failure(exc)
        if never is not None:
            raise StoreUnreached(f"Redis at {mask_url(url)} unreachable: {never}") from None
        raise StoreUnavailable(f"Redis at {mask_url(url)} unavailable: {exc}") from None
    except RedisClusterException as exc:
        raise _cluster_refusal(exc, url) from None
    except RedisError as exc:  # anything else redis-py raises (a reply it cannot parse...)
        raise StoreRefused(f"Redis at {mask_url(url)}: {type(exc).__name__}: {exc}") from None
    except (AttributeError, KeyError, TypeError) as exc:
        if not _raised_in_redis_py(exc):
            raise  # ours: a bug to see, not an outage
        # redis-py's cluster client failing inside itself while it re-reads the cluster's
        # layout (a failover under way: its default node is gone for a moment).
        raise StoreUnavailable(
            f"Redis at {mask_url(url)}: its client failed ({type(exc).__name__}: {exc})"
        ) from None


def _error_reply(exc: ResponseError, url: str, job: str, keys: tuple[str, ...]) -> Exception:
    """The store error an error reply of Redis stands for (see :func:`redis_errors`)."""
    code = redis_code(exc)
    if code in _GONE_CODES:
        return JobGoneError(job or "?")
    if code == "WRONGTYPE":
        return BadKeyError(keys, job)
    if code in ("CLUSTERDOWN", "TRYAGAIN"):
        # A Redis Cluster failing over (a slot without its primary for a moment): an outage.
        return StoreUnavailable(f"Redis Cluster at {mask_url(url)} is down: {exc}")
    if code in ("MOVED", "ASK", "CROSSSLOT"):
        return StoreUnavailable(
            f"Redis at {mask_url(url)} is a Redis Cluster node ({code}): set "
            "SWARM_REDIS_CLUSTER=1 so that the client follows the cluster's slots"
        )
    if code in ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN"):
        # Redis loading its data after a restart, or blocked by a long script: an outage.
        return StoreUnavailable(f"Redis at {mask_url(url)} is not ready: {exc}")
    if not _is_oom(exc):
        return StoreRefused(f"Redis at {mask_url(url)} refused a command: {exc}")
    return StoreFull(
        f"Redis at {mask_url(url)} is out of memory (its maxmemory is reached) and refuses "
        "writes: collect jobs with swarm-collect JOB --out FILE --evict (it frees each "
        "answer once written out, a running job's too), delete finished jobs with "
        "swarm-jobs --delete-finished, or give Redis more maxmemory"
    )


# redis-py's cluster client raises RedisClusterException of its own: for a cluster it cannot
# reach or whose slots are not all served (a failover under way: an outage, waited out), and
# for a command it will not send at all, which no wait fixes (these words are its messages).
_CLUSTER_REFUSALS = (
    "all keys must map to the same key slot",
    "Missing key",
    "Invalid args in command",
    "is not implemented",
    "Too many targets",
    "in cluster mode",  # (an argument it takes no more: 'db', a Unix socket, transactions)
    "requires at least one node",
)


def _cluster_refusal(exc: RedisClusterException, url: str) -> Exception:
    """The store error a cluster client's own exception stands for (see :func:`redis_errors`):
    a refusal of the command itself is :class:`StoreRefused` (seen: a pipeline refusing a
    script, said for ever as "waits for Redis"); else an outage."""
    where = f"Redis Cluster at {mask_url(url)}"
    if "Cluster mode is not enabled" in str(exc):
        return StoreRefused(
            f"{where}: this Redis is no cluster ({exc}): unset SWARM_REDIS_CLUSTER, or point "
            "SWARM_REDIS_URL at a node of the cluster"
        )
    if any(words in str(exc) for words in _CLUSTER_REFUSALS):
        return StoreRefused(f"{where}: its client will not send the command: {exc}")
    return StoreUnavailable(f"{where}: {exc}")


def _raised_in_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside redis-py's own code (its innermost frame's)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("redis.")


def replies(results: list[Any]) -> list[Any]:
    """A pipeline's replies read with ``raise_on_error=False``, unless one of them says Redis
    itself cannot answer now (a connection lost, a Redis restarted and still loading its
    data: ``LOADING``): that one is raised (inside :func:`redis_errors`, StoreUnavailable),
    never read as the reply of a key that holds another tool's value. (Seen: a Redis
    restarted with AOF answered LOADING to a sweep, and a worker dropped a running agents'
    turn job as finished, its batch in hand left for the claim idle time.)"""
    for reply in results:
        if isinstance(reply, (RedisConnectionError, RedisTimeoutError)):
            raise reply
    return results


def _is_oom(exc: ResponseError) -> bool:
    """Redis refused a write for want of memory: redis-py maps the reply's error code ``OOM``
    to OutOfMemoryError, except inside a script, whose error carries the code as ``-OOM``.
    (Redis refuses a script's first write when over maxmemory and lets one that has written
    go on, so a refused script changed nothing.)"""
    return isinstance(exc, OutOfMemoryError) or " -OOM " in f" {exc.args[0] if exc.args else ''}"
