"""A job's stream after commits, against a real Redis: acknowledged entries leave with the
stream's head (one XTRIM every 512 results, not an XDEL per entry), and what the workers still
have to do is read from the consumer group and the counters, never from the stream's length."""

from __future__ import annotations

from swarm_queue.common.models import Result
from swarm_queue.common.store import Commit, JobStore
from swarm_queue.common.vocab import TRIM_EVERY
from swarm_queue.producer.enqueue import enqueue_prompts
from tests.helpers import gen_of, prompts, spec


def _ok(entries: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, Result, None]]:
    return [(eid, Result(index=int(eid.split(b"-")[1]) - 1, text="x"), None) for eid, _ in entries]


async def _stream_ids(store: JobStore) -> list[bytes]:
    return [eid for eid, _ in await store.redis.xrange(store.keys.stream("j"))]


def _ids(lo: int, hi: int) -> list[bytes]:
    return [f"0-{i}".encode() for i in range(lo, hi + 1)]


async def test_commits_trim_the_stream_up_to_its_oldest_unfinished_entry_every_512_results(
    store: JobStore,
) -> None:
    """The trim (two commands) runs when the job's results pass a multiple of TRIM_EVERY and
    once it is finished, not at every commit; it takes the head up to the oldest entry still
    in a worker's hands, never an entry not delivered yet."""
    assert TRIM_EVERY == 512
    n = 2 * TRIM_EVERY + 10
    await enqueue_prompts(store, spec(), prompts(n), chunk=2000)
    gen = await gen_of(store, "j")
    slow = await store.read_new("j", "a", 3)  # 0-1 .. 0-3, held by a slow worker
    fast = await store.read_new("j", "b", TRIM_EVERY - 3)  # 0-4 .. 0-512
    assert await store.commit("j", _ok(fast), gen=gen) == Commit(509, 0)
    assert await _stream_ids(store) == _ids(1, n)  # 509 results: no trim yet
    assert await store.commit("j", _ok(slow), gen=gen) == Commit(3, 0)
    # 512 results, none in a worker's hands: every delivered entry goes, the rest stay.
    assert await _stream_ids(store) == _ids(513, n)
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending) == (512, 0, 522)

    few = await store.read_new("j", "a", 5)  # 0-513 .. 0-517
    assert await store.commit("j", _ok(few), gen=gen) == Commit(5, 0)
    assert await _stream_ids(store) == _ids(513, n)  # 517 results: left for the next trim
    slow = await store.read_new("j", "a", 3)  # 0-518 .. 0-520
    fast = await store.read_new("j", "b", TRIM_EVERY - 5)  # 0-521 .. 0-1027
    assert await store.commit("j", _ok(fast), gen=gen) == Commit(507, 0)
    # 1,024 results: the head goes up to the oldest entry still held, nothing after it.
    assert await _stream_ids(store) == _ids(518, n)
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending) == (1024, 3, 7)
    assert await store.job_has_work("j")
    assert await store.commit("j", _ok(slow), gen=gen) == Commit(3, 0)
    assert await _stream_ids(store) == _ids(518, n)
    rest = await store.read_new("j", "b", 10)
    assert await store.job_has_work("j")  # pending, though none is undelivered
    assert await store.commit("j", _ok(rest), gen=gen) == Commit(7, 0)
    assert await _stream_ids(store) == []  # the job is finished: all of it goes
    status = await store.status("j")
    assert (status.done, status.in_flight, status.pending, status.finished) == (n, 0, 0, True)
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
