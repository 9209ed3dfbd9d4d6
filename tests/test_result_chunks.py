"""A whole chunk answered in one commit is kept in one field of its job's results hash (issue
50: one field, one argument and one hash entry a chunk where there were one a prompt), and
every reader finds an index's result there or in its own field; first write wins across both,
eviction frees both. Against a real Redis (common/store/resultfields.py, lua/commit.lua)."""

from __future__ import annotations

from collections.abc import Callable

from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.models import JobSpec, Result, SamplingParams, decode_result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.resultfields import pack_chunk, split_chunk
from swarm_queue.common.vocab import FailureKind, Meta
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import MAX_TOKENS
from tests.helpers import collect_lines, output_lines, prompts, run_engine


def _spec(chunk: int = 8) -> JobSpec:
    return JobSpec(job="c", params=SamplingParams(max_tokens=MAX_TOKENS), chunk=chunk)


def _answers(
    eid: bytes, indices: range | tuple[int, ...], text: str
) -> list[tuple[bytes, Result, bytes | None]]:
    return [(eid, Result(index=i, text=f"{text} {i}", finish_reason="stop"), None) for i in indices]


class _Job:
    """Job ``c`` of chunks of 8, its first entries read by one consumer, committed as a worker
    commits (``chunk``: the job's, which lets it send a whole chunk as its field)."""

    def __init__(self, store: JobStore, gen: str, eids: list[bytes]) -> None:
        self.store, self.gen, self.eids = store, gen, eids

    @classmethod
    async def queued(cls, store: JobStore, n: int, take: int) -> _Job:
        await enqueue_prompts(store, _spec(), prompts(n))
        gen = (await store.load_spec("c")).generation
        return cls(store, gen, [eid for eid, _ in await store.read_new("c", "w|x", take)])

    async def done(self, answers: list[tuple[bytes, Result, bytes | None]], chunk: int = 8) -> int:
        """How many results the commit of ``answers`` wrote that were new."""
        return (await self.store.commit("c", answers, gen=self.gen, chunk=chunk)).done


async def _fields(store: JobStore) -> list[bytes]:
    return sorted(await store.redis.hkeys(store.keys.results("c")))


async def _texts(store: JobStore, start: int, count: int) -> list[str | None]:
    blobs = await store.fetch_results("c", start, count)
    return [None if b is None else decode_result(b).text for b in blobs]


async def test_a_whole_chunk_answered_in_one_commit_is_one_field_read_back_in_order(
    store: JobStore,
) -> None:
    job = await _Job.queued(store, 24, 2)
    assert job.eids == [b"0-1", b"0-9"]
    # (the second chunk's answers come out of order: the field is in index order)
    answers = _answers(b"0-1", range(8), "a") + _answers(b"0-9", range(15, 7, -1), "a")
    assert await job.done(answers) == 16
    assert await _fields(store) == [b"c0", b"c8"]
    assert await _texts(store, 0, 24) == [f"a {i}" for i in range(16)] + [None] * 8
    assert await _texts(store, 5, 6) == [f"a {i}" for i in range(5, 11)]
    assert (await store.status("c", rate=False)).done == 16


async def test_a_worker_keeps_each_whole_chunk_it_answers_in_the_chunks_field(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Batches of 20 take chunks of 8 whole (and one at the end, of 4, not on its own block's
    size): each whole chunk's answers in one field, the last chunk's a field a prompt, every
    line exact and in order."""
    n = 100
    await enqueue_prompts(store, _spec(), prompts(n))
    async with sim_fleet(2) as fleet:
        await run_engine(make_settings(batch_size=20, speculate=0), store, fleet.urls)
    fields = await _fields(store)
    assert sorted(f for f in fields if f.startswith(b"c")) == sorted(
        f"c{first}".encode() for first in range(0, 96, 8)
    )
    assert sorted(f for f in fields if not f.startswith(b"c")) == sorted(
        str(i).encode() for i in range(96, 100)
    )
    lines = await collect_lines(store, "c")
    assert [x["index"] for x in lines] == list(range(n))
    for x, (prompt, _) in zip(lines, prompts(n), strict=True):
        assert x["text"] == completion_for(prompt, MAX_TOKENS)[0], x["index"]
    assert (await store.status("c", rate=False)).done == n


async def test_a_copy_of_a_chunk_kept_in_one_field_writes_and_counts_nothing(
    store: JobStore,
) -> None:
    """A speculative copy of the whole chunk, and one of part of it, after the chunk was
    answered whole: nothing written, nothing counted, no chunk marked partly answered."""
    job = await _Job.queued(store, 16, 1)
    [eid] = job.eids
    assert await job.done(_answers(eid, range(8), "first")) == 8
    assert await job.done(_answers(eid, range(8), "copy")) == 0
    assert await job.done(_answers(eid, (1, 4), "part")) == 0
    assert await _fields(store) == [b"c0"]
    assert await _texts(store, 0, 8) == [f"first {i}" for i in range(8)]
    assert await store.redis.hget(store.keys.meta("c"), Meta.PARTIAL) == b"0"
    assert await store.answered("c", list(range(10))) == set(range(8))
    assert (await store.status("c", rate=False)).done == 8


async def test_a_chunk_answered_in_parts_is_a_field_a_prompt_and_reads_beside_packed_ones(
    store: JobStore,
) -> None:
    job = await _Job.queued(store, 16, 2)
    first, second = job.eids
    assert await job.done(_answers(first, range(8), "whole")) == 8
    assert await job.done(_answers(second, (9, 12), "part")) == 2
    rest = (8, 10, 11, 13, 14, 15)
    assert await job.done(_answers(second, rest, "rest")) == 6
    assert await _fields(store) == sorted([b"c0", *(str(i).encode() for i in range(8, 16))])
    want = [f"whole {i}" for i in range(8)]
    want += [f"{'part' if i in (9, 12) else 'rest'} {i}" for i in range(8, 16)]
    assert await _texts(store, 0, 16) == want
    # (read again: by the chunks' fields first now that the reader knows the job packs them)
    assert await _texts(store, 0, 16) == want
    assert await _texts(store, 6, 4) == want[6:10]
    assert (await store.status("c", rate=False)).done == 16


async def test_a_read_of_the_leading_results_finds_each_in_either_layout_up_to_the_first_gap(
    store: JobStore,
) -> None:
    """Chunks of 8: the first whole (its field), the next three answered in parts (a field a
    prompt), the fourth but one prompt, the fifth whole. The leading results are every one
    up to the gap, whichever field holds it; a full read finds the fifth chunk's too."""
    job = await _Job.queued(store, 48, 5)
    e = job.eids
    assert await job.done(_answers(e[0], range(8), "w")) == 8
    for k in (1, 2, 3):
        lo = 8 * k
        assert await job.done(_answers(e[k], range(lo, lo + 3), "p")) == 3
        assert await job.done(_answers(e[k], range(lo + 3, lo + 8), "p")) == 5
    assert await job.done(_answers(e[4], range(33, 40), "p")) == 7
    assert await _texts(store, 0, 8) == [f"w {i}" for i in range(8)]  # (learns the layout)
    want = [f"w {i}" for i in range(8)] + [f"p {i}" for i in range(8, 32)]
    leading = await store.fetch_results("c", 0, 48, leading=True)
    assert [decode_result(b).text for b in leading[:32]] == want
    assert leading[32] is None
    assert (
        await _texts(store, 0, 48) == want + [None] + [f"p {i}" for i in range(33, 40)] + [None] * 8
    )
    assert [x.text for x in await output_lines(store, "c")] == want


async def test_a_reader_that_knew_a_jobs_chunks_reads_the_job_queued_again_by_its_own(
    store: JobStore,
) -> None:
    """A reader learns a job packs chunks of 8, the job is deleted and queued again under its
    name with chunks of 4 (and then once more packing none): each time it reads the new
    job's answers, each at its own index, none of the old job's."""
    job = await _Job.queued(store, 16, 2)
    assert (
        await job.done(
            _answers(job.eids[0], range(8), "old") + _answers(job.eids[1], range(8, 16), "old")
        )
        == 16
    )
    assert await _texts(store, 0, 16) == [f"old {i}" for i in range(16)]
    for chunk, packs in ((4, True), (4, False)):
        await store.delete_job("c")
        spec = JobSpec(job="c", params=SamplingParams(max_tokens=MAX_TOKENS), chunk=chunk)
        await enqueue_prompts(store, spec, prompts(16))
        if not packs:
            await store.redis.hdel(store.keys.meta("c"), Meta.PACKED)
        gen = (await store.load_spec("c")).generation
        eids = [eid for eid, _ in await store.read_new("c", "w|x", 3)]
        text = f"new{chunk}{packs}"
        answers = [
            a for k, eid in enumerate(eids) for a in _answers(eid, range(4 * k, 4 * k + 4), text)
        ]
        assert (await store.commit("c", answers, gen=gen, chunk=chunk)).done == 12
        fields = [f for f in await _fields(store) if f.startswith(b"c")]
        assert fields == ([b"c0", b"c4", b"c8"] if packs else [])
        assert await _texts(store, 0, 16) == [f"{text} {i}" for i in range(12)] + [None] * 4
        assert await _texts(store, 2, 9) == [f"{text} {i}" for i in range(2, 11)]


async def test_a_job_queued_before_chunks_were_packed_keeps_a_field_a_prompt(
    store: JobStore,
) -> None:
    """Its collector may be of the version before, which reads a field an index only."""
    job = await _Job.queued(store, 8, 1)
    await store.redis.hdel(store.keys.meta("c"), Meta.PACKED)
    assert await job.done(_answers(job.eids[0], range(8), "a")) == 8
    assert await _fields(store) == sorted(str(i).encode() for i in range(8))


async def test_eviction_frees_a_chunks_field_once_every_index_of_it_is_written_out(
    store: JobStore,
) -> None:
    job = await _Job.queued(store, 24, 3)
    answers = [
        a for k, eid in enumerate(job.eids) for a in _answers(eid, range(8 * k, 8 * k + 8), "a")
    ]
    assert await job.done(answers) == 24
    assert await store.evict_results("c", 0, 12, gen=job.gen) == 12
    assert await _fields(store) == [b"c16", b"c8"]  # (8..15 is not all written out yet)
    assert await store.evict_results("c", 12, 20, gen=job.gen) == 20
    assert await _fields(store) == [b"c16"]
    assert await store.evict_results("c", 20, 24, gen=job.gen) == 24
    assert await _fields(store) == []


async def test_a_damaged_chunk_field_fails_its_own_prompts_and_no_other(store: JobStore) -> None:
    job = await _Job.queued(store, 16, 2)
    answers = _answers(job.eids[0], range(8), "a") + _answers(job.eids[1], range(8, 16), "a")
    assert await job.done(answers) == 16
    await store.redis.hset(store.keys.results("c"), "c0", b"\xc1\xdc\x00\x08 cut short")
    results = await store.read_results("c", 16)
    assert [r.error_kind for r in results[:8]] == [FailureKind.BAD_ENTRY] * 8
    assert all("unreadable result in Redis" in (r.error or "") for r in results[:8])
    assert [r.text for r in results[8:]] == [f"a {i}" for i in range(8, 16)]


def test_a_chunks_field_of_another_size_than_its_jobs_chunk_reads_as_damaged() -> None:
    field = pack_chunk([b"\xa1a", b"\xa1b"])
    assert field == b"\xc1\x92\xc4\x02\xa1a\xc4\x02\xa1b"
    assert split_chunk(field, 2) == [b"\xa1a", b"\xa1b"]
    assert split_chunk(field, 3) == [field] * 3


async def test_a_chunk_sent_whole_after_some_of_it_was_answered_writes_only_the_rest(
    store: JobStore,
) -> None:
    """The worker sends the whole chunk as one field; 3 of its prompts were answered before:
    the commit takes it apart and writes, and counts, only the other 5 (first write wins)."""
    job = await _Job.queued(store, 8, 1)
    [eid] = job.eids
    assert await job.done(_answers(eid, (0, 3, 6), "first"), chunk=1) == 3
    assert await job.done(_answers(eid, range(8), "copy")) == 5
    assert await _fields(store) == sorted(str(i).encode() for i in range(8))
    assert await _texts(store, 0, 8) == [
        f"{'first' if i in (0, 3, 6) else 'copy'} {i}" for i in range(8)
    ]
    status = await store.status("c", rate=False)
    assert (status.done, status.pending, status.in_flight) == (8, 0, 0)


async def test_a_chunk_sent_whole_beside_a_failure_is_written_a_prompt_a_field(
    store: JobStore,
) -> None:
    job = await _Job.queued(store, 16, 2)
    first, second = job.eids
    failure = Result(index=9, error="server said 500", error_kind=FailureKind.SERVER_ERROR)
    answers = _answers(first, range(8), "a") + _answers(second, (8, *range(10, 16)), "a")
    answers.append((second, failure, b"its entry"))
    commit = await store.commit("c", answers, gen=job.gen, chunk=8)
    assert (commit.done, commit.failed) == (15, 1)
    assert await _fields(store) == sorted(str(i).encode() for i in range(16))
    texts = await _texts(store, 0, 16)
    assert texts == [None if i == 9 else f"a {i}" for i in range(16)]
    assert await store.failed_indices("c") == [(9, FailureKind.SERVER_ERROR)]


async def test_a_late_copy_of_a_chunk_collected_and_evicted_writes_and_counts_nothing(
    store: JobStore,
) -> None:
    job = await _Job.queued(store, 16, 1)
    [eid] = job.eids
    assert await job.done(_answers(eid, range(8), "a")) == 8
    assert await store.evict_results("c", 0, 8, gen=job.gen) == 8
    assert await job.done(_answers(eid, range(8), "late")) == 0
    assert await _fields(store) == []
    assert (await store.status("c", rate=False)).done == 8


async def test_what_a_producer_learns_an_answer_costs_counts_answers_not_fields(
    store: JobStore,
) -> None:
    """The room a producer leaves for answers (common/room.py) is their count times what one
    costs: 16 answers in 2 fields are 16 answers, each about its own size."""
    job = await _Job.queued(store, 16, 2)
    answers = _answers(job.eids[0], range(8), "a" * 400) + _answers(
        job.eids[1], range(8, 16), "a" * 400
    )
    assert await job.done(answers) == 16
    assert await _fields(store) == [b"c0", b"c8"]
    held, used = await store.result_bytes("c")
    assert held == 16
    assert 400 < used / held < 700
