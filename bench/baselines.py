"""The baselines swarm-queue is measured against, each as minimal as its idea allows.

* static round-robin: prompt i goes to endpoint i % n, and each endpoint gets ONE list request
  holding its whole share (how the users' in-process library batches);
* naive gather: ``asyncio.gather`` over one ``completions.create`` per prompt, round-robin over
  the endpoints, bounded by a semaphore;
* arq, one job per prompt: the obvious way to put a queue in front of the same calls.

Each returns ``(wall_s, answered)``; a prompt whose request failed counts as not answered
(baselines do not retry: that is part of what they measure). ``first``, when given, receives
the seconds to the first answer.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import openai
from arq import create_pool
from arq.connections import RedisSettings

from bench.harness import OUT, ROOT
from swarm_queue.worker.app import job_deserializer, job_serializer

QUEUE = "bench:arq:queue"


def _client(url: str) -> openai.AsyncOpenAI:
    # openai's default pool allows 1,000 connections: more than the semaphores below.
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=3600)


def _mark_first(first: list[float] | None, t0: float) -> None:
    if first is not None and not first:
        first.append(time.monotonic() - t0)


async def static_round_robin(
    urls: list[str],
    prompts: list[str],
    max_tokens: int,
    model: str = "swarm-sim",
    first: list[float] | None = None,
) -> tuple[float, int]:
    shares = [prompts[i :: len(urls)] for i in range(len(urls))]
    clients = [_client(u) for u in urls]

    async def one(client: openai.AsyncOpenAI, share: list[str]) -> int:
        try:
            r = await client.completions.create(model=model, prompt=share, max_tokens=max_tokens)
            _mark_first(first, t0)
            return len(r.choices)
        except openai.OpenAIError:
            return 0

    t0 = time.monotonic()
    try:
        answered = await asyncio.gather(*(one(c, s) for c, s in zip(clients, shares, strict=True)))
    finally:
        for c in clients:
            await c.close()
    return time.monotonic() - t0, sum(answered)


async def naive_gather(
    urls: list[str],
    prompts: list[str],
    max_tokens: int,
    concurrency: int = 512,
    model: str = "swarm-sim",
    first: list[float] | None = None,
) -> tuple[float, int]:
    clients = [_client(u) for u in urls]
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: str) -> int:
        async with sem:
            try:
                await clients[i % len(clients)].completions.create(
                    model=model, prompt=prompt, max_tokens=max_tokens
                )
                _mark_first(first, t0)
                return 1
            except openai.OpenAIError:
                return 0

    t0 = time.monotonic()
    try:
        answered = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    finally:
        for c in clients:
            await c.close()
    return time.monotonic() - t0, sum(answered)


# -- arq, one job per prompt ----------------------------------------------------------------

_clients: dict[str, openai.AsyncOpenAI] = {}


async def complete_one(ctx: dict[str, Any], url: str, prompt: str, max_tokens: int) -> str:
    client = _clients.get(url) or _clients.setdefault(url, _client(url))
    r = await client.completions.create(model="swarm-sim", prompt=prompt, max_tokens=max_tokens)
    return r.choices[0].text


class BaselineWorker:
    """``arq bench.baselines.BaselineWorker``: the one-job-per-prompt baseline's worker."""

    functions = [complete_one]
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://localhost"))
    queue_name = QUEUE
    max_jobs = 256
    job_serializer = job_serializer
    job_deserializer = job_deserializer
    keep_result = 3600
    poll_delay = 0.05


async def arq_one_job_per_prompt(
    redis_url: str, urls: list[str], prompts: list[str], max_tokens: int, workers: int = 2
) -> tuple[float, int]:
    pool = await create_pool(
        RedisSettings.from_dsn(redis_url),
        job_serializer=job_serializer,
        job_deserializer=job_deserializer,
        default_queue_name=QUEUE,
    )
    env = {**os.environ, "BENCH_REDIS_URL": redis_url}
    procs = []
    try:
        t0 = time.monotonic()
        jobs = []
        for start in range(0, len(prompts), 1000):  # enqueue in concurrent chunks
            jobs += await asyncio.gather(
                *(
                    pool.enqueue_job("complete_one", urls[i % len(urls)], prompts[i], max_tokens)
                    for i in range(start, min(start + 1000, len(prompts)))
                )
            )
        for w in range(workers):
            with open(OUT / f"arq-baseline-{w}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "arq", "bench.baselines.BaselineWorker", "--burst"],
                        env=env,
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for p in procs:
            await asyncio.to_thread(p.wait)
        wall = time.monotonic() - t0
        results = await asyncio.gather(*(j.result_info() for j in jobs if j is not None))
        answered = sum(1 for r in results if r is not None and r.success)
        return wall, answered
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        await pool.flushdb()
        await pool.aclose()
