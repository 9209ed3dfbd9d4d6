"""A Redis whose project user has exactly the ACL docs/HPC.md gives (its ``--user`` line read
from the file): enqueue, both ways of running a worker, collect, status, retry and the
dashboard all work through it, as real processes, and Redis refuses none of their commands.
A stricter user (no ``INFO``) still queues and collects, and a worker names the rules it
lacks in one line instead of a traceback."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from swarm_queue.common.embedded import free_port
from swarm_queue.common.keys import Keys
from swarm_queue.common.store.base import acl_rules
from tests.harness import BIN, Fleet, check_output, collect, command, doc_acl_user
from tests.servers import redis_server

pytestmark = pytest.mark.slow

USER, PASSWORD, PROJECT = "alice", "alice-acl-pw", "proj"
ADMIN = "admin-acl-pw"


def _documented() -> tuple[str, ...]:
    return doc_acl_user("docs/HPC.md", USER=USER, SWARM_PASSWORD=PASSWORD, PROJECT=PROJECT)


@contextlib.contextmanager
def _acl_fleet(tmp_path: Path, user: tuple[str, ...]) -> Iterator[Fleet]:
    """A Redis whose project user has the ACL ``user``, its default user behind a password,
    and a swarm-sim with the project's environment around it. At the end, Redis's ACL LOG
    holds no refusal but those ``allowed``."""
    with redis_server(extra_args=("--requirepass", ADMIN, *user)) as server:
        url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0"
        fleet = Fleet(tmp_path, url, PROJECT, 1)
        try:
            yield fleet
        finally:
            fleet.close()
        admin = redis.Redis(port=server.port, password=ADMIN)
        refused = {(str(e["reason"]), str(e["object"])) for e in admin.acl_log(count=100)}
        admin.close()
    # arq's own connections name themselves (CLIENT SETINFO, refused and ignored); nothing
    # else swarm-queue sends may be refused, but INFO where the user may not run it.
    allowed = {("command", "client")}
    if "+info" not in user:
        allowed.add(("command", "info"))
    assert refused <= allowed


def test_the_documented_rules_are_the_ones_a_worker_names() -> None:
    """What the docs give and what a worker asks for cannot drift apart."""
    rules = " ".join(f"'{w}'" for w in _documented()[4:])
    assert rules == acl_rules(Keys(PROJECT))
    security = doc_acl_user("docs/SECURITY.md", ALICE_PASSWORD=PASSWORD)
    assert " ".join(f"'{w}'" for w in security[4:]) == acl_rules(Keys("genes"))


def _board(env: dict[str, str]) -> dict[str, object]:
    """One board of ``swarm-status --serve``, read over HTTP, the server then interrupted."""
    port = free_port()
    with subprocess.Popen(
        [BIN / "swarm-status", "--serve", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as server:
        try:
            assert server.stdout is not None
            assert "dashboard on" in server.stdout.readline()
            url = f"http://127.0.0.1:{port}/api/board"
            with urllib.request.urlopen(url, timeout=30) as resp:
                board: dict[str, object] = json.loads(resp.read())
        finally:
            server.terminate()
            server.wait(timeout=30)
    return board


def test_every_command_and_both_workers_work_under_the_documented_acl(tmp_path: Path) -> None:
    with _acl_fleet(tmp_path, _documented()) as fleet:
        _every_command(fleet, tmp_path)


def _every_command(fleet: Fleet, tmp_path: Path) -> None:
    poison = {4, 9}
    assert fleet.enqueue("acl", 60, poison).wait(timeout=60) == 0
    assert fleet.worker("w1", [0]).wait(timeout=120) == 0, fleet.logs[-1].read_text()[-3000:]

    status = command(fleet.env, "swarm-status", "acl")
    assert status.returncode == 0, status.stderr
    assert re.search(r"done\s+58\b", status.stdout) and re.search(r"failed\s+2\b", status.stdout)
    out = tmp_path / "acl.jsonl"
    first = collect(fleet.env, "acl", out)
    assert "58 ok, 2 failed" in first.stdout + first.stderr
    check_output(out, 60, poison)

    retry = command(fleet.env, "swarm-retry", "acl")
    assert retry.returncode == 0, retry.stderr
    assert "2" in retry.stdout
    # arq's own command line this time: arq reads INFO at its start.
    worker = fleet.worker("w2", [0], arq_cli=True)
    assert worker.wait(timeout=120) == 0, fleet.logs[-1].read_text()[-3000:]
    collect(fleet.env, "acl", out)
    check_output(out, 60, poison)  # the two over-long prompts failed again, the same way

    board = _board(fleet.env)
    assert board["error"] is None
    (row,) = [j for j in board["jobs"] if j["job"] == "acl"]  # type: ignore[attr-defined]
    assert (row["done"], row["failed"], row["total"]) == (58, 2, 60)
    logs = "".join(log.read_text() for log in fleet.logs)
    assert "Traceback" not in logs and PASSWORD not in logs


def test_a_user_without_info_queues_and_a_worker_names_the_rules_it_needs(
    tmp_path: Path,
) -> None:
    stricter = tuple(w for w in _documented() if w != "+info")
    with _acl_fleet(tmp_path, stricter) as fleet:
        _without_info(fleet, tmp_path)


def _without_info(fleet: Fleet, tmp_path: Path) -> None:
    src = tmp_path / "few.txt"
    src.write_text("".join(f"question {i}\n" for i in range(30)))
    enqueue = command(fleet.env, "swarm-enqueue", src, "--job", "strict")
    assert enqueue.returncode == 0, enqueue.stderr
    notes = [x for x in enqueue.stderr.splitlines() if "may not run INFO" in x]
    assert notes == [
        "swarm-enqueue: note: this Redis user may not run INFO (its ACL), so its maxmemory is "
        "not read: prompts are queued without waiting for room for their answers"
    ]
    status = command(fleet.env, "swarm-status", "strict")
    assert status.returncode == 0 and re.search(r"total\s+30\b", status.stdout), status.stderr

    worker = command(
        {**fleet.env, "SWARM_ENDPOINTS": fleet.url(0)}, "swarm-worker", "--burst", timeout_s=60
    )
    assert worker.returncode == 1
    (line,) = worker.stderr.strip().splitlines()
    assert line.startswith(
        f"swarm-worker: error: Redis at redis://{USER}:***@127.0.0.1:"
    ) and line.endswith(
        "A worker's Redis user needs these ACL rules: '~proj:*' '~{arq:abort}:proj:*' "
        "'~arq:*' '&*' '+@all' '-@dangerous' '+info'"
    )
    assert "info" in line and PASSWORD not in line
