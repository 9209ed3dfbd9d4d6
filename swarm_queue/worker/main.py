"""``swarm-worker [--burst]``: the worker command, arq's worker with Redis checked first.

``arq swarm_queue.worker.WorkerSettings`` runs the same worker; this entry point first reaches
Redis with swarm-queue's own client, so a wrong password or an unreachable Redis is one clear
line at once (arq's connection loop retries an authentication failure for half a minute, then
ends in a traceback), and then hands over to arq's documented ``run_worker`` with the settings
parsed once, here. ``--burst`` is the engine's: arq's loop runs until the engine is done.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from swarm_queue.common.cli import Parser, add_redis_arg, default_redis_note, run
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore

__all__ = ["main"]


async def _reach_redis(settings: Settings) -> int:
    store = JobStore.from_settings(settings)
    try:
        await store.ping()
        await store.check_worker_access()
    finally:
        await store.close()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(
        prog="swarm-worker",
        description="Drain every job from the endpoints in SWARM_ENDPOINTS (or SWARM_HOSTFILE).",
    )
    p.add_argument("--burst", action="store_true", help="exit once no work it can do is left")
    add_redis_arg(p)
    args = p.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ, redis_url=args.redis)
    except ConfigError as exc:
        print(f"swarm-worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    note = default_redis_note(settings)
    if note:
        print(f"swarm-worker: {note}", file=sys.stderr)
    status = run("swarm-worker", _reach_redis(settings))
    if status:
        raise SystemExit(status)
    from arq.worker import run_worker

    from swarm_queue.worker.app import worker_settings

    run_worker(worker_settings(settings, burst=args.burst))


if __name__ == "__main__":
    main()
