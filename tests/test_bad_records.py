"""Records in a shared Redis that swarm-queue did not write (another tool, an operator's typo,
damage) are skipped, logged and shown; they never block another job."""

from __future__ import annotations

import asyncio
from asyncio.subprocess import PIPE
from collections.abc import Callable

from swarm_queue.common.models import Result, encode
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import BIN
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
