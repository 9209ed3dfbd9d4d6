"""Records in a shared Redis that swarm-queue did not write (another tool, an operator's typo,
damage) are skipped, logged and shown; they never block another job."""

from __future__ import annotations

import asyncio
import subprocess
from asyncio.subprocess import PIPE
from collections.abc import Callable

import pytest
import redis
from arq.constants import in_progress_key_prefix

from swarm_queue.common.keys import Keys
from swarm_queue.common.models import Result, encode
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, FleetFactory
from tests.helpers import collect_lines, gen_of, prompts, run_engine, spec


async def test_stray_job_names_and_unreadable_specs_block_no_job(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    redis_url: str,
    prefix: str,
) -> None:
    await enqueue_prompts(store, spec("real"), prompts(300))
    await store.redis.sadd(store.keys.jobs, "not a job!", b"\xff\xfe", "junk")
    await store.redis.hset(store.keys.meta("junk"), "spec", b"\xc1 not msgpack")
    async with sim_fleet(1) as fleet:
        engine = await run_engine(make_settings(), store, fleet.urls)
    assert engine.drainers[0].figures.prompts_done == 300
    lines = await collect_lines(store, "real")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(300)]

    env = {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix, "PATH": str(BIN)}
    listing = await asyncio.create_subprocess_exec(
        BIN / "swarm-jobs", env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = (x.decode() for x in await asyncio.wait_for(listing.communicate(), 60))
    assert listing.returncode == 0, err
    *listed, cache = out.splitlines()[1:]
    rows = {line.split()[0]: line.split()[1] for line in listed}
    assert rows == {"junk": "unreadable", "real": "finished"}
    assert cache.startswith("response cache: 0 answers")
    assert f"ignored in {prefix}:jobs: 'not a job!' is not a job name" in err


async def test_an_unreadable_result_fails_its_own_line_only(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(3))
    got = await store.read_new("j", "c", 3)
    await store.commit(
        "j",
        [(eid, Result(index=i, text="t"), None) for i, (eid, _) in enumerate(got)],
        gen=await gen_of(store, "j"),
    )
    await store.redis.hset(store.keys.results("j"), "1", b"\xc1 damaged")
    await store.redis.hset(store.keys.results("j"), "2", encode(Result(index=0, text="moved")))
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == ["t", None, None]
    assert lines[1]["error"].startswith("unreadable result in Redis")
    assert lines[2]["error"] == "result in Redis under 2 is for index 0"


def _reduced_beside(
    fleet_factory: FleetFactory, job: str, key: str, value: bytes, ttl_ms: int | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Job ``job`` with a reduce, queued and run by a burst worker while Redis holds
    ``value`` (for ``ttl_ms``) under one of arq's names for its reduce step's job (``{}``
    there stands for its ID): ``swarm-collect JOB --final`` and the worker's log."""
    fleet = fleet_factory(1)
    client = redis.Redis.from_url(fleet.redis_url)
    key = key.format(Keys(fleet.prefix).advance_job_id(job, 0))
    try:
        client.set(key, value, px=ttl_ms)
        assert fleet.enqueue(job, 200, set(), "--reduce", "concat").wait(timeout=60) == 0
        worker = fleet.worker("w", [0])
        assert worker.wait(timeout=60) == 0, fleet.logs[0].read_text()[-2000:]
    finally:
        client.delete(key)
        client.close()
    final = subprocess.run(
        [BIN / "swarm-collect", job, "--final"],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return final, fleet.logs[0].read_text()


@pytest.mark.slow
def test_a_reduce_step_marked_running_by_nobody_still_gets_the_final_written(
    fleet_factory: FleetFactory,
) -> None:
    """What a Redis restart can leave (arq's mark of a job taken, its reply lost with its
    connection: arq took it for another worker's): the stage's advance job queued and
    marked running for minutes, run by nobody. The worker advances the stage itself once it
    has seen it so for ADVANCE_GRACE_S: the final is written, not after the mark's expiry."""
    mark = in_progress_key_prefix + "{}"
    final, log = _reduced_beside(fleet_factory, "lost", mark, b"1", ttl_ms=600_000)
    assert final.returncode == 0, final.stderr
    assert final.stdout.strip() and "stray record" not in log


@pytest.mark.slow
def test_a_squatted_reduce_step_id_still_gets_the_final_written(
    fleet_factory: FleetFactory,
) -> None:
    # Before the job exists, a stray record takes the arq job ID of its reduce step.
    final, log = _reduced_beside(fleet_factory, "sq", "arq:job:{}", b"not an arq job")
    assert final.returncode == 0, final.stderr
    assert "taken by a stray record; advancing here" in log
