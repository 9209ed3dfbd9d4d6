"""swarm-sim as a process of its own, started and waited for: what the demo, the benchmarks and
the tests with real processes share."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import IO

__all__ = ["SimExited", "launch", "wait_listening"]


class SimExited(RuntimeError):
    """The simulator ended before it listened, or a port it was given is another process's:
    a port taken between choosing it and binding it (choose new ports and launch again)."""


def wait_listening(
    ports: Sequence[int], proc: subprocess.Popen[bytes], timeout_s: float = 20.0
) -> None:
    """Return once something accepts connections on every port of ``proc`` (a server
    process); :class:`SimExited` if it exits first, RuntimeError if it is not there in time."""
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            if proc.poll() is not None:
                raise SimExited(f"process exited with {proc.returncode} before port {port}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing listening on {port}") from None
                time.sleep(0.02)


def launch(
    ports: Sequence[int], *args: str, log: IO[bytes] | None = None, timeout_s: float = 20.0
) -> subprocess.Popen[bytes]:
    """``python -m swarm_queue.sim --ports ... ARGS``, returned once every port listens (its
    output to ``log``, else discarded). The caller stops it; it is killed here if it never
    listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm_queue.sim", "--ports", ",".join(map(str, ports)), *args],
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_listening(ports, proc, timeout_s)
        for port in ports:  # something listens: that it is this simulator, not a neighbour
            if _pid_of(port) != proc.pid:
                raise SimExited(f"port {port} is another process's")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    return proc


def _pid_of(port: int) -> int | None:
    """The pid a swarm-sim on ``port`` reports (None: no simulator of ours answers there)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/pid", timeout=5) as resp:
            pid = json.loads(resp.read()).get("pid")
    except (OSError, ValueError):
        return None
    return pid if isinstance(pid, int) else None
