"""``swarm-node``, one compute node in one command, with real processes: swarm-sim as the
engine command, a real Redis. Its engines started one per device, a job drained by its worker
through an engine SIGKILLed and restarted, every answer exact and once; SIGTERM stops the
worker within its grace, then every engine."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.text import completion_for
from tests.harness import BIN
from tests.helpers import collect_lines, prompts, spec


async def _until(what: str, done: Callable[[], Any], stall_s: float = 120.0) -> None:
    """Until ``done()`` (awaited if it is a coroutine) holds."""
    since = time.monotonic()
    while True:
        got = done()
        if await got if inspect.isawaitable(got) else got:
            return
        assert time.monotonic() - since < stall_s, f"no {what} in {stall_s:.0f} s"
        await asyncio.sleep(0.05)


def _said(log: Path, pattern: str) -> list[re.Match[str]]:
    return list(re.finditer(pattern, log.read_text()))


def _node(cli_env: dict[str, str], log: Path, logs: Path) -> subprocess.Popen[bytes]:
    """swarm-node with 4 swarm-sim engines, each told its device in FAKE_DEVICE."""
    engine = f"{BIN / 'swarm-sim'} --port {{port}} --step-ms 20 --max-num-seqs 16"
    env = {**cli_env, "SWARM_SHUTDOWN_GRACE_S": "10", "SWARM_POLL_MS": "50"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [BIN / "swarm-node", "--engines", "4", "--engine", engine,
             "--device-env", "FAKE_DEVICE", "--log-dir", logs],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # (a zombie is gone)


async def test_a_node_drains_a_job_through_a_killed_engine_and_stops_on_sigterm(
    cli_env: dict[str, str], store: JobStore, tmp_path: Path
) -> None:
    n = 600
    await enqueue_prompts(store, spec(max_tokens=12), prompts(n))
    log = tmp_path / "node.log"
    node = _node(cli_env, log, tmp_path / "logs")
    try:
        await _until("4 healthy engines", lambda: len(_said(log, r"engine \d healthy")) == 4)
        started = {int(m[1]): int(m[2]) for m in _said(log, r"engine (\d) started \(pid (\d+)")}
        for index, pid in started.items():  # one device each
            assert f"FAKE_DEVICE={index}".encode() in _environ(pid)
        await _until("a third answered", lambda: _done(store, n // 3))
        os.kill(started[2], signal.SIGKILL)
        await _until("engine 2 started again", lambda: len(_said(log, r"engine 2 started")) == 2)
        await _until("engine 2 healthy again", lambda: len(_said(log, r"engine 2 healthy")) == 2)
        await _until("every answer", lambda: _done(store, n))
        lines = await collect_lines(store, "j")
        assert [x["index"] for x in lines] == list(range(n))
        assert (await store.status("j")).done == n  # each answer counted once
        for x, (prompt, _) in zip(lines, prompts(n), strict=True):
            assert x["text"] == completion_for(prompt, 12)[0]
        worker = int(_said(log, r"worker started \(pid (\d+)")[0][1])
        engines = [int(m[2]) for m in _said(log, r"engine (\d) started \(pid (\d+)")]
        node.send_signal(signal.SIGTERM)
        assert node.wait(10 + 20) == 0  # the worker's grace, then the engines' stop
        assert not [pid for pid in [worker, *engines] if _alive(pid)]
        assert _said(log, "SIGTERM received: stopping the worker")
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


async def _done(store: JobStore, at_least: int) -> bool:
    return (await store.status("j")).done >= at_least


def test_a_node_whose_engine_command_cannot_run_says_so_and_exits_2(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    got = subprocess.run(
        [BIN / "swarm-node", "--engine", "no-such-engine --port {port}", "--log-dir", tmp_path],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert got.returncode == 2
    assert "error: cannot start the engine command 'no-such-engine'" in got.stderr
    bad = subprocess.run(
        [BIN / "swarm-node", "--engine", "vllm serve m"], env=cli_env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "put {port} where the command names it" in bad.stderr


def test_a_node_whose_every_engine_keeps_dying_gives_up_and_ends_1(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Never a node waiting for ever on engines that cannot come up (a wrong model path, a
    GPU gone): each is restarted --restarts times, then given up on; with none left, the
    node stops its worker and ends, status 1."""
    dying = f"{BIN / 'python'} -c 'raise SystemExit(3)' --port {{port}}"
    env = {**cli_env, "SWARM_SHUTDOWN_GRACE_S": "5"}
    got = subprocess.run(
        [BIN / "swarm-node", "--engines", "2", "--engine", dying, "--restarts", "1",
         "--log-dir", tmp_path],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 1, got.stderr
    for index in (0, 1):
        assert f"engine {index} exited with status 3; restarting in" in got.stderr
        assert f"engine {index} given up on: it died 2 times, never healthy between" in got.stderr
    assert "error: every engine given up on: stopping the worker" in got.stderr
