"""A repeated log message said once per interval, not once per occurrence: a server that fails
every request for hours must not write a line per request (thousands a minute); the line
that is said counts the occurrences since the last one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["Throttled"]


class Throttled:
    """Says each message key at most once per ``every_s`` on ``log``."""

    def __init__(
        self,
        log: logging.Logger,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.every_s, self.clock = log, every_s, clock
        self._said: dict[str, tuple[float, int]] = {}  # key -> (said at, occurrences since)

    def say(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was said less than ``every_s`` ago (then only
        counted); True if it was said."""
        now = self.clock()
        at, since = self._said.get(key, (-float("inf"), 0))
        if now - at < self.every_s:
            self._said[key] = (at, since + 1)
            return False
        if since:
            msg += f" (and {since} more like it in the last {now - at:.0f} s)"
        self.log.log(level, msg, *args)
        self._said[key] = (now, 0)
        return True
