"""Chunked entries (``--chunk K``): K consecutive prompts a stream entry, read, claimed and
acknowledged as one, answered and counted per prompt, every exactly-once promise as with one
prompt an entry. Against a real Redis; the crash case with real processes (a poison prompt
in a chunk: tests/test_liveness.py, at one prompt an entry and at chunks of 8)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.keys import GROUP
from swarm_queue.common.models import (
    JobSpec,
    PromptItem,
    Result,
    SamplingParams,
    decode_result,
    encode,
)
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.entries import CHUNK_MARK, encode_chunk, entry_payloads
from swarm_queue.common.vocab import Meta
from swarm_queue.producer.output import collect_output
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import (
    MAX_TOKENS,
    FleetFactory,
    check_output,
    over_context,
)
from tests.helpers import (
    assert_answered_in_order,
    collect_lines,
    prompts,
    run_engine,
    wait_until,
)

POISON = "<poison>"


def _spec(job: str = "c", chunk: int = 16) -> JobSpec:
    return JobSpec(job=job, params=SamplingParams(max_tokens=MAX_TOKENS), chunk=chunk)


async def test_a_chunked_job_is_answered_exactly_in_order_an_entry_a_chunk(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 1000
    await enqueue_prompts(store, _spec(), prompts(n))
    assert await store.redis.xlen(store.keys.stream("c")) == -(-n // 16)  # 63, not 1,000
    # Only the size that is not the job's chunk is recorded: the last, of 8.
    assert await store.redis.hgetall(store.keys.chunks("c")) == {b"0-993": b"8"}
    async with sim_fleet(2) as fleet:
        # (no speculative copies at the tail: each prompt is then sent exactly once)
        await run_engine(make_settings(batch_size=40, speculate=0), store, fleet.urls)
        asked = sum(len(r.get("prompt", [])) for e in fleet.endpoints for r in e.received)
    await assert_answered_in_order(store, "c", n, MAX_TOKENS, asked)
    status = await store.status("c", rate=False)
    assert (status.done, status.failed, status.total) == (n, 0, n)
    # Every chunk acknowledged and trimmed with its last answer.
    assert await store.redis.xlen(store.keys.stream("c")) == 0
    assert not await store.redis.exists(store.keys.chunks("c"))


async def test_an_over_long_prompt_inside_a_chunk_fails_alone_and_its_chunk_is_answered(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n, poison = 64, {5, 21, 22}
    # (over the in-process engine's context of 4,096 tokens)
    texts = ["p" * 20_000 if i in poison else f"Weigh finding {i}." for i in range(n)]
    await enqueue_prompts(store, _spec(chunk=8), [(t, None) for t in texts])
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=32), store, fleet.urls)
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(n))
    assert {x["index"] for x in lines if x["error"] is not None} == poison
    for x in lines:
        if x["index"] in poison:
            assert x["error"].startswith(over_context(4096)), x
        else:
            assert x["text"] == completion_for(texts[x["index"]], MAX_TOKENS)[0]
    assert await store.redis.xlen(store.keys.stream("c")) == 0


def _lines(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


@pytest.mark.slow
def test_workers_killed_mid_chunk_lose_nothing_and_write_each_prompt_once(
    fleet_factory: FleetFactory,
) -> None:
    """Workers SIGKILLed while they hold chunks (some partly answered: batches of 40 over
    chunks of 16, server errors and resets bisecting them), taken over by their successors:
    every prompt answered or failed with its reason, once, in order; the counts exact."""
    n = 4000
    poison = set(range(7, n, 500))
    fleet = fleet_factory(4, "--error-rate", "0.05", "--reset-rate", "0.01")
    assert fleet.enqueue("ck", n, poison, "--chunk", "16").wait(timeout=120) == 0
    collector = fleet.collect("ck")
    fast = {"SWARM_CLAIM_IDLE_MS": "1500", "SWARM_MAX_ATTEMPTS": "20",
            "SWARM_CIRCUIT_FAILURES": "50", "SWARM_BATCH_SIZE": "40"}  # fmt: skip
    live = {"a": fleet.worker("a", [0, 1], env=fast), "b": fleet.worker("b", [2, 3], env=fast)}
    for kills, threshold in enumerate(range(500, 3001, 500)):
        wait_until(f"{threshold} results", lambda t=threshold: fleet.done("ck") >= t, 120)
        victim = "a" if kills % 2 == 0 else "b"
        live[victim].send_signal(signal.SIGKILL)
        live[victim].wait()
        # The successor under the same name (takes its own leftovers back) or another (the
        # orphans are claimed after the idle time).
        name = victim if kills % 4 < 2 else f"{victim}{kills}"
        live[victim] = fleet.worker(name, [0, 1] if victim == "a" else [2, 3], env=fast)
    _out, err = collector.communicate(timeout=300)
    assert collector.returncode == 1, err  # the poison prompts failed
    assert f"wrote {n} of {n} results ({n - len(poison)} ok, {len(poison)} failed)" in err
    assert [w.wait(timeout=120) for w in live.values()] == [0, 0]
    check_output(fleet.tmp / "ck.jsonl", n, poison)
    client = redis.Redis.from_url(fleet.redis_url)
    try:  # every chunk acknowledged: none left pending or recorded
        assert client.xpending(f"{fleet.prefix}:{{ck}}:q", "workers")["pending"] == 0
        assert not client.exists(f"{fleet.prefix}:{{ck}}:chunks")
    finally:
        client.close()


async def test_a_chunk_given_back_partly_answered_sends_only_its_unanswered_prompts(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """A worker answered 3 prompts of a chunk of 8, then gave it back (its endpoint failed):
    the chunk stays unacknowledged, and its next taker sends only the other 5, so no prompt
    is answered twice; the 3 answers stand, the counts are exact."""
    n = 24
    await enqueue_prompts(store, _spec(chunk=8), prompts(n))
    gen = (await store.load_spec("c")).generation
    [(eid, _payload)] = await store.read_new("c", "gone|x", 1)
    assert eid == b"0-1"
    mine = [(eid, Result(index=i, text=f"kept {i}", finish_reason="stop"), None) for i in (0, 3, 6)]
    commit = await store.commit("c", mine, gen=gen)
    assert commit.done == 3
    # Not acknowledged: 5 of its prompts have no answer yet.
    assert (await store.redis.xpending(store.keys.stream("c"), GROUP))["pending"] == 1
    await store.release("c", "gone|x", [eid], gen=gen)
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=16), store, fleet.urls)
        sent = [p for r in fleet.endpoints[0].received for p in r.get("prompt", [])]
    questions = [p for p, _ in prompts(n)]
    assert sorted(sent) == sorted(q for i, q in enumerate(questions) if i not in (0, 3, 6))
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(n))
    for x in lines:
        want = f"kept {x['index']}" if x["index"] in (0, 3, 6) else None
        assert x["text"] == (want or completion_for(questions[x["index"]], MAX_TOKENS)[0])
    status = await store.status("c", rate=False)
    assert (status.done, status.failed, status.in_flight, status.pending) == (n, 0, 0, 0)
    assert await store.redis.xlen(store.keys.stream("c")) == 0


async def test_a_copy_of_a_whole_chunk_answered_in_part_before_keeps_the_first_answers(
    store: JobStore,
) -> None:
    """A commit of whole chunks still pending writes without reading for earlier answers, so
    a chunk partly answered is marked until it is whole: a copy carrying all 8 of its prompts
    after 3 were answered writes only the other 5 (first write wins), counts 5, and the mark
    and its count are gone once the chunk is whole. A commit of a chunk no one answered
    writes all 8."""
    await enqueue_prompts(store, _spec(chunk=8), prompts(24))
    gen = (await store.load_spec("c")).generation
    meta, chunks = store.keys.meta("c"), store.keys.chunks("c")
    [(eid, _)] = await store.read_new("c", "w|x", 1)

    def answers(indices: range | tuple[int, ...], text: str) -> list[tuple[bytes, Result, None]]:
        return [
            (eid, Result(index=i, text=f"{text} {i}", finish_reason="stop"), None) for i in indices
        ]

    assert (await store.commit("c", answers((0, 3, 6), "first"), gen=gen)).done == 3
    assert await store.redis.hget(chunks, "~0-1") == b"1"
    assert await store.redis.hget(meta, Meta.PARTIAL) == b"1"
    assert (await store.commit("c", answers(range(8), "copy"), gen=gen)).done == 5
    blobs = await store.redis.hmget(store.keys.results("c"), [str(i) for i in range(8)])
    texts = [decode_result(b).text for b in blobs]
    assert texts == [f"{'first' if i in (0, 3, 6) else 'copy'} {i}" for i in range(8)]
    assert await store.redis.hget(chunks, "~0-1") is None
    assert await store.redis.hget(meta, Meta.PARTIAL) == b"0"
    [(eid, _)] = await store.read_new("c", "w|x", 1)
    assert (await store.commit("c", answers(range(8, 16), "next"), gen=gen)).done == 8
    status = await store.status("c", rate=False)
    assert (status.done, status.failed) == (16, 0)
    assert (await store.redis.xpending(store.keys.stream("c"), GROUP))["pending"] == 0


async def test_a_late_copy_of_a_short_chunk_made_whole_before_leaves_no_mark(
    store: JobStore,
) -> None:
    """A chunk of another size than the job's (its last, of 4) answered in two commits loses
    its size record once whole; a late copy's commit of part of it then writes and counts
    nothing and leaves no partial mark (it once took the chunk for one of 16, waited for
    prompts that do not exist, and left the job's PARTIAL at 1 for good)."""
    await enqueue_prompts(store, _spec(chunk=16), prompts(20))
    gen = (await store.load_spec("c")).generation
    meta, chunks = store.keys.meta("c"), store.keys.chunks("c")
    taken = await store.read_new("c", "w|x", 2)
    assert [eid for eid, _ in taken] == [b"0-1", b"0-17"]
    assert await store.redis.hgetall(chunks) == {b"0-17": b"4"}

    def answers(indices: range, text: str) -> list[tuple[bytes, Result, None]]:
        return [
            (b"0-17", Result(index=i, text=f"{text} {i}", finish_reason="stop"), None)
            for i in indices
        ]

    assert (await store.commit("c", answers(range(16, 18), "first"), gen=gen)).done == 2
    assert await store.redis.hget(chunks, "~0-17") == b"1"
    assert (await store.commit("c", answers(range(18, 20), "first"), gen=gen)).done == 2
    assert await store.redis.hgetall(chunks) == {}
    late = await store.commit("c", answers(range(18, 20), "late"), gen=gen)
    assert (late.done, late.failed) == (0, 0)
    assert await store.redis.hgetall(chunks) == {}
    assert await store.redis.hget(meta, Meta.PARTIAL) == b"0"
    blobs = await store.redis.hmget(store.keys.results("c"), [str(i) for i in range(16, 20)])
    assert [decode_result(b).text for b in blobs] == [f"first {i}" for i in range(16, 20)]


async def test_a_whole_chunk_answered_in_part_by_a_worker_from_before_the_marks_counts_once(
    store: JobStore,
) -> None:
    """A worker from before the marks (a fleet mid-upgrade, on a job queued before its chunks
    were packed) answers 3 prompts of a chunk and marks nothing; a copy of the whole chunk
    then takes the unread path: each prompt is still counted once (8 done, not 11)."""
    await enqueue_prompts(store, _spec(chunk=8), prompts(16))
    gen = (await store.load_spec("c")).generation
    await store.redis.hdel(store.keys.meta("c"), Meta.PACKED)  # (a job from before)
    [(eid, _)] = await store.read_new("c", "w|x", 1)
    old = {str(i): encode(Result(index=i, text=f"old {i}")) for i in (0, 3, 6)}
    await store.redis.hset(store.keys.results("c"), mapping=old)  # (as its commit wrote them)
    await store.redis.hset(store.keys.meta("c"), "done", 3)
    whole = [(eid, Result(index=i, text=f"copy {i}", finish_reason="stop"), None) for i in range(8)]
    assert (await store.commit("c", whole, gen=gen)).done == 5
    assert (await store.status("c", rate=False)).done == 8


async def test_a_retry_of_some_prompts_of_a_chunk_queues_each_again_alone(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Two prompts of a chunk failed (a server's 500), the rest answered: the chunk is done;
    swarm-retry queues just those two again, each under its own entry, and they are answered
    in their places."""
    n = 16
    await enqueue_prompts(store, _spec(chunk=8), prompts(n))
    gen = (await store.load_spec("c")).generation
    [(eid, payload)] = await store.read_new("c", "w|x", 1)
    parts = entry_payloads(payload)
    assert isinstance(parts, list) and len(parts) == 8
    failed = {2, 5}
    mine = [
        (
            eid,
            Result(index=i, error="HTTP 500", error_kind="server_error")
            if i in failed
            else Result(index=i, text=f"kept {i}", finish_reason="stop"),
            parts[i],
        )
        for i in range(8)
    ]
    commit = await store.commit("c", mine, gen=gen)
    assert (commit.done, commit.failed) == (6, 2)
    assert (await store.redis.xpending(store.keys.stream("c"), GROUP))["pending"] == 0
    assert await store.requeue("c", await store.failed_indices("c"), gen=gen) == 2
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=16), store, fleet.urls)
    questions = [p for p, _ in prompts(n)]
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(n))
    for x in lines:
        i = x["index"]
        want = f"kept {i}" if i < 8 and i not in failed else None
        assert x["text"] == (want or completion_for(questions[i], MAX_TOKENS)[0]), i
    status = await store.status("c", rate=False)
    assert (status.done, status.failed) == (n, 0)


async def test_a_chunk_collected_and_evicted_in_part_is_finished_without_its_evicted_prompts(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    tmp_path: Path,
) -> None:
    """The first 12 answers (a chunk of 8 and half the next) were collected with --evict
    while the rest of that chunk was in a worker's hands: its taker sends only its other 4
    prompts, acknowledges it, and the file is whole and in order."""
    n = 24
    await enqueue_prompts(store, _spec(chunk=8), prompts(n))
    gen = (await store.load_spec("c")).generation
    taken = await store.read_new("c", "w|x", 2)
    assert [eid for eid, _ in taken] == [b"0-1", b"0-9"]
    early = [
        (eid, Result(index=i, text=f"kept {i}", finish_reason="stop"), None)
        for eid, first in ((b"0-1", 0), (b"0-9", 8))
        for i in range(first, min(first + 8, 12))
    ]
    assert (await store.commit("c", early, gen=gen)).done == 12
    out = tmp_path / "c.jsonl"
    report = await collect_output(store, "c", str(out), wait=False, progress=False, evict=True)
    assert not report.complete
    assert (await store.status("c", rate=False)).evicted == 12
    await store.release("c", "w|x", [b"0-9"], gen=gen)
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=16), store, fleet.urls)
        sent = [p for r in fleet.endpoints[0].received for p in r.get("prompt", [])]
    questions = [p for p, _ in prompts(n)]
    assert sorted(sent) == sorted(questions[12:])
    report = await collect_output(store, "c", str(out), wait=False, progress=False, evict=True)
    assert report.complete
    lines = _lines(out)
    assert [x["index"] for x in lines] == list(range(n))
    for x in lines:
        i = x["index"]
        assert x["text"] == (f"kept {i}" if i < 12 else completion_for(questions[i], MAX_TOKENS)[0])
    assert (await store.redis.xpending(store.keys.stream("c"), GROUP))["pending"] == 0


async def test_an_unreadable_chunk_fails_every_prompt_it_holds_and_the_job_ends(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """A chunk whose payload cannot be read (written by another tool, or a version that wrote
    it otherwise): each of its 8 prompts fails as a bad entry, with the reason, and the job
    ends; before, its first prompt failed and the other 7 were waited for for ever."""
    spec = await store.create_job(_spec(chunk=8))
    good = encode_chunk([encode(PromptItem.of(i, f"Weigh finding {i}.", None)) for i in range(8)])
    keys = [store.keys.meta("c"), store.keys.stream("c"), store.keys.chunks("c")]
    args = [0, "", spec.generation, "0", "1", "", good, 8, CHUNK_MARK + b"\x00\xff", 8]
    assert (await store.scripts.add(keys=keys, args=args))[1] == 16
    await store.seal("c", 16, gen=spec.generation)
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=16), store, fleet.urls)
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(16))
    assert all(x["error"] is None for x in lines[:8])
    for x in lines[8:]:
        assert x["error_kind"] == "bad_entry", x
        assert x["error"].startswith("undecodable stream entry (a chunk)"), x
    status = await store.status("c", rate=False)
    assert (status.done, status.failed, status.finished) == (8, 8, True)
    assert (await store.redis.xpending(store.keys.stream("c"), GROUP))["pending"] == 0


async def test_prompts_queued_again_one_an_entry_go_a_batch_a_request_not_a_chunks_worth(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """A chunked job cancelled before any answer and resumed with swarm-retry: each prompt is
    queued again under an entry of its own. A batch of 32 took 32 / 16 = 2 entries, so the
    320 prompts went 2 a request (160 requests); now a take of entries swarm-retry queued
    takes a batch of them."""
    n = 320
    await enqueue_prompts(store, _spec(chunk=16), prompts(n))
    assert (await store.cancel("c"))[1] == n
    gen = (await store.load_spec("c")).generation
    assert await store.requeue("c", await store.failed_indices("c"), gen=gen) == n
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(batch_size=32, speculate=0), store, fleet.urls)
        sizes = [len(r.get("prompt", [])) for r in fleet.endpoints[0].received]
    assert sum(sizes) == n
    assert len(sizes) <= 12, sizes  # 10 batches of 32 (the first take finds 2 entries)
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(n))
    assert all(x["error"] is None for x in lines)
