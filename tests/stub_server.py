"""A throwaway OpenAI-compatible server for tests that need answers swarm-sim does not give."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

__all__ = ["serve"]


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free local port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
