"""A swarm-gateway process for the tests, and the openai SDK calls they make on it: shared by
the gateway's tests and the shared case."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import openai

from swarm_queue.common.embedded import free_port
from tests.harness import BIN, MAX_TOKENS, fleet_prompt, wait_port

__all__ = [
    "OVER", "alive", "children", "client", "completion_line", "completions_batch", "file_lines",
    "gateway", "upload", "wait_answered", "wait_over",
]  # fmt: skip

OVER = {"completed", "failed", "expired", "cancelled"}


@contextlib.contextmanager
def gateway(
    env: Mapping[str, str], tmp: Path, *args: str, port: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """A swarm-gateway process on a port of its own, its files under ``tmp``; its log. A port
    chosen free may be taken by another test's server before the gateway binds it (seen under
    CPU pressure: the client then talked to a swarm-sim, 404): the listener is checked to be
    this gateway, else it starts again on another port (a port given is kept)."""
    for attempt in range(3):
        at = port or free_port()
        log = tmp / f"gateway-{at}-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [BIN / "swarm-gateway", "--port", str(at), "--dir", tmp / "files", *args],
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_port(at, proc)
            ours = _listens(proc.pid, at)
            if ours or port is not None or attempt == 2:
                assert ours, f"port {at} is another process's"
                yield proc, at, log
                return
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _listens(pid: int, port: int, timeout_s: float = 20.0) -> bool:
    """Whether ``pid`` (or a child of it) holds the socket listening on ``port``, waiting
    until it does or the process ends (read from /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        inodes = {
            f[9]
            for table in ("/proc/net/tcp", "/proc/net/tcp6")
            for f in (line.split() for line in Path(table).read_text().splitlines()[1:])
            if f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port
        }
        for owner in (pid, *children(pid)):
            with contextlib.suppress(OSError):
                for fd in Path(f"/proc/{owner}/fd").iterdir():
                    with contextlib.suppress(OSError):
                        if os.readlink(fd) in {f"socket:[{i}]" for i in inodes}:
                            return True
        time.sleep(0.05)
    return False


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def client(port: int, key: str = "no-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)


def upload(client: openai.OpenAI, tmp: Path, name: str, lines: list[Any]) -> str:
    path = tmp / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with path.open("rb") as fh:
        return client.files.create(file=fh, purpose="batch").id


def wait_over(client: openai.OpenAI, batch_id: str, stall_s: float = 120.0) -> Any:
    """The batch once it is over; fails only after ``stall_s`` without progress (a loaded
    machine is slow, not stuck)."""
    last, since = None, time.monotonic()
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in OVER:
            return batch
        mark = (batch.status, batch.request_counts.completed, batch.request_counts.failed)
        if mark != last:
            last, since = mark, time.monotonic()
        assert time.monotonic() - since < stall_s, f"batch {batch_id} stuck at {mark}"
        time.sleep(0.1)


def wait_answered(client: openai.OpenAI, batch_id: str, done: int, stall_s: float = 120.0) -> Any:
    """The batch once ``done`` of its requests are answered (or it is over)."""
    since = time.monotonic()
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in OVER or batch.request_counts.completed >= done:
            return batch
        assert time.monotonic() - since < stall_s, f"batch {batch_id}: {batch}"
        time.sleep(0.05)


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def completion_line(i: int, poison: set[int]) -> dict[str, Any]:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": fleet_prompt(i, poison), "max_tokens": MAX_TOKENS},
    }


def completions_batch(client: openai.OpenAI, tmp: Path, n: int, window: str = "24h") -> Any:
    """A batch of ``n`` completions requests, created."""
    lines = [completion_line(i, set()) for i in range(n)]
    return client.batches.create(
        input_file_id=upload(client, tmp, "c.jsonl", lines),
        endpoint="/v1/completions",
        completion_window=window,
    )
