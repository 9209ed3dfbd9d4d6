"""How fast one ``swarm-collect`` writes a finished job's lines in input order: the ordered
collector is the one process a job of 10^8 prompts goes through at the end (docs/SCALE.md).
A job of N prompts is answered first (2 instant endpoints, one ``swarm-worker --burst``),
then collected by the command as a user runs it (its start included), with and without
``--evict``, alternated. The simulator's answers are short (about 230 bytes a line): a
line's cost grows with its text, so longer answers are written at fewer lines a second. Each
row also says what the answers took in Redis before they were collected (``MEMORY USAGE`` of
the results hash, every field counted).

    python -m bench.collectrate [N] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import INSTANT, Bench, new_fleet, prompt_set
from swarm_queue.common.jobspec import DEFAULT_CHUNK
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts

BIN = Path(sys.executable).parent
ROWS: tuple[tuple[str, ...], ...] = ((), ("--evict",))


async def main(n: int, rounds: int) -> None:
    prompts = prompt_set(n)
    with Bench() as bench, tempfile.TemporaryDirectory(prefix="swarm-collect-") as tmp:
        fleet = new_fleet(2, INSTANT).start()
        store = JobStore.from_settings(Settings(redis_url=bench.url, prefix="b"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        env.update(
            SWARM_REDIS_URL=bench.url,
            SWARM_PREFIX="b",
            SWARM_ENDPOINTS=",".join(fleet.urls),
            SWARM_WORKER_NAME="bench",
        )
        try:
            for k in range(rounds):
                for args in ROWS:
                    job = f"c{k}{'e' if args else ''}"
                    spec = JobSpec(  # (queued as swarm-enqueue queues it)
                        job=job, params=SamplingParams(max_tokens=16), chunk=DEFAULT_CHUNK
                    )
                    await enqueue_prompts(store, spec, ((p, None) for p in prompts))
                    worker = subprocess.run(
                        [BIN / "swarm-worker", "--burst"], env=env, capture_output=True
                    )
                    assert worker.returncode == 0, worker.stderr[-2000:]
                    held = await store.redis.memory_usage(store.keys.results(job), samples=0)
                    out = Path(tmp) / f"{job}.jsonl"
                    t0 = time.monotonic()
                    done = subprocess.run(
                        [BIN / "swarm-collect", job, "--out", out, *args],
                        env=env,
                        capture_output=True,
                    )
                    wall = time.monotonic() - t0
                    assert done.returncode == 0, done.stderr[-2000:]
                    lines = out.read_bytes().count(b"\n")
                    assert lines == n, (job, lines)
                    print(
                        f"round {k + 1}, {' '.join(args) or 'kept':8s}: "
                        f"{n / wall:9,.0f} lines/s ({out.stat().st_size / n:,.0f} bytes a line, "
                        f"{wall:.2f} s with the process's start; the answers held "
                        f"{int(held or 0) / n:,.0f} bytes each in Redis)",
                        flush=True,
                    )
                    out.unlink()
                    await store.delete_job(job)
        finally:
            await store.close()
            fleet.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, nargs="?", default=200_000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.n, a.rounds))
