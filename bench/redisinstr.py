"""Redis's work a prompt in instructions, not seconds: scenario 4's two rows (2 instant
endpoints, 2 workers; the default batch of 32, and 256 with 4 in flight) with the private
redis-server run under ``valgrind --tool=callgrind``, its counters zeroed before the workers
start and dumped once the job is collected. An instruction count does not move with what else
the machine is doing, as CPU seconds do (they moved 1.4x between rounds on a busy day here),
so two revisions compare in one round each.

    python -m bench.redisinstr [N] [--keep DIR]

Needs valgrind and a redis-server on PATH (callgrind slows Redis some 50 times: N defaults to
20,000). Reports instructions a prompt (Ir) and Redis commands a prompt; ``--keep DIR`` keeps
each row's dump there (``callgrind_annotate --inclusive=yes DIR/batch-32.out`` tells where).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import redis.asyncio as aioredis

from bench.harness import INSTANT, SimFleetProc, new_fleet, prompt_set, run_swarm
from swarm_queue.common.embedded import EmbeddedRedis

ROWS: tuple[tuple[str, dict[str, str]], ...] = (
    ("32", {}),
    ("256", {"SWARM_BATCH_SIZE": "256", "SWARM_INFLIGHT": "4"}),
)


def _wrapper(tmp: Path, out: Path) -> str:
    """A redis-server that runs under callgrind, writing its counts to ``out``."""
    server, valgrind = shutil.which("redis-server"), shutil.which("valgrind")
    if server is None or valgrind is None:
        raise SystemExit("bench.redisinstr needs valgrind and a redis-server on PATH")
    script = tmp / "redis-under-callgrind"
    script.write_text(
        "#!/bin/sh\n"
        f"exec {valgrind} --tool=callgrind --callgrind-out-file={out}.%p "
        f'--collect-atstart=yes {server} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _last_dump(out: Path, pid: int) -> Path:
    """The last dump callgrind wrote for ``pid``."""
    return sorted(out.parent.glob(f"{out.name}.{pid}.*"), key=lambda p: p.stat().st_mtime)[-1]


def _dumped_ir(out: Path, pid: int) -> int:
    """The instructions of the last dump callgrind wrote for ``pid``."""
    dumps = [_last_dump(out, pid)]
    text = dumps[-1].read_text(errors="replace")
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if found is None:
        raise RuntimeError(f"no instruction total in {dumps[-1]}")
    return int(found.group(1))


async def _row(
    server: EmbeddedRedis,
    out: Path,
    fleet: SimFleetProc,
    prompts: list[str],
    env: dict[str, str],
    keep: Path | None,
) -> str:
    n = len(prompts)
    assert server.proc is not None
    pid = server.proc.pid
    r = aioredis.Redis.from_url(server.url)
    try:
        await r.config_resetstat()
        await asyncio.to_thread(_callgrind, pid, "--zero")
        await run_swarm(
            server.url, "b-instr", fleet, [[u] for u in fleet.urls], prompts, 16, worker_env=env
        )
        await asyncio.to_thread(_callgrind, pid, "--dump")
        ir = await asyncio.to_thread(_dumped_ir, out, pid)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            batch = env.get("SWARM_BATCH_SIZE", "32")
            shutil.copyfile(_last_dump(out, pid), keep / f"batch-{batch}.out")
        stats = await r.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if "config" not in k)
        await r.flushall()
        await asyncio.to_thread(_callgrind, pid, "--zero")
        return f"{ir / n:10,.0f} instructions a prompt  {calls / n:5.2f} commands a prompt"
    finally:
        await r.aclose()


async def main(n: int, keep: Path | None) -> None:
    prompts = prompt_set(n)
    with tempfile.TemporaryDirectory(prefix="swarm-instr-") as tmp:
        out = Path(tmp) / "callgrind.out"
        server = EmbeddedRedis(binary=_wrapper(Path(tmp), out)).start(timeout_s=120)
        try:
            fleet = new_fleet(2, INSTANT).start()
            try:
                for batch, env in ROWS:
                    got = await _row(server, out, fleet, prompts, env, keep)
                    print(f"batch {batch:>3}, {n:,} prompts: {got}", flush=True)
            finally:
                fleet.stop()
        finally:
            server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, nargs="?", default=20_000)
    p.add_argument("--keep", type=Path, help="a directory to keep each row's callgrind dump in")
    a = p.parse_args()
    asyncio.run(main(a.n, a.keep))
