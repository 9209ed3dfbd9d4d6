"""End to end with real processes: swarm-sim, `arq swarm_queue.worker.WorkerSettings --burst`
workers, and the swarm-enqueue / swarm-collect command lines, against a real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis

from swarm_queue.common.embedded import free_port
from swarm_queue.common.keys import Keys
from swarm_queue.sim.launch import launch
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, command

pytestmark = pytest.mark.slow


@pytest.fixture
def sim_ports() -> Iterator[list[int]]:
    ports = [free_port() for _ in range(4)]
    proc = launch(ports, "--step-ms", "2")
    try:
        yield ports
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def env(redis_url: str, prefix: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    return {**e, "SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix}


def _prompt(i: int) -> str:
    return f"Describe protein P{i:06d} briefly."


def test_cli_job_over_four_endpoints_and_two_worker_processes(
    tmp_path: Path, sim_ports: list[int], env: dict[str, str]
) -> None:
    n = 2400
    src = tmp_path / "prompts.jsonl"
    src.write_text(
        "".join(
            msgspec.json.encode({"prompt": _prompt(i), "custom_id": f"c{i}"}).decode() + "\n"
            for i in range(n)
        )
    )
    out = subprocess.run(
        [BIN / "swarm-enqueue", src, "--job", "e2e", "--max-tokens", "12"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"job e2e: {n} prompts queued ({n} new, 0 already queued)"

    workers = []
    for pair in (sim_ports[:2], sim_ports[2:]):
        wenv = {**env, "SWARM_ENDPOINTS": ",".join(f"127.0.0.1:{p}" for p in pair)}
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings", "--burst"],
                env=wenv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = tmp_path / "results.jsonl"
    collected = subprocess.run(
        [BIN / "swarm-collect", "e2e", "--out", results, "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    logs = [w.communicate(timeout=60)[0] for w in workers]
    assert collected.returncode == 0, collected.stderr
    assert f"wrote {n} of {n} results ({n} ok, 0 failed)" in collected.stderr
    assert [w.returncode for w in workers] == [0, 0], logs

    lines = [msgspec.json.decode(x) for x in results.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    for x in lines:
        text, _, reason = completion_for(_prompt(x["index"]), 12)
        assert (x["text"], x["finish_reason"], x["error"]) == (text, reason, None)
        assert x["custom_id"] == f"c{x['index']}"
    endpoints = {x["endpoint"] for x in lines}
    assert endpoints == {f"http://127.0.0.1:{p}" for p in sim_ports}

    status = subprocess.run(
        [BIN / "swarm-status", "e2e"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "job e2e: finished" in status and f"done       {n}" in status


def test_enqueue_killed_halfway_then_rerun_leaves_exactly_n_entries(
    tmp_path: Path, env: dict[str, str], redis_url: str, prefix: str
) -> None:
    """Every prompt queued once, in its place: chunks of 16 (the default), each entry's ID
    its first prompt's."""
    n = 300_000
    src = tmp_path / "big.txt"
    src.write_text("".join(f"{_prompt(i)}\n" for i in range(n)))
    client = redis.Redis.from_url(redis_url)
    stream = f"{prefix}:{{big}}:q"
    meta = f"{prefix}:{{big}}:meta"

    def queued() -> int:
        return int(client.hget(meta, "enqueued") or 0)

    try:
        proc = subprocess.Popen(
            [BIN / "swarm-enqueue", src, "--job", "big"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while queued() < 20_000 and time.monotonic() < deadline:
            assert proc.poll() is None, "finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = queued()
        assert 20_000 <= partial < n and client.xlen(stream) == -(-partial // 16)
        rerun = subprocess.run(
            [BIN / "swarm-enqueue", src, "--job", "big"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rerun.returncode == 0, rerun.stderr
        assert f"{n} prompts queued ({n - partial} new, {partial} already queued)" in rerun.stdout
        assert (queued(), client.xlen(stream)) == (n, n // 16)
        first = client.xrange(stream, count=1)[0][0]
        last = client.xrevrange(stream, count=1)[0][0]
        # IDs strictly increasing, n / 16 entries from 0-1 to 0-(n-15): each chunk in its
        # place, once (a resume cut at a chunk's middle starts a chunk of its own there).
        assert (first, last) == (b"0-1", f"0-{n - 15}".encode())
        assert client.hget(f"{prefix}:{{big}}:meta", "total") == str(n).encode()
    finally:
        client.close()


def test_enqueue_reports_a_malformed_line_with_file_and_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    out = subprocess.run(
        [BIN / "swarm-enqueue", src, "--job", "bad"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"swarm-enqueue: error: {src}:2: prompt must be a string, got int"
    )
    bad_job = subprocess.run(
        [BIN / "swarm-enqueue", src, "--job", "x}{y"], env=env, capture_output=True, text=True
    )
    assert bad_job.returncode == 2 and "invalid job name 'x}{y'" in bad_job.stderr


def test_password_in_the_redis_url_is_never_printed(tmp_path: Path, env: dict[str, str]) -> None:
    port = free_port()  # nothing listens: the command must fail, and say where, masked
    src = tmp_path / "p.txt"
    src.write_text("hello\n")
    bad = {**env, "SWARM_REDIS_URL": f"redis://user:hunter2@127.0.0.1:{port}/0"}
    out = subprocess.run(
        [BIN / "swarm-status", "j"], env=bad, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert "hunter2" not in out.stderr + out.stdout
    assert f"redis://user:***@127.0.0.1:{port}/0" in out.stderr


def _collect(env: dict[str, str], job: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / "swarm-collect", job, "--out", out, "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_long_running_worker_serves_new_jobs_then_stops_cleanly_on_sigterm(
    tmp_path: Path, sim_ports: list[int], env: dict[str, str]
) -> None:
    wenv = {**env, "SWARM_ENDPOINTS": f"127.0.0.1:{sim_ports[0]}", "SWARM_JOBS_REFRESH_S": "0.1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings"],
        env=wenv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for job, n in (("first", 300), ("second", 200)):  # the second is queued after the first
            src = tmp_path / f"{job}.txt"
            src.write_text("".join(f"{job} {_prompt(i)}\n" for i in range(n)))
            subprocess.run(
                [BIN / "swarm-enqueue", src, "--job", job, "--max-tokens", "8"],
                env=env,
                check=True,
                capture_output=True,
            )
            done = _collect(env, job, tmp_path / f"{job}.jsonl")
            assert done.returncode == 0, done.stderr
            lines = (tmp_path / f"{job}.jsonl").read_bytes().splitlines()
            texts = [msgspec.json.decode(x)["text"] for x in lines]
            assert texts == [completion_for(f"{job} {_prompt(i)}", 8)[0] for i in range(n)]
        assert worker.poll() is None  # not in burst mode: still running
        worker.send_signal(signal.SIGTERM)
        log = worker.communicate(timeout=30)[0]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, log
    assert "stopping: finishing batches in flight" in log
    assert "500 prompts done, 0 failed" in log


def test_arq_payloads_are_msgpack_never_pickle(
    env: dict[str, str], redis_url: str, prefix: str
) -> None:
    import asyncio

    from arq import create_pool
    from arq.connections import RedisSettings

    from swarm_queue.worker.app import job_deserializer, job_serializer

    async def enqueue_ping() -> str:
        pool = await create_pool(
            RedisSettings.from_dsn(redis_url),
            job_serializer=job_serializer,
            job_deserializer=job_deserializer,
            default_queue_name=Keys(prefix).arq_queue,
        )
        try:
            job = await pool.enqueue_job("ping")
            assert job is not None
            return job.job_id
        finally:
            await pool.aclose()

    job_id = asyncio.run(enqueue_ping())
    wenv = {**env, "SWARM_ENDPOINTS": "127.0.0.1:9"}  # never called: no swarm job exists
    subprocess.run(
        [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings", "--burst"],
        env=wenv,
        check=True,
        capture_output=True,
        timeout=60,
    )
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(f"arq:result:{job_id}")
    finally:
        client.delete(f"arq:result:{job_id}")  # arq's own fixed key, outside our prefix
        client.close()
    assert raw is not None and not raw.startswith(b"\x80")  # pickle's protocol marker
    stored = msgspec.msgpack.decode(raw)
    assert (stored["f"], stored["s"], stored["r"]) == ("ping", True, "pong")


def test_collector_killed_mid_write_resumes_to_a_byte_identical_file(
    tmp_path: Path, env: dict[str, str], redis_url: str, prefix: str
) -> None:
    from swarm_queue.common.models import JobSpec, Result, encode

    n = 200_000
    client = redis.Redis.from_url(redis_url)
    meta, results = f"{prefix}:{{big}}:meta", f"{prefix}:{{big}}:results"
    try:
        client.hset(
            meta,
            mapping={
                "spec": encode(JobSpec(job="big")),
                "total": n,
                "done": n,
                "enqueued": n,
                "finished_s": "1",
            },
        )
        for start in range(0, n, 20_000):
            client.hset(
                results,
                mapping={
                    str(i): encode(
                        Result(
                            index=i,
                            text=f" answer {i} " + "w" * (i % 50),
                            finish_reason="stop",
                            endpoint="e",
                            attempts=1,
                        )
                    )
                    for i in range(start, start + 20_000)
                },
            )
        reference, out = tmp_path / "reference.jsonl", tmp_path / "out.jsonl"
        cursor = Path(f"{out}.cursor")
        ref = command(env, "swarm-collect", "big", "--out", reference)
        assert ref.returncode == 0, ref.stderr
        proc = subprocess.Popen(
            [BIN / "swarm-collect", "big", "--out", out],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            cursor.exists() and out.exists() and out.stat().st_size > 2_000_000
        ):
            assert proc.poll() is None, "finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert out.stat().st_size < reference.stat().st_size
        with open(out, "ab") as fh:  # as if it died after writing lines, before their cursor
            fh.write(b'{"index": 999999, "text": "torn')
        again = command(env, "swarm-collect", "big", "--out", out)
        assert again.returncode == 0, again.stderr
        assert "resumed at" in again.stderr
        assert out.read_bytes() == reference.read_bytes()
        # A finished file's cursor says so, and the same command again leaves the file alone.
        assert msgspec.json.decode(cursor.read_bytes())["complete"] is True
        rerun = command(env, "swarm-collect", "big", "--out", out)
        assert rerun.returncode == 0, rerun.stderr
        assert f"{out} already holds all {n} results of job big; left alone" in rerun.stderr
        assert out.read_bytes() == reference.read_bytes()
    finally:
        client.delete(meta, results)
        client.close()


def test_settings_are_read_when_arq_asks_for_them_not_on_import(env: dict[str, str]) -> None:
    bad = {**env, "SWARM_BATCH_SIZE": "abc"}
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import swarm_queue.worker.app, swarm_queue.worker.engine, swarm_queue.worker.main",
        ],
        env=bad,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    for cmd in (
        [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings"],
        [str(BIN / "swarm-worker")],
    ):
        run = subprocess.run(cmd, env=bad, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2
        assert run.stderr.strip().endswith("error: SWARM_BATCH_SIZE='abc' is not a valid int")
