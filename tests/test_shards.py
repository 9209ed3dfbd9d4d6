"""A job spread over shards (``--shards K``): K jobs to the workers, each under its own hash
tag, one job to whoever queues, collects, retries, cancels or deletes it. Against a real
Redis (the cluster run: tests/test_cluster.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.crc import key_slot

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.keys import GROUP
from swarm_queue.common.models import JobSpec, PromptItem, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.shards import AUTO, Shards
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.feeding import Feeding
from swarm_queue.common.vocab import Meta
from swarm_queue.producer.output import collect_output
from swarm_queue.producer.overview import job_list
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.intake import queued, service_order
from tests.harness import MAX_TOKENS, command, over_context
from tests.helpers import collect_lines, prompts, run_engine

# 4 prompts an entry: blocks of 256 prompts, dealt out to the shards in turn.
CHUNK = 4
# The job "sh" and its two other shards, in their order (each tag in its own third of the
# cluster's slots: see common.shards.aimed_names).
NAMES = ("sh", "sh#4", "sh#1")


def _spec(job: str = "sh", shards: int = 3) -> JobSpec:
    return JobSpec(
        job=job, params=SamplingParams(max_tokens=MAX_TOKENS), chunk=CHUNK, shards=shards
    )


def test_a_layout_deals_blocks_out_in_turn_and_knows_where_each_shard_ended() -> None:
    layout = Shards.of("sh", 3, CHUNK)
    assert layout.names == list(NAMES)
    assert [key_slot(n.encode()) * 3 // 16384 for n in NAMES] == [2, 0, 1]
    assert [layout.shard(i) for i in (0, 255, 256, 512, 768, 1000)] == [0, 0, 1, 2, 0, 0]
    assert layout.shares(1500) == [512, 512, 476]  # blocks 0, 3 | 1, 4 | 2, 5 (220 of 256)
    assert layout.runs(250, 600) == [(250, 256), (256, 512), (512, 600)]
    # where a shard's stream ends before a prompt of it is queued
    assert [layout.after_before(i) for i in (0, 256, 768, 800, 1024)] == [0, 0, 256, 800, 512]


async def test_a_job_over_three_shards_is_answered_once_each_and_collected_in_order(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 1500
    await enqueue_prompts(store, _spec(), prompts(n))
    # Three jobs to the workers, each its own slot; one to a person.
    assert await store.list_jobs() == sorted(NAMES)
    assert (await job_list(store))[0] == ["sh"]
    lengths = [await store.redis.xlen(store.keys.stream(s)) for s in NAMES]
    assert lengths == [128, 128, 119]  # 512, 512, 476 prompts, 4 an entry
    assert store.keys.stream("sh#4") == f"{store.keys.prefix}:{{sh#4}}:q"
    gens = {(await store.load_spec(s)).generation for s in NAMES}
    assert len(gens) == 1
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(batch_size=32, speculate=0), store, fleet.urls)
        asked = sum(len(r.get("prompt", [])) for e in fleet.endpoints for r in e.received)
    assert asked == n  # each prompt sent once
    lines = await collect_lines(store, "sh")
    assert [x["index"] for x in lines] == list(range(n))
    for x, (prompt, _) in zip(lines, prompts(n), strict=True):
        assert x["text"] == completion_for(prompt, MAX_TOKENS)[0], x["index"]
    status = await store.status("sh", rate=False)
    assert (status.done, status.failed, status.total, status.finished) == (n, 0, n, True)
    # What each endpoint did for the job: one row each, its shards' counts summed.
    rows = await store.read_endpoints("sh")
    assert sorted(r.endpoint for r in rows) == sorted(fleet.urls)
    assert sum(r.done for r in rows) == n
    totals = [(await store.meta(s))[Meta.TOTAL] for s in NAMES]
    assert totals == [b"512", b"512", b"476"]  # each shard sealed with its share


class _Stop(Exception):
    """The producer dies here (a kill, a lost node): nothing after it is queued."""


def _until(n: int, stop_at: int) -> Iterator[tuple[str, str | None]]:
    for i, p in enumerate(prompts(n)):
        if i == stop_at:
            raise _Stop
        yield p


async def test_a_producer_stopped_midway_resumes_after_the_last_prompt_its_shards_hold(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 1500
    with pytest.raises(_Stop):
        await enqueue_prompts(store, _spec(), _until(n, 750), chunk=100)
    assert 0 < await store.enqueued_count("sh") < 750  # queued in part, not sealed
    assert (await store.status("sh")).total is None
    report = await enqueue_prompts(store, _spec(), prompts(n), chunk=100)
    assert (report.total, report.added + report.already_queued) == (n, n)
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=32, speculate=0), store, fleet.urls)
        sent = [p for e in fleet.endpoints for r in e.received for p in r.get("prompt", [])]
    assert sorted(sent) == sorted(p for p, _ in prompts(n))  # none twice, none lost
    lines = await collect_lines(store, "sh")
    assert [x["index"] for x in lines] == list(range(n))
    # Another input under the name is refused, as for a job of one shard.
    with pytest.raises(Exception, match="another input"):
        await enqueue_prompts(store, _spec(), [(f"other {i}", None) for i in range(n)])


async def test_a_producer_dead_between_two_shards_blocks_resumes_after_the_first_one(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call queuing prompts 0..299 fills shard 0's block (0..255), then the process dies
    before shard 1's part: the rerun goes on at 256 (the digest of the whole call was kept with
    shard 1's part only, so none stands at 256 to refuse the same input with)."""
    gen = (await store.create_job(_spec())).generation
    items = [PromptItem.of(i, p, None) for i, (p, _) in enumerate(prompts(300))]
    calls, real = 0, Feeding.add_items

    async def dies_after_one(self: Feeding, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise _Stop
        await real(self, *args, **kwargs)

    monkeypatch.setattr(Feeding, "add_items", dies_after_one)
    with pytest.raises(_Stop):
        await store.add_items("sh", items, "the digest up to 299", gen=gen, chunk=CHUNK)
    monkeypatch.undo()
    assert await store.resume_point("sh") == (256, None)
    report = await enqueue_prompts(store, _spec(), prompts(1000))
    assert (report.total, report.already_queued) == (1000, 256)


async def test_retry_evict_cancel_and_delete_reach_every_shard(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
) -> None:
    n, poison = 1000, {5, 300, 600, 900}  # one in each block of shards 0, 1, 2, 0
    texts = ["p" * 20_000 if i in poison else f"Weigh finding {i}." for i in range(n)]
    await enqueue_prompts(store, _spec(), [(t, None) for t in texts])
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=32), store, fleet.urls)
    status = await store.status("sh", rate=False)
    assert (status.done, status.failed, status.failed_by_kind) == (996, 4, {"rejected": 4})
    failed = await store.failed_indices("sh")
    assert [i for i, _ in failed] == sorted(poison)
    out = tmp_path / "sh.jsonl"
    report = await collect_output(store, "sh", str(out), wait=False, progress=False, evict=True)
    assert report.complete
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["index"] for x in lines] == list(range(n))
    assert {x["index"] for x in lines if x["error"]} == poison
    assert all(x["error"].startswith(over_context(4096)) for x in lines if x["error"])
    # Evicted in every shard, but the failures, kept for a retry.
    for s in NAMES:
        assert (await store.meta(s))[Meta.EVICTED] == str(n).encode()
        held = await store.redis.hkeys(store.keys.results(s))
        assert {int(i) for i in held} == {
            i for i in poison if Shards.of("sh", 3, 4).name_of(i) == s
        }
    assert (await store.status("sh")).evicted == n
    gen = (await store.load_spec("sh")).generation
    assert await store.requeue("sh", failed, gen=gen) == 4
    assert (await store.status("sh", rate=False)).pending == 4
    assert (await store.cancel("sh"))[1] == 4
    status = await store.status("sh", rate=False)
    assert (status.cancelled, status.finished, status.failed_by_kind) == (
        True,
        True,
        {"cancelled": 4},
    )
    for s in NAMES:
        assert (await store.redis.xpending(store.keys.stream(s), GROUP))["pending"] == 0
    assert await store.delete_job("sh") > 0
    assert await store.list_jobs() == []
    for s in NAMES:
        assert not [k async for k in store.redis.scan_iter(match=store.keys.job_pattern(s))]


def test_only_a_plain_job_is_spread_over_shards_and_over_at_most_256() -> None:
    with pytest.raises(ConfigError, match="a workflow's steps are not spread over shards"):
        build_spec("x", JobOptions(shards=2), source="t", step=True)
    with pytest.raises(ConfigError, match=r"shards must be 1\.\.256 or auto, got 257"):
        build_spec("x", JobOptions(shards=257), source="t")
    assert build_spec("x", JobOptions(shards=4), source="t")[0].shards == 4


def test_the_shards_of_a_job_share_one_turn_of_the_fleet_each_first_in_turn() -> None:
    """Beside another job, a job of three shards gets every other turn (not three of four),
    and in its turns each of its shards is looked at first in turn (one primary's work at a
    time would be one core's again)."""
    other = queued(JobSpec(job="other"))
    shards = [queued(JobSpec(job=name, shards=3)) for name in NAMES]
    orders = [service_order([other, *shards], turn) for turn in range(6)]
    assert [order[0] for order in orders].count("other") == 3
    leads = [next(name for name in order if name != "other") for order in orders]
    assert sorted(leads) == sorted(NAMES * 2)  # each shard first of the job twice in 6 turns
    assert all(sorted(order) == sorted(["other", *NAMES]) for order in orders)


async def test_auto_is_one_shard_a_primary_so_one_on_a_redis_server_and_a_job_keeps_its_own(
    store: JobStore,
) -> None:
    assert (await store.create_job(_spec("one", shards=AUTO))).shards == 1
    await store.create_job(_spec("three", shards=3))
    # A rerun asking for auto goes on with the job as it was created.
    assert (await store.create_job(_spec("three", shards=AUTO))).shards == 3


def test_a_shard_count_that_is_no_count_is_refused_by_the_command_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    run = command(cli_env, "swarm-enqueue", src, "--job", "x", "--shards", "lots")
    assert run.returncode == 2
    assert "--shards takes a count or 'auto', not 'lots'" in run.stderr
