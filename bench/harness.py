"""What every benchmark scenario shares: a private Redis, a swarm-sim fleet in its own process,
long-running worker processes, throughput sampled from the simulator's /metrics, and the
fleet's theoretical capacity.

Not product code: a measuring stick. Each scenario runs the system and its baselines against
the same kind of fleet in the same run, so ratios hold on a noisy shared machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
import redis.asyncio as aioredis

from swarm_queue.common.embedded import EmbeddedRedis, free_port
from swarm_queue.common.jobspec import DEFAULT_CHUNK
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import collect_output, write_output
from swarm_queue.sim.engine import EngineConfig, SimEngine
from swarm_queue.sim.launch import SimExited, launch
from swarm_queue.sim.text import completion_for

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"

_METRIC = re.compile(r"^((?:vllm|swarm_sim):[a-z_]+)\{[^}]*\} ([0-9.e+]+)$", re.M)


def prompt_set(n: int, size: int = 0) -> list[str]:
    """``n`` distinct prompts; ``size`` pads each to about that many bytes."""
    base = [f"Question {i}: describe sample {i * 7919 % 100003} in one line." for i in range(n)]
    if size:
        pad = "lorem ipsum dolor sit amet " * (size // 27 + 1)
        base = [(p + " " + pad)[:size] for p in base]
    return base


def prompt_iter(n: int, size: int) -> Iterator[tuple[str, str | None]]:
    """``(prompt, None)`` pairs of about ``size`` bytes, made as they are read: a million of
    them never sit in the benchmark's own memory."""
    pad = "lorem ipsum dolor sit amet " * (size // 27 + 1)
    for i in range(n):
        yield (f"Question {i}: describe sample {i * 7919 % 100003} in one line. {pad}")[:size], None


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (Linux's /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def total_tokens(prompts: Sequence[str], max_tokens: int) -> int:
    return sum(completion_for(p, max_tokens)[1] for p in prompts)


def token_capacity(config: EngineConfig) -> float:
    """Tokens per second of one endpoint at a full batch: the most it can ever generate."""
    return config.max_num_seqs / config.step_s(config.max_num_seqs)


def offline_makespan(lengths: Sequence[int], config: EngineConfig) -> float:
    """Simulated seconds one engine needs for sequences of these lengths, all queued at t=0:
    continuous batching at its best, ramp-down tail included."""
    engine = SimEngine(config)
    engine.load(lengths)
    t = 0.0
    while engine.num_running or engine.num_waiting:
        engine.admit()
        t += config.step_s(engine.num_running)
        engine.step()
    return t


def ideal_makespan(
    prompts: Sequence[str], max_tokens: int, configs: Sequence[EngineConfig]
) -> float:
    """The theoretical minimum wall time of a fleet: every prompt already inside the engines at
    t=0, split in proportion to each engine's capacity, each engine at its best."""
    caps = [token_capacity(c) for c in configs]
    shares: list[list[int]] = [[] for _ in configs]
    credit = [0.0] * len(configs)
    for p in prompts:  # weighted round-robin: each engine gets its capacity's share
        for i, cap in enumerate(caps):
            credit[i] += cap / sum(caps)
        i = max(range(len(caps)), key=credit.__getitem__)
        credit[i] -= 1.0
        shares[i].append(completion_for(p, max_tokens)[1])
    return max(offline_makespan(s, c) for s, c in zip(shares, configs, strict=True))


@dataclass
class SimFleetProc:
    """A swarm-sim process with one engine per port."""

    ports: list[int]
    speeds: list[float]
    config: EngineConfig
    proc: subprocess.Popen[bytes] | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self, *extra: str) -> SimFleetProc:
        """Start the simulator and wait until every port answers. A port taken between
        choosing it and binding it (another process on a busy machine) ends the simulator at
        once: then new ports are chosen, a few times."""
        for _ in range(3):
            if self._start_once(extra):
                return self
            self.ports = free_ports(len(self.ports))
        raise RuntimeError("swarm-sim did not start")

    def _start_once(self, extra: tuple[str, ...]) -> bool:
        args = [
            "--speed",
            ",".join(map(str, self.speeds)),
            "--max-num-seqs",
            str(self.config.max_num_seqs),
            "--step-ms",
            str(self.config.step_base_ms),
            "--step-per-seq-ms",
            str(self.config.step_per_seq_ms),
            *extra,
        ]
        if self.config.instant:
            args.append("--instant")
        if self.config.ignore_eos:
            args.append("--ignore-eos")
        try:
            self.proc = launch(self.ports, *args)
        except SimExited:
            return False  # it could not bind a port
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def configs(self, alive: Sequence[bool] | None = None) -> list[EngineConfig]:
        """The engine of each endpoint that is ``alive`` (all by default)."""
        return [
            EngineConfig(
                max_num_seqs=self.config.max_num_seqs,
                step_base_ms=self.config.step_base_ms,
                step_per_seq_ms=self.config.step_per_seq_ms,
                speed=speed,
            )
            for i, speed in enumerate(self.speeds)
            if alive is None or alive[i]
        ]

    def capacity(self, alive: Sequence[bool] | None = None) -> float:
        """Summed token capacity (tokens/s) of the endpoints that are ``alive``."""
        return sum(token_capacity(c) for c in self.configs(alive))

    def kill_endpoint(self, i: int) -> None:
        req = urllib.request.Request(
            self.urls[i] + "/sim/faults",
            data=b'{"die_after_s": 0.0}',
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=5).read()


async def metrics(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    try:
        async with client.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    return {name: float(value) for name, value in _METRIC.findall(text)}


_HIST = re.compile(
    r'^vllm:request_queue_time_seconds_(bucket|sum|count)\{(?:le="([^"]+)",)?[^}]*\} ([0-9.e+]+)$',
    re.M,
)


@dataclass
class QueueTimes:
    """Each sequence's wait for a slot inside the endpoints (vLLM's request_queue_time)."""

    count: int = 0
    total_s: float = 0.0
    over_1s: int = 0

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


async def queue_times(urls: Sequence[str]) -> QueueTimes:
    """Summed over the endpoints: read once, after a run, from a fleet that served only it.
    An endpoint that died meanwhile took its numbers with it."""
    out = QueueTimes()
    async with aiohttp.ClientSession() as client:
        for url in urls:
            try:
                async with client.get(url + "/metrics") as resp:
                    text = await resp.text()
            except aiohttp.ClientError:
                continue
            le_1s = 0
            for kind, le, value in _HIST.findall(text):
                if kind == "sum":
                    out.total_s += float(value)
                elif kind == "count":
                    out.count += int(float(value))
                    out.over_1s += int(float(value)) - le_1s
                elif le == "1.0":
                    le_1s = int(float(value))
    return out


async def batch_service_s(url: str, prompts: Sequence[str], max_tokens: int) -> float:
    """Wall time of one list request of ``prompts`` on an idle endpoint."""
    body = {"model": "swarm-sim", "prompt": list(prompts), "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as client:
        t0 = time.monotonic()
        async with client.post(url + "/v1/completions", json=body) as resp:
            resp.raise_for_status()
            await resp.read()
        return time.monotonic() - t0


class Periodic:
    """Runs ``_run`` in the background from :meth:`start` (its clock ``t0``) to :meth:`stop`."""

    t0: float
    _task: asyncio.Task[None] | None

    async def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self.t0 = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class Sampler(Periodic):
    """Samples each endpoint's finished sequences and the Redis memory every ``period_s``."""

    urls: list[str]
    redis_url: str | None = None
    period_s: float = 0.25
    t0: float = field(default_factory=time.monotonic)
    series: list[tuple[float, list[float], list[float], int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        from redis.asyncio import Redis

        r = Redis.from_url(self.redis_url) if self.redis_url else None
        last = [0.0] * len(self.urls)
        async with aiohttp.ClientSession() as client:
            try:
                while True:
                    ms = await asyncio.gather(*(metrics(client, u) for u in self.urls))
                    done = [m.get("vllm:request_success_total", last[i]) for i, m in enumerate(ms)]
                    last = done
                    waiting = [m.get("vllm:num_requests_waiting", 0.0) for m in ms]
                    mem = int((await r.info("memory"))["used_memory"]) if r else 0
                    self.series.append((time.monotonic() - self.t0, done, waiting, mem))
                    await asyncio.sleep(self.period_s)
            finally:
                if r is not None:
                    await r.aclose()

    @property
    def peak_memory(self) -> int:
        return max((m for *_, m in self.series), default=0)

    @property
    def max_waiting(self) -> float:
        return max((max(w) for _, _, w, _ in self.series if w), default=0.0)


# Set by ``--smoke``: every endpoint group of a fleet in one worker process. The same code
# paths at a fraction of the start-up cost (each worker process imports openai, arq...).
_ONE_PROCESS = [False]


def one_worker_process() -> None:
    """From now on, :class:`Workers` starts one process for all its endpoint groups."""
    _ONE_PROCESS[0] = True


@dataclass
class Workers:
    """Worker processes, one per endpoint group: long-running
    ``arq swarm_queue.worker.WorkerSettings``, or ``swarm-worker --burst`` started with the
    job."""

    redis_url: str
    prefix: str
    groups: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    # swarm-worker --burst (started with the job, gone when it is done), else long-running
    # arq workers.
    burst: bool = False
    # One process per group even under --smoke (a scenario about many worker processes).
    separate: bool = False
    # Each process serves Prometheus metrics on a port of its own (metrics_ports).
    metrics: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    metrics_ports: list[int] = field(default_factory=list)
    # The checkout whose code the workers run (another revision's, to compare): their
    # working directory, first on their path.
    code: Path | None = None

    def start(self) -> Workers:
        OUT.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        one = _ONE_PROCESS[0] and not self.separate
        groups = [[u for g in self.groups for u in g]] if one else self.groups
        for i, group in enumerate(groups):
            env = {
                **base,
                "SWARM_REDIS_URL": self.redis_url,
                "SWARM_PREFIX": self.prefix,
                "SWARM_ENDPOINTS": ",".join(group),
                "SWARM_WORKER_NAME": f"bench-{i}",
                "SWARM_JOBS_REFRESH_S": "0.1",
                **self.env,
            }
            if self.metrics:
                self.metrics_ports.append(free_ports(1)[0])
                env["SWARM_METRICS_PORT"] = str(self.metrics_ports[-1])
                env["SWARM_METRICS_ADDR"] = "127.0.0.1"
            with open(OUT / f"worker-{self.prefix}-{i}.log", "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "swarm_queue.worker.main", "--burst"]
                        if self.burst
                        else [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings"],
                        env=env if self.code is None else {**env, "PYTHONPATH": str(self.code)},
                        cwd=self.code,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


@dataclass
class SwarmRun:
    wall_s: float
    enqueue_s: float
    first_result_s: float
    results: int
    failed: int
    peak_memory: int = 0
    max_waiting: float = 0.0
    series: list[tuple[float, list[float], list[float], int]] = field(default_factory=list)
    queue: QueueTimes = field(default_factory=QueueTimes)
    # With metrics on: prompts done as the workers' Prometheus pages counted them.
    scraped_done: float = 0.0
    # The worker processes' CPU (user + system) over the timed run.
    worker_cpu_s: float = 0.0


def _scraped_done(ports: list[int]) -> float:
    """``swarm_prompts_done_total`` summed over the workers serving metrics on ``ports``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            total += sum(s.value for s in family.samples if s.name == "swarm_prompts_done_total")
    return total


async def wait_workers_ready(store: JobStore, n: int, timeout_s: float = 30.0) -> None:
    """Until ``n`` arq workers have registered their health-check key (they are polling)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await store.arq_worker_alive():
            await asyncio.sleep(0.5)  # let the others finish importing too
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("workers did not start")


async def run_swarm(
    redis_url: str,
    prefix: str,
    fleet: SimFleetProc,
    groups: list[list[str]],
    prompts: list[str],
    max_tokens: int,
    *,
    worker_env: dict[str, str] | None = None,
    during: object = None,
    burst: bool = False,
    metrics: bool = False,
    enqueue: dict[str, Any] | None = None,
    chunk: int = DEFAULT_CHUNK,
    shards: int = 1,
    cluster: bool = False,
) -> SwarmRun:
    """One job through the system: workers already running, then enqueue and collect, timed
    from the first enqueue to the last collected line. With ``burst``, ``--burst`` workers are
    started together with the job, and the time runs from their start. With ``metrics``, the
    workers serve Prometheus metrics, read once the job is done (``SwarmRun.scraped_done``).
    ``chunk``: the job's prompts a stream entry (``--chunk``; the product's default);
    ``shards``: the slots it is spread over (``--shards``), ``cluster``: on a Redis Cluster."""
    settings = Settings(redis_url=redis_url, prefix=prefix, redis_cluster=cluster)
    store = JobStore.from_settings(settings)
    t0 = time.monotonic()
    workers = Workers(redis_url, prefix, groups, worker_env or {}, burst=burst, metrics=metrics)
    workers.start()
    try:
        if not burst:
            await wait_workers_ready(store, len(groups))
            t0 = time.monotonic()
        cpu0 = sum(cpu_s(p.pid) for p in workers.procs)
        sampler = Sampler(fleet.urls, redis_url).start()
        spec = JobSpec(
            job="bench",
            params=SamplingParams(max_tokens=max_tokens),
            chunk=chunk,
            shards=shards,
        )
        await enqueue_prompts(store, spec, ((p, None) for p in prompts), **(enqueue or {}))
        t_enq = time.monotonic() - t0
        first: list[float] = []

        async def mark(index: int) -> None:
            if not first:
                first.append(time.monotonic() - t0)

        extra = asyncio.create_task(during(store, t0)) if callable(during) else None
        with open(os.devnull, "wb") as sink:
            report = await write_output(
                store, "bench", sink, wait=True, poll_s=0.02, on_commit=mark
            )
        wall = time.monotonic() - t0
        cpu = sum(cpu_s(p.pid) for p in workers.procs) - cpu0
        if extra is not None:
            await extra
        await sampler.stop()
        status = await store.status("bench")
        return SwarmRun(
            wall,
            t_enq,
            first[0] if first else wall,
            report.written,
            status.failed,
            sampler.peak_memory,
            sampler.max_waiting,
            sampler.series,
            await queue_times(fleet.urls),
            await asyncio.to_thread(_scraped_done, workers.metrics_ports),
            cpu,
        )
    finally:
        workers.stop()
        await store.close()


async def run_scale(
    redis_url: str,
    prefix: str,
    fleet: SimFleetProc,
    n: int,
    size: int,
    window: int | None,
    *,
    worker_env: dict[str, str] | None = None,
) -> SwarmRun:
    """A huge job with enqueue and collect running at once, as a user streams one: with a
    ``window``, the collector also evicts what it has written."""
    settings = Settings(redis_url=redis_url, prefix=prefix)
    store = JobStore.from_settings(settings)
    workers = Workers(redis_url, prefix, [[u] for u in fleet.urls], worker_env or {}).start()
    out = OUT / f"{prefix}.jsonl"
    for stale in (out, out.with_name(out.name + ".cursor")):
        stale.unlink(missing_ok=True)
    try:
        await wait_workers_ready(store, len(fleet.urls))
        sampler = Sampler(fleet.urls, redis_url).start()
        t0 = time.monotonic()
        spec = JobSpec(job="bench", params=SamplingParams(max_tokens=16))

        async def produce() -> float:
            await enqueue_prompts(store, spec, prompt_iter(n, size), window=window)
            return time.monotonic() - t0

        enq = asyncio.create_task(produce())
        report = await collect_output(
            store, "bench", str(out), wait=True, progress=False, evict=window is not None
        )
        wall = time.monotonic() - t0
        enq_s = await enq
        await sampler.stop()
        status = await store.status("bench")
        return SwarmRun(
            wall,
            enq_s,
            wall,
            report.written,
            status.failed,
            sampler.peak_memory,
            sampler.max_waiting,
            sampler.series,
        )
    finally:
        workers.stop()
        await store.close()
        out.unlink(missing_ok=True)
        out.with_name(out.name + ".cursor").unlink(missing_ok=True)


async def urgent_job_time(
    redis_url: str,
    prefix: str,
    fleet: SimFleetProc,
    urgent: list[str],
    max_tokens: int,
    *,
    priority: int,
    background: list[str] | None = None,
    background_done: int = 0,
) -> tuple[float, int, int]:
    """Seconds from queuing the job ``urgent`` (at ``priority``) to its last result, through
    long-running workers, one per endpoint; with ``background``, queued first, and ``urgent``
    only once ``background_done`` of its prompts are answered (the background job is cancelled
    afterwards). Also returns the background prompts answered meanwhile, and the prompts the
    workers preempted (from their exit lines): the work the urgent job cost."""
    settings = Settings(redis_url=redis_url, prefix=prefix)
    store = JobStore.from_settings(settings)
    workers = Workers(redis_url, prefix, [[u] for u in fleet.urls]).start()
    params = SamplingParams(max_tokens=max_tokens)
    try:
        await wait_workers_ready(store, len(fleet.urls))
        if background:
            await enqueue_prompts(
                store, JobSpec(job="big", params=params), ((p, None) for p in background)
            )
            while (await store.status("big")).done < background_done:
                await asyncio.sleep(0.02)
        before = (await store.status("big")).done if background else 0
        t0 = time.time()
        spec = JobSpec(job="urgent", params=params, priority=priority)
        await enqueue_prompts(store, spec, ((p, None) for p in urgent))
        while not (status := await store.status("urgent")).finished:
            await asyncio.sleep(0.02)
        finished = float((await store.meta("urgent"))[Meta.FINISHED_S])
        meanwhile = ((await store.status("big")).done - before) if background else 0
        if background:
            await store.cancel("big")
        assert status.done == len(urgent), status
    finally:
        workers.stop()
        await store.close()
    (preempted,) = from_exit_lines(prefix, r"(\d+) prompts preempted")
    return finished - t0, meanwhile, preempted


def from_exit_lines(prefix: str, pattern: str) -> tuple[int, ...]:
    """Figures the workers of ``prefix`` logged as they exited: each group of ``pattern``
    summed over every match in their logs."""
    found = [
        tuple(int(g) for g in (m if isinstance(m, tuple) else (m,)))
        for log in OUT.glob(f"worker-{prefix}-*.log")
        for m in re.findall(pattern, log.read_text())
    ]
    groups = re.compile(pattern).groups
    return tuple(sum(f[i] for f in found) for i in range(groups))


async def kill_at_share(
    fleet: SimFleetProc, store: JobStore, job: str, done: int, t0: float
) -> dict[str, float]:
    """Kill the fleet's last endpoint once ``done`` results of ``job`` are in: when (seconds
    after ``t0``) and how many results were in by then."""
    while (await store.status(job)).done < done:
        await asyncio.sleep(0.02)
    killed = {"t": time.monotonic() - t0, "done": float((await store.status(job)).done)}
    fleet.kill_endpoint(len(fleet.ports) - 1)
    return killed


# An engine that answers at once: what the system itself costs, without the model's time.
# The key under which redis_cost reports Redis's CPU time per prompt.
# The tool runner (swarm-tools) as ``python -c``, with the code of whichever revision is on the
# path: its module moved (worker/tools.py before tools/runner.py), the benchmarks compare both.
TOOL_RUNNER = """
try:
    from swarm_queue.tools.runner import main
except ImportError:  # a revision before the tools' own room
    from swarm_queue.worker.tools import main
main()
"""
REDIS_US = "Redis CPU us per prompt"
INSTANT = EngineConfig(instant=True)


async def redis_cpu_s(r: aioredis.Redis) -> float:
    """CPU seconds (user + system) the Redis server has used since it started."""
    cpu = await r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


@contextlib.asynccontextmanager
async def redis_cost(url: str, n: int) -> AsyncIterator[dict[str, float]]:
    """Redis's own CPU time and commands (Lua's included) per prompt over the block, read
    from INFO cpu and INFO commandstats of the bench's private Redis."""
    r = aioredis.Redis.from_url(url)
    cost: dict[str, float] = {}
    try:
        await r.config_resetstat()
        before = await redis_cpu_s(r)
        yield cost
        spent = await redis_cpu_s(r) - before
        stats = await r.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if "config" not in k)
        cost[REDIS_US] = spent / n * 1e6
        cost["Redis commands per prompt"] = calls / n
    finally:
        await r.aclose()


class Bench:
    """A private Redis for one benchmark session."""

    def __enter__(self) -> Bench:
        self.redis = EmbeddedRedis().start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.redis.close()

    @property
    def url(self) -> str:
        return self.redis.url


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (the kernel may hand the same free port out twice)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def new_fleet(n: int, config: EngineConfig, speeds: Sequence[float] | None = None) -> SimFleetProc:
    return SimFleetProc(free_ports(n), list(speeds or [1.0] * n), config)
