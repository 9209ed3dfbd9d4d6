"""A Redis with a maxmemory smaller than a job: the producer leaves room for the answers of
what it queues, says what frees room, and the job streams through. Real processes around a
private Redis."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import msgspec
import pytest
import redis

from swarm_queue.common.keys import Keys
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, MAX_TOKENS, FleetFactory
from tests.helpers import wait_until
from tests.servers import redis_server

MAXMEMORY = 5 * 2**20
N = 20_000


def _prompt(i: int) -> str:
    # About 400 bytes each: the whole input is about 8 MiB, more than Redis may hold, and its
    # answers (a chunk's in one field, some 190 bytes each) more than it may keep.
    return f"Observation {i}: " + "the survey recorded a long description of it. " * 8


@pytest.mark.slow
def test_a_job_larger_than_maxmemory_streams_through_once_its_answers_are_collected(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    limits = ("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction")
    with redis_server(extra_args=limits) as server:
        fleet = fleet_factory(2, url=server.url)
        src = tmp_path / "big.txt"
        src.write_text("".join(_prompt(i) + "\n" for i in range(N)))
        worker = fleet.worker("w", [0, 1], burst=False)

        def _queued() -> int:
            with redis.Redis.from_url(server.url) as client:
                return int(client.hget(Keys(fleet.prefix).meta("big"), "enqueued") or 0)

        said = tmp_path / "enqueue.err"
        with open(said, "wb") as err:
            producer = subprocess.Popen(
                [BIN / "swarm-enqueue", src, "--job", "big", "--max-tokens", str(MAX_TOKENS)],
                env=fleet.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        # Nobody collects yet: the producer waits and says what makes room (before: it filled
        # Redis, no answer could land, and it stopped with 'out of memory').
        deadline = time.monotonic() + 120
        while "waiting for room in Redis" not in said.read_text():
            assert producer.poll() is None, said.read_text()
            assert time.monotonic() < deadline, said.read_text()
            time.sleep(0.1)
        message = said.read_text()
        assert "run swarm-collect big --out FILE --evict" in message
        # Every answer of what was queued lands; the rest of the input waits for room.
        wait_until("the queued prompts answered", lambda: 0 < fleet.done("big") == _queued())
        assert _queued() < N and producer.poll() is None

        out = tmp_path / "big.jsonl"
        collector = subprocess.Popen(
            [BIN / "swarm-collect", "big", "--out", out, "--wait", "--evict"], env=fleet.env
        )
        assert producer.wait(timeout=300) == 0, said.read_text()[-2000:]
        assert collector.wait(timeout=300) == 0
        worker.terminate()
        assert worker.wait(timeout=60) == 0
        with redis.Redis.from_url(server.url) as client:
            peak = int(client.info("memory")["used_memory_peak"])
            meta = client.hgetall(Keys(fleet.prefix).meta("big"))
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(N))
    expected = [completion_for(_prompt(i), MAX_TOKENS)[0] for i in range(N)]
    assert [x["text"] for x in lines] == expected
    assert int(meta[b"done"]) == N and int(meta.get(b"failed", 0)) == 0
    assert peak <= MAXMEMORY  # the room left for answers was enough: Redis never went over
