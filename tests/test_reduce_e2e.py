"""The reduce stage with real processes: the CLI, workers whose sweeps advance the stages, and
a worker SIGKILLed between two stages. No collector runs while the job does."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import msgspec
import pytest
import redis

from swarm_queue.common.keys import Keys, stage_name
from tests.harness import (
    BIN,
    MAX_TOKENS,
    TEMPLATE,
    FleetFactory,
    expected_tree,
    fleet_prompt,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


def test_tree_reduce_survives_a_worker_killed_between_stages(fleet_factory: FleetFactory) -> None:
    n, fanin = 1000, 10
    fleet = fleet_factory(2)
    template = fleet.tmp / "reduce.txt"
    template.write_text(TEMPLATE)
    src = fleet.tmp / "leaves.txt"
    src.write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(n)))
    enq = subprocess.run(
        [
            BIN / "swarm-enqueue",
            src,
            "--job",
            "tree",
            "--max-tokens",
            str(MAX_TOKENS),
            "--reduce",
            "tree",
            "--reduce-prompt",
            template,
            "--fanin",
            str(fanin),
        ],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert enq.returncode == 0, enq.stderr
    keys = Keys(fleet.prefix)
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        first = fleet.worker("a", [0, 1])
        # The moment the map stage is done, before or while its reduce is advanced.
        wait_until("the map stage", lambda: client.hexists(keys.meta("tree"), "finished_s"), 120)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert not client.exists(keys.final("tree"))
        # What the killed worker held (a level's lock, half of its prompts queued) is taken
        # up by the next: its lock is a dead process's.
        second = fleet.worker("b", [0, 1])
        assert second.wait(timeout=180) == 0, fleet.logs[-1].read_text()[-3000:]

        answer, per_level = expected_tree(n, fanin)
        assert per_level == [100, 10, 1]
        for level, count in enumerate(per_level, 1):
            meta = client.hgetall(keys.meta(stage_name("tree", level)))
            # queued once: exactly the expected prompts, each answered once
            assert (int(meta[b"total"]), int(meta[b"enqueued"])) == (count, count)
            assert (int(meta[b"done"]), int(meta.get(b"failed", 0))) == (count, 0)
        names = {m.decode() for m in client.smembers(keys.jobs)}
        assert names == {"tree", "tree:r1", "tree:r2", "tree:r3"}
    finally:
        client.close()

    out = fleet.tmp / "final.json"
    final = subprocess.run(
        [BIN / "swarm-collect", "tree", "--final", "--out", out],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert final.returncode == 0, final.stderr
    doc = msgspec.json.decode(out.read_bytes())
    assert doc["value"] == answer
    assert (doc["kind"], doc["used"], doc.get("failed", [])) == ("tree", n, [])
    assert [(lv["level"], lv["prompts"]) for lv in doc["levels"]] == [(1, 100), (2, 10), (3, 1)]


def test_reduce_options_are_checked_before_anything_is_queued(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(1)
    src = tmp_path / "p.txt"
    src.write_text("a\nb\n")

    def enqueue(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN / "swarm-enqueue", src, "--job", "bad", *extra],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = enqueue("--reduce", "tree")
    assert out.returncode == 2
    assert "--reduce tree needs --reduce-prompt FILE" in out.stderr
    out = enqueue("--reduce", "median")
    assert out.returncode == 2 and "unknown reduce 'median'" in out.stderr
    out = enqueue("--reduce", "vote", "--reduce-prompt", str(src))
    assert out.returncode == 2 and "--reduce-prompt is for --reduce tree" in out.stderr
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        assert not client.exists(Keys(fleet.prefix).meta("bad"))
    finally:
        client.close()

    assert enqueue().returncode == 0
    final = subprocess.run(
        [BIN / "swarm-collect", "bad", "--final"],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert final.returncode == 2
    assert "job 'bad' has no reduce stage" in final.stderr


def test_workers_import_only_the_reduce_functions_they_allow(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A job's spec comes from Redis: naming a module there must not run it on the workers."""
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "imported"
    (code / "reducer_mod.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\ndef count(results):\n    return len(results)\n"
    )
    fleet = fleet_factory(1)
    fleet.env["PYTHONPATH"] = str(code)  # importable by the workers, as a stray module would be

    def final(job: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN / "swarm-collect", job, "--final"],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert fleet.enqueue("denied", 50, set(), "--reduce", "reducer_mod:count").wait(60) == 0
    assert fleet.worker("w", [0]).wait(timeout=60) == 0
    # Not allowed here: never imported, and no failure recorded; left to a worker that has it.
    assert not marker.exists()
    waiting = final("denied")
    assert waiting.returncode != 0 and "reduce has not finished" in waiting.stderr
    assert (
        "skipping the reduce of job denied: left to a worker that has reduce function "
        "reducer_mod:count (SWARM_REDUCE_FUNCTIONS)" in fleet.logs[0].read_text()
    )
    assert fleet.enqueue("allowed", 50, set(), "--reduce", "reducer_mod:count").wait(60) == 0
    worker = fleet.worker("w2", [0], SWARM_REDUCE_FUNCTIONS="reducer_mod:count")
    assert worker.wait(timeout=60) == 0
    for job in ("denied", "allowed"):  # the worker that has it ran both
        assert msgspec.json.decode(final(job).stdout)["value"] == 50
    assert marker.read_text() == "x"
