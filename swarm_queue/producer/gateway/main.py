"""``swarm-gateway``: the OpenAI Batch API (``/v1/files``, ``/v1/batches``, ``/v1/models``)
served over the queue, so code written for OpenAI's batches runs on the fleet unchanged.

Each batch is a swarm-queue job drained by the workers already running; its whole state is in
Redis and the files' directory (``SWARM_GATEWAY_DIR``), so any number of gateway processes
serve one fleet and a restarted one carries on. Without a keys file (``SWARM_GATEWAY_KEYS``)
it serves one project to this host only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from swarm_queue.common.cli import (
    Parser,
    add_redis_arg,
    is_loopback,
    run,
    settings_from_args,
    stop_on_signals,
)
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.keys import Keys
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.gateway.app import Gateway, make_app
from swarm_queue.producer.gateway.driver import Driver
from swarm_queue.producer.gateway.files import FileStore, default_dir
from swarm_queue.producer.gateway.projects import Projects

__all__ = ["main", "serve"]

# Requests in flight get this long to finish when the gateway stops; a batch's work is in
# Redis and on disk, so nothing waits on it.
SHUTDOWN_S = 5.0


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="swarm-gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="default 8080")
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="where file bytes live (default: $SWARM_GATEWAY_DIR, else "
        "~/.local/share/swarm-queue/gateway): a directory every gateway process reaches",
    )
    p.add_argument(
        "--keys",
        metavar="FILE",
        help="API keys, one 'KEY PROJECT [PREFIX]' a line (default: $SWARM_GATEWAY_KEYS; "
        "none: one project, this host only)",
    )
    add_redis_arg(p)
    return p


async def serve(settings: Settings, bind: str, port: int, stop: asyncio.Event) -> None:
    """Serve the API on ``bind:port`` and drive the batches until ``stop`` is set."""
    projects = Projects.from_file(settings.gateway_keys, settings.prefix)
    if projects.open and not is_loopback(bind):
        raise ConfigError(
            f"--bind {bind}: with no API keys (SWARM_GATEWAY_KEYS) the gateway serves this "
            "host only; give a keys file to serve others"
        )
    files = FileStore(Path(settings.gateway_dir) if settings.gateway_dir else default_dir())
    store = JobStore.from_settings(settings)
    stores = {settings.prefix: store}

    def jobs_of(prefix: str) -> JobStore:
        """The store of a project's prefix, on the gateway's one Redis client."""
        if prefix not in stores:
            stores[prefix] = JobStore(store.redis, Keys(prefix), settings.redis_url)
        return stores[prefix]

    driver = Driver(store, settings, files, jobs_of)
    runner = web.AppRunner(
        make_app(Gateway(store, jobs_of, files, projects, driver.wake)), access_log=None
    )
    await runner.setup()
    driving = asyncio.create_task(driver.run())
    try:
        site = web.TCPSite(runner, bind, port, shutdown_timeout=SHUTDOWN_S)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {bind}:{port} ({exc.strerror})") from None
        shown = f"[{bind}]" if ":" in bind else bind
        who = "one project, no keys" if projects.open else "projects from the keys file"
        print(
            f"swarm-gateway: serving http://{shown}:{port}/v1 ({who}; files in {files.root})",
            flush=True,
        )
        await stop.wait()
    finally:
        driving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driving
        await runner.cleanup()
        await store.close()


async def _main(args: argparse.Namespace) -> int:
    overrides = {"gateway_dir": args.dir, "gateway_keys": args.keys}
    settings = settings_from_args(args, **overrides)
    await serve(settings, args.bind, args.port, stop_on_signals())
    print("swarm-gateway: stopped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not 0 < args.port < 65536:
        _parser().error(f"--port {args.port}: a port is 1-65535")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    raise SystemExit(run("swarm-gateway", _main(args)))


if __name__ == "__main__":
    main()
