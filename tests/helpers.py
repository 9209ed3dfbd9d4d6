"""Small helpers shared by tests: a throwaway HTTP server, and waiting for a condition."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

__all__ = ["serve", "wait_until"]


def wait_until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """A throwaway server for answers swarm-sim does not give: ``app`` on a free local port;
    yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
