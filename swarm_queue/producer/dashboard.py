"""``swarm-status --serve PORT``: every job and endpoint of a fleet, live, in the browser.

One sampler reads Redis every ``every_s`` (however many browsers are open) and keeps the
throughput history the charts draw; the page asks for the latest board as JSON and redraws.
It is bound to 127.0.0.1 unless told otherwise and has no login, so it refuses requests
naming another host (a web page cannot reach it by DNS rebinding), and no password leaves it:
the Redis URL is masked and the page never sees the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from importlib import resources

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from swarm_queue.common.cli import is_loopback, stop_on_signals
from swarm_queue.common.errors import ConfigError, SwarmError
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store import JobStore
from swarm_queue.producer.overview import History, Overview, read_overview

__all__ = ["Dashboard", "serve"]

_encoder = msgspec.json.Encoder()
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _host_name(host: str) -> str:
    """The name in a Host header, without its port: ``[::1]:80`` -> ``[::1]``."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.partition(":")[0]


class Dashboard:
    """The sampler and the web app around one store."""

    def __init__(
        self, store: JobStore, redis_url: str, every_s: float = 2.0, history: History | None = None
    ) -> None:
        self.store = store
        self.redis_url = redis_url
        self.every_s = every_s
        self.history = history or History()
        self.board: Overview | None = None
        self.body = b"{}"
        self.read_at = time.monotonic()  # when Redis last answered a whole read

    async def step(self) -> bool:
        """Read Redis once; False when it could not be read. Then no figure is shown (none
        can be vouched for): the board says why, and when Redis was last read."""
        try:
            board = self.history.add(await read_overview(self.store, self.redis_url))
        except SwarmError as exc:
            self._unread(str(exc))
            return False
        self.board = board
        self.body = _encoder.encode(board)
        self.read_at = time.monotonic()
        return True

    def _unread(self, why: str) -> None:
        """Show no figure, and why: Redis could not be read."""
        last = self.board
        self.board = Overview(
            generated_s=last.generated_s if last else time.time(),
            redis=mask_url(self.redis_url),
            prefix=self.store.keys.prefix,
            jobs=[],
            endpoints=[],
            error=why,
        )
        self.body = _encoder.encode(self.board)

    def current(self) -> bytes:
        """The board to serve: the last one read, unless a read has hung past a few periods
        (a Redis gone away is waited on by its client for minutes): then no figure, and why."""
        silent_s = time.monotonic() - self.read_at
        if silent_s > max(3 * self.every_s, 5.0) and (self.board is None or not self.board.error):
            self._unread(f"Redis has not answered for {silent_s:.0f} s (still trying)")
        return self.body

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every ``every_s`` (after the step that found the first board) until
        ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
            if not stop.is_set():
                await self.step()

    def app(self, *, local_only: bool) -> web.Application:
        """The routes: ``/`` (the page), ``/dashboard.js`` and ``/api/board`` (the JSON)."""
        files = resources.files(__package__)
        page = files.joinpath("dashboard.html").read_bytes()
        script = files.joinpath("dashboard.js").read_bytes()

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if local_only and _host_name(request.host) not in _LOOPBACK_NAMES:
                # A name other than the loopback's: another site's page, rebound to this one.
                raise web.HTTPMisdirectedRequest(text="this dashboard answers on localhost only")
            response = await handler(request)
            response.headers.update(_PAGE_HEADERS)
            return response

        async def index(_: web.Request) -> web.Response:
            return web.Response(body=page, content_type="text/html", charset="utf-8")

        async def js(_: web.Request) -> web.Response:
            return web.Response(body=script, content_type="text/javascript", charset="utf-8")

        async def board(_: web.Request) -> web.Response:
            return web.Response(body=self.current(), content_type="application/json")

        app = web.Application(middlewares=[guard])
        app.router.add_get("/", index)
        app.router.add_get("/dashboard.js", js)
        app.router.add_get("/api/board", board)
        return app


SHUTDOWN_S = 2.0


async def serve(store: JobStore, redis_url: str, host: str, port: int, every_s: float) -> None:
    """Serve the dashboard on ``host:port`` until SIGINT or SIGTERM (a second one ends the
    process at once).

    The signal sets an event the loop checks between its reads of Redis, rather than
    cancelling whatever it awaits: a cancellation can be lost inside a Redis call (Python
    3.11's ``asyncio.timeout`` may turn one that coincides with its deadline into a timeout,
    which the store's patience retries), and a Ctrl-C that did not stop the dashboard within
    30 s was seen twice in CI."""
    stop = stop_on_signals()
    dash = Dashboard(store, redis_url, every_s)
    await dash.step()  # the first page load finds a board
    local = is_loopback(host)
    runner = web.AppRunner(dash.app(local_only=local), access_log=None)
    await runner.setup()
    try:
        # A page's request is answered from memory at once: no need for aiohttp's default
        # 60 s of grace for requests in flight when it stops.
        site = web.TCPSite(runner, host, port, shutdown_timeout=SHUTDOWN_S)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(
                f"--serve {port}: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None
        shown = f"[{host}]" if ":" in host else host
        print(f"swarm-status: dashboard on http://{shown}:{port}/ (Ctrl-C stops it)", flush=True)
        if not local:
            print(
                f"swarm-status: bound to {host}: anyone who can reach this host sees job names "
                "and endpoints (there is no login)",
                file=sys.stderr,
                flush=True,
            )
        await dash.run(stop)
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
