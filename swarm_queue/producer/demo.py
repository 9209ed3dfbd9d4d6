"""``swarm-demo``: a real job end to end on one machine, with nothing set up beforehand.

Starts a private Redis (unless ``SWARM_REDIS_URL`` is set), four ``swarm-sim`` endpoints and two
``swarm-worker --burst`` processes (arq workers, two endpoints each), queues a few
thousand prompts, collects the results in input order, checks every text against the
simulator's deterministic output, and prints a one-screen summary.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from swarm_queue.common.cli import Parser, run
from swarm_queue.common.embedded import EmbeddedRedis, free_port
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import write_output
from swarm_queue.sim.launch import launch
from swarm_queue.sim.text import completion_for

__all__ = ["main"]

MAX_TOKENS = 24


def demo_prompt(i: int) -> str:
    return f"Summarise the function of gene G{i:05d} in one sentence."


@contextlib.contextmanager
def _sim(ports: list[int], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as fh:
        proc = launch(ports, log=fh, timeout_s=15)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _demo(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    redis_url = os.environ.get("SWARM_REDIS_URL", "").strip()
    embedded: EmbeddedRedis | None = None
    if not redis_url:
        embedded = EmbeddedRedis().start()
        redis_url = embedded.url
    settings = Settings.from_env(os.environ, redis_url=redis_url)
    ports = [free_port() for _ in range(4)]
    job = f"demo-{int(time.time())}"
    n = args.prompts
    store = JobStore.from_settings(settings)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with _sim(ports, out_dir / "sim.log"):
            t0, t0_wall = time.monotonic(), time.time()
            spec = JobSpec(
                job=job,
                params=SamplingParams(max_tokens=MAX_TOKENS),
                created_s=time.time(),
                source="demo",
            )
            report = await enqueue_prompts(store, spec, ((demo_prompt(i), None) for i in range(n)))
            t_enqueued = time.monotonic()
            env = {**os.environ, "SWARM_REDIS_URL": redis_url}
            for w, pair in enumerate((ports[:2], ports[2:])):
                wenv = {
                    **env,
                    "SWARM_ENDPOINTS": ",".join(f"http://127.0.0.1:{p}" for p in pair),
                    "SWARM_WORKER_NAME": f"demo-worker-{w}",
                }
                with open(out_dir / f"worker-{w}.log", "wb") as fh:
                    workers.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "swarm_queue.worker.main", "--burst"],
                            env=wenv,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                        )
                    )
            results_path = out_dir / "results.jsonl"
            with open(results_path, "wb") as fh:
                creport = await write_output(store, job, fh, wait=True, progress=True)
            t_done = time.monotonic()
            for proc in workers:
                await asyncio.to_thread(proc.wait, 60)
            meta = await store.meta(job)
        bad, order_ok, per_endpoint = 0, True, collections.Counter[str]()
        with open(results_path, "rb") as fh:
            for expect, raw in enumerate(fh):
                line = msgspec.json.decode(raw)
                order_ok &= line["index"] == expect
                text, _, _ = completion_for(demo_prompt(line["index"]), MAX_TOKENS)
                bad += line["text"] != text
                per_endpoint[line["endpoint"]] += 1
        first_s = float(meta[Meta.FIRST_RESULT_S]) - t0_wall
        wall = t_done - t0
        lines = [
            "",
            "swarm-queue demo",
            f"  Redis      {'embedded redis-server' if embedded else 'SWARM_REDIS_URL'} "
            f"{settings.redis_url_masked}",
            f"  endpoints  4 swarm-sim engines (vLLM stand-ins), ports {ports}",
            "  workers    2 x `swarm-worker --burst`, 2 endpoints each",
            f"  job        {job}: {report.total} prompts queued in {t_enqueued - t0:.2f} s",
            f"  collected  {creport.written} results in input order in {wall:.2f} s "
            f"({creport.written / wall:,.0f} prompts/s), first after {max(0.0, first_s):.2f} s",
            f"  checked    {creport.written - bad}/{creport.written} texts as expected, "
            f"order {'OK' if order_ok else 'WRONG'}, {creport.failed} failed",
            "  per endpoint:",
            *(f"    {ep}  {count} prompts" for ep, count in sorted(per_endpoint.items())),
            f"  output     {results_path}  (worker logs beside it)",
            "",
        ]
        print("\n".join(lines))
        ok = (
            bad == 0
            and order_ok
            and creport.failed == 0
            and creport.written == n
            and all(p.returncode == 0 for p in workers)
        )
        if not ok:
            print("swarm-demo: FAILED: see the summary above and the logs", file=sys.stderr)
        return 0 if ok else 1
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        await store.close()
        if embedded is not None:
            embedded.close()


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(prog="swarm-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=5000)
    p.add_argument("--out", default="demo-out", help="folder for results and logs")
    args = p.parse_args(argv)
    raise SystemExit(run("swarm-demo", _demo(args)))
