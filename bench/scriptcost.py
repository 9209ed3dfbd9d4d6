"""What Redis spends on a script call before the script does anything: ``EVALSHA`` of
``return 1`` with no arguments, with a commit's count of short ones (9 keys, 24 arguments),
with two long ones (a whole chunk's answers each, 1,600 bytes), and with a commit's shape
(both), against a ``PING``; in instructions a call, Redis run under callgrind as in
:mod:`bench.redisinstr` (whose redis-server it runs: the first on ``PATH``).

    python -m bench.scriptcost [CALLS]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

from bench.redisinstr import _callgrind, _dumped_ir, _wrapper
from swarm_queue.common.embedded import EmbeddedRedis

KEYS = [f"k{i}" for i in range(9)]
HEAD = ["workers", "abcdef0123456789", "", "32", *["0"] * 8, "", "0", "0", "2"]
SHAPES: tuple[tuple[str, list[str], list[str]], ...] = (
    ("no arguments", [], []),
    ("9 keys, 24 short arguments", KEYS, ["a"] * 24),
    ("2 arguments of 1,600 bytes", [], ["x" * 1600, "y" * 1600]),
    ("a commit's shape", KEYS, [*HEAD, "0-1", "16", "x" * 1600, "0-17", "16", "y" * 1600]),
)


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="swarm-scriptcost-") as tmp:
        out = Path(tmp) / "callgrind.out"
        server = EmbeddedRedis(binary=_wrapper(Path(tmp), out)).start(timeout_s=120)
        assert server.proc is not None
        pid = server.proc.pid
        r = aioredis.Redis.from_url(server.url)
        try:
            sha = await r.script_load("return 1")

            async def measured(name: str, call: Callable[[], Awaitable[object]]) -> None:
                await asyncio.to_thread(_callgrind, pid, "--zero")
                for _ in range(calls):
                    await call()
                await asyncio.to_thread(_callgrind, pid, "--dump")
                ir = await asyncio.to_thread(_dumped_ir, out, pid)
                print(f"{name:32s} {ir / calls:9,.0f} instructions a call", flush=True)

            for name, keys, args in SHAPES:
                await measured(name, lambda k=keys, a=args: r.evalsha(sha, len(k), *k, *a))
            await measured("PING", r.ping)
        finally:
            await r.aclose()
            server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calls", type=int, nargs="?", default=200)
    asyncio.run(main(p.parse_args().calls))
