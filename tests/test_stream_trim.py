"""A job's stream after commits, against a real Redis: acknowledged entries leave with the
stream's head (one XTRIM per commit, not an XDEL per entry), and what the workers still have
to do is read from the consumer group and the counters, never from the stream's length."""

from __future__ import annotations

from swarm_queue.common.models import Result
from swarm_queue.common.store import Commit, JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from tests.helpers import gen_of, prompts, spec


def _ok(entries: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, Result, None]]:
    return [(eid, Result(index=int(eid.split(b"-")[1]) - 1, text="x"), None) for eid, _ in entries]


async def _stream_ids(store: JobStore) -> list[bytes]:
    return [eid for eid, _ in await store.redis.xrange(store.keys.stream("j"))]


async def test_commits_in_any_order_trim_the_stream_up_to_its_oldest_unfinished_entry(
    store: JobStore,
) -> None:
    await enqueue_prompts(store, spec(), prompts(10))
    first = await store.read_new("j", "a", 3)  # 0-1 .. 0-3, held by a slow worker
    second = await store.read_new("j", "b", 3)  # 0-4 .. 0-6
    assert await store.job_has_work("j")

    assert await store.commit("j", _ok(second), gen=await gen_of(store, "j")) == Commit(3, 0)
    # The oldest entries are still pending: nothing after them is trimmed yet.
    assert await _stream_ids(store) == [f"0-{i}".encode() for i in range(1, 11)]
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending) == (3, 3, 4)

    assert await store.commit("j", _ok(first), gen=await gen_of(store, "j")) == Commit(3, 0)
    # Nothing pending: every delivered entry goes; the four never delivered stay.
    assert await _stream_ids(store) == [f"0-{i}".encode() for i in range(7, 11)]
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending) == (6, 0, 4)
    assert await store.job_has_work("j")

    rest = await store.read_new("j", "a", 10)
    assert await store.job_has_work("j")  # pending, though none is undelivered
    assert await store.commit("j", _ok(rest), gen=await gen_of(store, "j")) == Commit(4, 0)
    assert await _stream_ids(store) == []
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending, status.finished) == (10, 0, 0, True)
    assert not await store.job_has_work("j")


async def test_a_commit_counts_an_index_once_even_when_it_comes_twice(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(3))
    taken = await store.read_new("j", "a", 3)
    twice = [*_ok(taken[:1]), (taken[0][0], Result(index=0, text="again"), None)]
    assert await store.commit("j", twice, gen=await gen_of(store, "j")) == Commit(1, 0)
    assert await store.commit("j", _ok(taken), gen=await gen_of(store, "j")) == Commit(
        2, 0
    )  # index 0 already has its result
    assert [r.text for r in await store.read_results("j", 3)] == ["x", "x", "x"]
    assert (await store.status("j")).done == 3


async def test_cancel_removes_the_entries_never_delivered(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(8))
    await store.read_new("j", "a", 2)
    assert await store.cancel("j") == (True, 8)
    assert await _stream_ids(store) == []
    status = await store.status("j")
    assert (status.failed, status.in_flight, status.pending) == (8, 0, 0)
    assert not await store.job_has_work("j")
