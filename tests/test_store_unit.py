"""Store bookkeeping on fakeredis (with Lua): locks, sealing, counters, finishing.

Stream delivery, consumer groups and reclaim are tested against a real Redis in
test_queue_path.py; here only the hash and script logic, which fakeredis runs faithfully.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import fakeredis
import pytest

from swarm_queue.common.errors import JobConflictError, JobNotFoundError
from swarm_queue.common.keys import Keys
from swarm_queue.common.models import JobSpec, PromptItem, Result, SamplingParams, Usage
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.scripts import SCRIPT_NAMES, source
from swarm_queue.common.vocab import FailureKind, Meta, failed_field
from tests.helpers import gen_of


@pytest.fixture
async def fake() -> AsyncIterator[JobStore]:
    store = JobStore(fakeredis.FakeAsyncRedis(), Keys("u"))
    yield store
    await store.close()


async def test_producer_lock_is_exclusive_and_refreshable(fake: JobStore) -> None:
    assert await fake.acquire_producer_lock("j", "host:1", 30_000) is None
    assert await fake.acquire_producer_lock("j", "host:1", 30_000) is None  # refresh
    assert await fake.acquire_producer_lock("j", "host:2", 30_000) == "host:1"
    await fake.release_producer_lock("j", "host:2")  # not the holder: no effect
    assert await fake.acquire_producer_lock("j", "host:2", 30_000) == "host:1"
    await fake.release_producer_lock("j", "host:1")
    assert await fake.acquire_producer_lock("j", "host:2", 30_000) is None


async def test_letting_go_of_a_lock_that_passed_to_another_meanwhile_leaves_it_theirs(
    fake: JobStore,
) -> None:
    """A holder lets go as its lock expires and another takes it: the other keeps it (a
    read-then-delete would delete the new holder's lock, and two producers would feed one
    job, or two gateways drive one batch). Here the lock passes to B right after the first
    command the letting go sends."""
    redis = fake.redis
    send = redis.execute_command
    for let_go, key in (
        (lambda: fake.release_producer_lock("j", "A"), fake.keys.producer_lock("j")),
        (lambda: fake.drop_lease("b1", "A"), fake.keys.batch_lease("b1")),
    ):
        await send("SET", key, "A")
        sent = 0

        async def then_lost(*args: Any, key: str = key, **kwargs: Any) -> Any:
            nonlocal sent
            reply = await send(*args, **kwargs)
            sent += 1
            if sent == 1:  # expired and taken by B, between this command and the next
                await send("SET", key, "B")
            return reply

        redis.execute_command = then_lost  # type: ignore[method-assign]
        try:
            await let_go()
        finally:
            redis.execute_command = send  # type: ignore[method-assign]
        assert await redis.get(key) == b"B"


async def test_seal_records_the_total_once(fake: JobStore) -> None:
    await fake.create_job(JobSpec(job="j"))
    await fake.seal("j", 5, gen=await gen_of(fake, "j"))
    await fake.seal("j", 5, gen=await gen_of(fake, "j"))  # a rerun seals again with the same count
    with pytest.raises(JobConflictError, match="sealed with 5 prompts; this input has 6"):
        await fake.seal("j", 6, gen=await gen_of(fake, "j"))
    assert (await fake.status("j")).total == 5


async def test_job_finishes_when_the_last_result_lands_before_or_after_sealing(
    fake: JobStore,
) -> None:
    for job, seal_first in (("a", True), ("b", False)):
        await fake.create_job(JobSpec(job=job))
        await fake.add_items(
            job, [PromptItem(i, f"p{i}") for i in range(2)], gen=await gen_of(fake, job)
        )
        if seal_first:
            await fake.seal(job, 2, gen=await gen_of(fake, job))
        got = await fake.read_new(job, "c", 2)
        await fake.commit(
            job, [(got[0][0], Result(index=0, text="x"), None)], gen=await gen_of(fake, job)
        )
        assert not (await fake.status(job)).finished
        await fake.commit(
            job, [(got[1][0], Result(index=1, error="e"), got[1][1])], gen=await gen_of(fake, job)
        )
        assert (await fake.status(job)).finished is seal_first
        if not seal_first:
            await fake.seal(
                job, 2, gen=await gen_of(fake, job)
            )  # the producer's seal finishes a job whose results are in
        status = await fake.status(job)
        assert (status.finished, status.done, status.failed) == (True, 1, 1)
        assert await fake.unfinished([job]) == []


async def test_create_job_refuses_other_settings_and_unknown_jobs_are_named(
    fake: JobStore,
) -> None:
    await fake.create_job(JobSpec(job="j", model="m1"))
    same = await fake.create_job(JobSpec(job="j", model="m1", created_s=99.0, source="other"))
    assert same.model == "m1"
    with pytest.raises(JobConflictError, match="already exists with model='m1'"):
        await fake.create_job(JobSpec(job="j", model="m2"))
    with pytest.raises(JobConflictError, match="max_tokens"):
        await fake.create_job(JobSpec(job="j", model="m1", params=SamplingParams(max_tokens=1)))
    assert await fake.list_jobs() == ["j"]
    with pytest.raises(JobNotFoundError, match="no job named 'nope' in this Redis"):
        await fake.status("nope")


def test_every_script_states_its_contract_and_names_meta_fields_from_the_vocabulary() -> None:
    lua = resources.files("swarm_queue.common.store").joinpath("lua")
    names = sorted(p.name.removesuffix(".lua") for p in lua.iterdir() if p.name.endswith(".lua"))
    assert tuple(names) == SCRIPT_NAMES
    for name in names:
        text = lua.joinpath(f"{name}.lua").read_text()
        head = [line for line in text.splitlines() if line.startswith("--")]
        assert head[0].startswith(f"-- {name}: "), name
        assert any(line.startswith("-- KEYS:") for line in head), name
        assert any(line.startswith("-- ARGV:") for line in head), name
        assert any(line.startswith("-- Returns") for line in head), name
        used = set(re.findall(r"\bMETA\.([A-Z_]+)", text))
        assert used <= {m.name for m in Meta}, f"{name}: {used - {m.name for m in Meta}}"
        # A meta field written as a string literal would bypass the vocabulary.
        literals = set(re.findall(r"'([a-z_:]+)'", text))
        assert not literals & {m.value for m in Meta}, f"{name}: {literals}"
    assert "META." not in source("commit") and "'gen', 'evicted'" in source("commit")


async def test_the_meta_fields_the_scripts_write_are_the_vocabulary(fake: JobStore) -> None:
    await fake.create_job(JobSpec(job="j"))
    await fake.add_items(
        "j",
        [PromptItem(index=0, prompt="a"), PromptItem(index=1, prompt="b")],
        gen=await gen_of(fake, "j"),
    )
    await fake.seal("j", 2, gen=await gen_of(fake, "j"))
    ok = Result(index=0, text="A")
    bad = Result(index=1, error="too long", error_kind=FailureKind.REJECTED)
    await fake.commit(
        "j",
        [(b"0-1", ok, None), (b"0-2", bad, b"payload")],
        Usage(3, 4, cached_tokens=2, reasoning_tokens=1),
        gen=await gen_of(fake, "j"),
    )
    fields = set(await fake.meta("j"))
    assert fields - {m.value for m in Meta} == {failed_field(FailureKind.REJECTED)}
    assert {Meta.DONE, Meta.FAILED, Meta.TOTAL, Meta.FINISHED_S, Meta.ENQUEUED} <= fields
    assert {Meta.CACHED_TOKENS, Meta.REASONING_TOKENS} <= fields


async def test_redis_pys_own_failure_inside_the_client_is_an_outage_and_ours_a_bug() -> None:
    """Seen under a failover with the machine loaded: redis-py's cluster pipeline raised
    AttributeError (its default node gone while it re-read the layout), a traceback in the
    worker's log. Raised inside redis-py, it is the store's outage; raised in our code, a bug
    that stays seen."""
    import redis.asyncio.cluster as redis_cluster

    from swarm_queue.common.errors import StoreUnavailable
    from swarm_queue.common.store.boundary import redis_errors

    class Reinitialising:  # what the cluster client is for a moment: no layout yet
        pass

    with pytest.raises(StoreUnavailable, match="its client failed \\(AttributeError"):
        async with redis_errors("redis://127.0.0.1:1/0"):
            redis_cluster.RedisCluster.get_default_node(Reinitialising())
    with pytest.raises(AttributeError):
        async with redis_errors("redis://127.0.0.1:1/0"):
            Reinitialising().name  # type: ignore[attr-defined]  # noqa: B018


async def test_a_command_the_cluster_client_wont_send_is_refused_a_lost_cluster_waited() -> None:
    """redis-py's cluster client raises one class for a cluster it cannot reach and for a
    command it will not send: the second, taken for an outage, was retried and said for ever
    as "waits for Redis". A command of keys in two slots is refused for what it is; a slot
    without its primary (a failover) and a cluster not reached are outages, waited out."""
    from redis.asyncio.cluster import RedisCluster
    from redis.exceptions import SlotNotCoveredError

    from swarm_queue.common.embedded import free_port
    from swarm_queue.common.errors import StoreRefused, StoreUnavailable
    from swarm_queue.common.store.boundary import redis_errors

    url = "redis://127.0.0.1:1/0"
    client = RedisCluster(host="127.0.0.1", port=free_port())  # (nothing listens there)
    try:
        with pytest.raises(StoreRefused, match="will not send the command: EVALSHA - all keys"):
            async with redis_errors(url):
                await client._determine_slot("EVALSHA", "0" * 40, 2, "{a}x", "{b}y")
        with pytest.raises(StoreUnavailable, match="cannot be connected"):
            async with redis_errors(url):
                await client.initialize()
        with pytest.raises(StoreUnavailable, match="is not covered"):
            async with redis_errors(url):
                raise SlotNotCoveredError('Slot "5" is not covered by the cluster.')
    finally:
        await client.aclose()
