"""The queue path against a real Redis: store semantics, enqueue, the drain engine, the collector.

The drain engine runs in-process here (``Engine.run(burst=True)`` or single ``step()`` calls)
against an in-process swarm-sim; tests with real worker processes are in test_e2e.py.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator

import msgspec
import pytest

from swarm_queue.common.errors import InputError, JobConflictError, JobGoneError
from swarm_queue.common.models import PromptItem, Result, SamplingParams, Usage, decode_item
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import TRIM_EVERY
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import write_output
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.replies import Choice, CompletionBody
from tests.harness import over_context
from tests.helpers import collect_lines, gen_of, prompts, run_engine, spec

# -- store and enqueue -------------------------------------------------------------------


async def test_enqueue_gives_explicit_ids_and_a_rerun_adds_nothing(store: JobStore) -> None:
    first = await enqueue_prompts(store, spec(), prompts(2500), chunk=1000)
    assert (first.total, first.added, first.already_queued) == (2500, 2500, 0)
    again = await enqueue_prompts(store, spec(), prompts(2500), chunk=1000)
    assert (again.total, again.added, again.already_queued) == (2500, 0, 2500)
    stream = store.keys.stream("j")
    assert await store.redis.xlen(stream) == 2500
    ids = [eid for eid, _ in await store.redis.xrange(stream, count=3)]
    assert ids == [b"0-1", b"0-2", b"0-3"]
    assert (await store.status("j")).total == 2500


async def test_enqueue_resumes_after_a_crash_with_no_gap_and_no_duplicate(store: JobStore) -> None:
    def crashing() -> Iterator[tuple[str, str | None]]:
        for i, p in enumerate(prompts(3000)):
            if i == 1700:
                raise KeyboardInterrupt  # the producer dies mid-input
            yield p

    with pytest.raises(KeyboardInterrupt):
        await enqueue_prompts(store, spec(), crashing(), chunk=500)
    assert await store.enqueued_count("j") == 1500  # three whole chunks reached Redis
    assert (await store.status("j")).total is None  # not sealed
    report = await enqueue_prompts(store, spec(), prompts(3000), chunk=500)
    assert (report.added, report.already_queued) == (1500, 1500)
    entries = await store.redis.xrange(store.keys.stream("j"))
    indices = [msgspec.msgpack.decode(f[b"d"])[0] for _, f in entries]
    assert indices == list(range(3000))


async def test_job_settings_conflicts_are_refused(store: JobStore) -> None:
    await enqueue_prompts(store, spec(max_tokens=16), prompts(10))
    with pytest.raises(JobConflictError, match="already exists with model=None"):
        await enqueue_prompts(store, spec(max_tokens=32), prompts(10))
    with pytest.raises(JobConflictError, match="sealed with 10 prompts; this input has more"):
        await enqueue_prompts(store, spec(), prompts(11))
    with pytest.raises(JobConflictError, match="holds 10 prompts but this input has only 9"):
        await enqueue_prompts(store, spec(), prompts(9))


async def test_a_copy_that_lost_counts_none_of_its_requests_tokens(store: JobStore) -> None:
    """Seen under CPU pressure (test_gateway's embeddings batch): a job's usage twice what
    its server counted, 400 of 200 tokens. A list answered with its total only (its lines
    carry no usage of their own) was counted by each copy that committed it, the losing one
    too. A commit counts a request's total by the share of its results that are new."""
    await enqueue_prompts(store, spec(), prompts(4))
    got = await store.read_new("j", "c1", 4)
    gen = await gen_of(store, "j")
    answers = [(eid, Result(index=i, text=f"t{i}"), None) for i, (eid, _) in enumerate(got)]
    await store.commit("j", answers[:2], Usage(20, 8), gen=gen)
    await store.commit("j", answers[:2], Usage(20, 8), gen=gen)
    # Half new (the other copy wrote the first two): half the request's total.
    await store.commit("j", answers, Usage(40, 16), gen=gen)
    status = await store.status("j")
    assert (status.done, status.prompt_tokens, status.completion_tokens) == (4, 40, 16)


async def test_a_take_reads_new_entries_running_at_once_and_a_death_counts_where_none_ended(
    store: JobStore,
) -> None:
    """One round trip a batch, no script: entries taken run at once, as after a start, with
    no mark written (an entry pending with none counts as running once): a worker that dies
    holding one leaves one death, its commit or a release none. The take of a job queued again
    under its name (another generation) hands what it read back at once, counting no death,
    and is the job gone, as a stream gone under the reader is."""
    await enqueue_prompts(store, spec(), prompts(4))
    gen = await gen_of(store, "j")
    entries, marked = await store.take_new("j", "c1", 3, gen=gen)
    assert [(eid, key) for eid, _, key in entries] == [(b"0-1", ""), (b"0-2", ""), (b"0-3", "")]
    assert [msgspec.msgpack.decode(p)[0] for _, p, _ in entries] == [0, 1, 2]
    assert marked == {b"0-1", b"0-2", b"0-3"}
    await store.commit("j", [(b"0-1", Result(index=0, text="a"), None)], gen=gen)
    assert await store.release("j", "c1", [b"0-3"], gen=gen) == 1
    # c1 dies holding 0-2: a reclaim finds one death there, none on 0-3 (given back).
    taken = await store.autoclaim("j", "c2", 0, 9)
    assert [(eid, n) for eid, _, n in taken] == [(b"0-2", 1), (b"0-3", 0)]
    with pytest.raises(JobGoneError):
        await store.take_new("j", "c3", 2, gen="another")
    # (handed back: idle long since, for any reclaim to take at once)
    assert [(e, n) for e, _, n in await store.autoclaim("j", "c4", 60_000, 9)] == [(b"0-4", 0)]
    await store.redis.delete(store.keys.stream("j"))
    with pytest.raises(JobGoneError):
        await store.take_new("j", "c1", 2, gen=gen)


async def test_a_commit_carrying_a_read_returns_the_next_entries_running_as_a_take_would(
    store: JobStore,
) -> None:
    """A slot's commit may bring its next batch in the same round trip: the read is take_new's
    (entries running at once, pending to the reader), its counts and failures' kinds as any
    commit's; a commit refused as of another generation gives what its read took back to the
    fleet at once, no death counted."""
    await enqueue_prompts(store, spec(), prompts(5))
    gen = await gen_of(store, "j")
    entries, _ = await store.take_new("j", "c1", 2, gen=gen)
    answers = [
        (entries[0][0], Result(index=0, text="a"), None),
        (entries[1][0], Result(index=1, error="bad", error_kind="rejected"), entries[1][1]),
    ]
    c = await store.commit("j", answers, gen=gen, read=("c1", 2))
    assert (c.done, c.failed, c.failed_by_kind) == (1, 1, {"rejected": 1})
    assert [(eid, key) for eid, _, key in c.taken] == [(b"0-3", ""), (b"0-4", "")]
    assert [msgspec.msgpack.decode(p)[0] for _, p, _ in c.taken] == [2, 3]
    assert c.marked == {b"0-3", b"0-4"}
    pending = await store.redis.xpending_range(store.keys.stream("j"), "workers", "-", "+", 9)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(b"0-3", b"c1"), (b"0-4", b"c1")]
    with pytest.raises(JobGoneError):
        await store.commit("j", [], gen="another", read=("c2", 2))
    # c2's read took 0-5 for a generation not its own: handed back at once, no death.
    taken = await store.autoclaim("j", "c3", 60_000, 9)
    assert [(eid, n) for eid, _, n in taken] == [(b"0-5", 0)]


async def test_a_commit_carrying_a_read_to_a_redis_that_lost_its_scripts_commits_and_reads(
    store: JobStore,
) -> None:
    """A Redis restarted (or a replica promoted) knows no script: the commit sent with its
    read in one round trip is sent again as text, the read's entries kept, none lost."""
    await enqueue_prompts(store, spec(), prompts(4))
    gen = await gen_of(store, "j")
    entries, _ = await store.take_new("j", "c1", 2, gen=gen)
    await store.redis.script_flush()
    answers = [(eid, Result(index=i, text=f"t{i}"), None) for i, (eid, _, _) in enumerate(entries)]
    c = await store.commit("j", answers, gen=gen, read=("c1", 2))
    assert c.done == 2 and [eid for eid, _, _ in c.taken] == [b"0-3", b"0-4"]
    assert (await store.status("j")).done == 2


async def test_a_commit_counts_the_own_tokens_of_its_new_results_only(store: JobStore) -> None:
    """Results that carry their own usage (a chat answer each) count it when written: a commit
    half of whose results another copy wrote first counts the other half's tokens, whatever
    order its entries' results come in."""
    await enqueue_prompts(store, spec(), prompts(4))
    got = await store.read_new("j", "c1", 4)
    gen = await gen_of(store, "j")
    answers = [
        (eid, Result(index=i, text=f"t{i}", usage=Usage(10 + i, 1 + i, cached_tokens=i)), None)
        for i, (eid, _) in enumerate(got)
    ]
    await store.commit("j", [answers[1], answers[3]], gen=gen)
    c = await store.commit("j", [answers[3], answers[0], answers[1], answers[2]], gen=gen)
    assert (c.done, c.failed) == (2, 0)
    status = await store.status("j")
    assert (status.done, status.finished) == (4, True)
    # 11+13 first, then 10+12; completion 2+4 then 1+3; cached 1+3 then 0+2.
    assert (status.prompt_tokens, status.completion_tokens) == (46, 10)
    assert status.cached_tokens == 6


async def test_commit_is_first_write_wins_and_counts_only_new_results(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(3))
    got = await store.read_new("j", "c1", 3)
    assert [eid for eid, _ in got] == [b"0-1", b"0-2", b"0-3"]
    first = [
        (got[0][0], Result(index=0, text="first"), got[0][1]),
        (got[1][0], Result(index=1, error="bad", error_kind="rejected"), got[1][1]),
    ]
    c = await store.commit("j", first, Usage(5, 7), gen=await gen_of(store, "j"))
    assert (c.done, c.failed) == (1, 1)
    # A redelivered entry's late result never replaces the one already written.
    c = await store.commit(
        "j", [(got[0][0], Result(index=0, text="second"), None)], gen=await gen_of(store, "j")
    )
    assert (c.done, c.failed) == (0, 0)
    lines = [line for line in await collect_lines(store, "j")]
    assert [(x["index"], x["text"], x["error"]) for x in lines] == [
        (0, "first", None),
        (1, None, "bad"),
    ]
    status = await store.status("j")
    assert (status.done, status.failed, status.in_flight, status.pending) == (1, 1, 1, 0)
    assert (status.prompt_tokens, status.completion_tokens) == (5, 7)
    assert not status.finished
    await store.commit(
        "j", [(got[2][0], Result(index=2, text="third"), None)], gen=await gen_of(store, "j")
    )
    status = await store.status("j")
    assert status.finished and status.in_flight == 0
    assert await store.redis.xlen(store.keys.stream("j")) == 0  # acked entries are trimmed


async def test_collector_writes_only_the_contiguous_prefix(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(4))
    got = await store.read_new("j", "c", 4)
    await store.commit(
        "j",
        [(got[i][0], Result(index=i, text=f"t{i}"), None) for i in (0, 1, 3)],
        gen=await gen_of(store, "j"),
    )
    buf = io.BytesIO()
    report = await write_output(store, "j", buf)
    assert [msgspec.json.decode(x)["index"] for x in buf.getvalue().splitlines()] == [0, 1]
    assert (report.written, report.total, report.complete) == (2, 4, False)


# -- the drain engine --------------------------------------------------------------------


async def test_engine_drains_two_jobs_over_two_endpoints_in_order(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    settings = make_settings(batch_size=16, inflight=3)
    await enqueue_prompts(store, spec("a", max_tokens=9), prompts(700))
    await enqueue_prompts(store, spec("b", max_tokens=20), prompts(300))
    async with sim_fleet(2) as fleet:
        engine = await run_engine(settings, store, fleet.urls)
    for job, n, max_tokens in (("a", 700, 9), ("b", 300, 20)):
        lines = await collect_lines(store, job)
        assert [x["index"] for x in lines] == list(range(n))
        for x, (p, _) in zip(lines, prompts(n), strict=True):
            text, _, reason = completion_for(p, max_tokens)
            assert (x["text"], x["finish_reason"], x["error"]) == (text, reason, None)
        assert (await store.status(job)).finished
    per_endpoint = [d.figures.prompts_done for d in engine.drainers]
    assert sum(per_endpoint) == 1000 and min(per_endpoint) > 0


async def test_over_long_prompts_fail_alone_with_the_servers_message(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    poison = {5, 37, 38, 63}
    items = [("y" * 400 if i in poison else f"fine {i}", f"id-{i}") for i in range(64)]
    await enqueue_prompts(store, spec(max_tokens=8), items)
    async with sim_fleet(1, EngineConfig(max_model_len=64, step_base_ms=0.5)) as fleet:
        await run_engine(make_settings(batch_size=32, inflight=2), store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert [x["index"] for x in lines] == list(range(64))
    failed = {x["index"] for x in lines if x["error"]}
    assert failed == poison
    for x in lines:
        assert x["custom_id"] == f"id-{x['index']}"
        if x["index"] in poison:
            assert x["error"].startswith(over_context(64))
            assert x["text"] is None
        else:
            assert x["text"] == completion_for(items[x["index"]][0], 8)[0]
    status = await store.status("j")
    assert (status.done, status.failed, status.finished) == (60, 4, True)


async def test_transient_errors_are_retried_until_every_prompt_succeeds(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(400))
    faults = [FaultConfig(error_rate=0.3, reset_rate=0.1)]
    async with sim_fleet(1, faults=faults) as fleet:
        engine = await run_engine(make_settings(batch_size=10, max_attempts=30), store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert [x["error"] for x in lines] == [None] * 400
    assert engine.drainers[0].runner.retries > 0
    assert max(x["attempts"] for x in lines) > 1


class _RewritingClient(EndpointClient):
    """A real client whose answers are rewritten, to play a server that behaves differently."""

    def __init__(self, url: str, rewrite: Callable[[list[str], list[Choice]], list[Choice]]):
        super().__init__(url)
        self.rewrite = rewrite

    async def complete(
        self,
        model: str,
        prompts: list[str],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        add_special_tokens: bool | None = None,
        token_ids: bool = False,
    ) -> CompletionBody:
        body = await super().complete(
            model, prompts, params, timeout_s=timeout_s, add_special_tokens=add_special_tokens
        )
        return CompletionBody(choices=self.rewrite(prompts, body.choices), usage=body.usage)


def _reversed(prompts: list[str], choices: list[Choice]) -> list[Choice]:
    return list(reversed(choices))  # answers in another order: mapping must use choice.index


def _drop_13(prompts: list[str], choices: list[Choice]) -> list[Choice]:
    return [c for c in choices if "13" not in prompts[c.index]]  # loses some choices


async def _drain_with(settings: Settings, store: JobStore, client: EndpointClient) -> None:
    engine = Engine(settings, store, [client])
    try:
        await engine.run(burst=True)
    finally:
        await engine.close()


async def test_results_are_mapped_by_choice_index_never_by_position(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(50))
    async with sim_fleet(1) as fleet:
        await _drain_with(settings, store, _RewritingClient(fleet.urls[0], _reversed))
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(50)]


async def test_a_missing_choice_is_asked_again_then_fails_only_its_prompt(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(50))
    async with sim_fleet(1) as fleet:
        await _drain_with(settings, store, _RewritingClient(fleet.urls[0], _drop_13))
    lines = await collect_lines(store, "j")
    failed = [x["index"] for x in lines if x["error"]]
    assert failed == [i for i, (p, _) in enumerate(prompts(50)) if "13" in p]
    # Asked for again on their own until the attempts ran out (6 by default); no other
    # endpoint could take them.
    assert lines[13]["error"] == (
        "endpoint returned no choice for it in 6 attempts; no other endpoint serves the job's model"
    )
    assert {lines[i]["attempts"] for i in failed} == {6}
    for x, (p, _) in zip(lines, prompts(50), strict=True):
        if not x["error"]:
            assert x["text"] == completion_for(p, 16)[0]
            assert x["attempts"] == 1


async def test_a_prompt_a_lone_endpoint_always_leaves_out_fails_alone_and_its_job_ends(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """Seen under CPU pressure: the batch holding the prompt the server always left out
    was taken, answered but for it, and given back for ever (29 minutes, 4,300 requests):
    its retries alone opened the circuit (five flawed answers in a row), the probe (another
    prompt) passed, and the batch was taken again. One batch of 20 makes that order certain.
    The server answers every other prompt: the fault is the prompt's, which fails alone."""
    await enqueue_prompts(store, spec(), prompts(20))
    async with sim_fleet(1) as fleet:
        client = _RewritingClient(fleet.urls[0], _drop_13)
        await asyncio.wait_for(_drain_with(settings, store, client), timeout=60)
    lines = await collect_lines(store, "j")
    assert [x["index"] for x in lines if x["error"]] == [13]
    assert lines[13]["error"] == (
        "endpoint returned no choice for it in 6 attempts; no other endpoint serves the job's model"
    )
    assert [x["text"] for x in lines if not x["error"]] == [
        completion_for(p, 16)[0] for i, (p, _) in enumerate(prompts(20)) if i != 13
    ]


async def test_choices_missing_once_are_answered_by_the_next_request(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    dropped: set[str] = set()

    def drop_each_once(prompts: list[str], choices: list[Choice]) -> list[Choice]:
        kept = [c for c in choices if c.index % 3 or prompts[c.index] in dropped]
        dropped.update(prompts[c.index] for c in choices)
        return kept

    await enqueue_prompts(store, spec(), prompts(60))
    async with sim_fleet(1) as fleet:
        await _drain_with(settings, store, _RewritingClient(fleet.urls[0], drop_each_once))
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(60)]
    assert {x["attempts"] for x in lines} == {1, 2}


def _duplicated(prompts: list[str], choices: list[Choice]) -> list[Choice]:
    return [msgspec.structs.replace(c, index=0) for c in choices]  # every answer claims 0


def _one_based(prompts: list[str], choices: list[Choice]) -> list[Choice]:
    return [msgspec.structs.replace(c, index=c.index + 1) for c in choices]


@pytest.mark.parametrize("lie", [_duplicated, _one_based])
async def test_an_answer_with_repeated_or_shifted_indices_is_never_committed(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    lie: Callable[[list[str], list[Choice]], list[Choice]],
) -> None:
    await enqueue_prompts(store, spec(), prompts(200))
    async with sim_fleet(2) as fleet:
        settings = make_settings(batch_size=10, max_attempts=2, circuit_failures=3)
        liar = _RewritingClient(fleet.urls[0], lie)
        engine = Engine(settings, store, [liar, EndpointClient(fleet.urls[1])])
        try:
            await engine.run(burst=True)
        finally:
            await engine.close()
    lines = await collect_lines(store, "j")
    # Every answer is the right prompt's: the liar's were refused, its batches went elsewhere.
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(200)]
    liar_drainer, honest = engine.drainers
    assert (liar_drainer.figures.prompts_done, honest.figures.prompts_done) == (0, 200)
    assert "malformed answer: choice index" in liar_drainer.circuit.last_error


async def test_entries_an_endpoint_ended_unsent_leave_its_hands(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    """The only endpoint of a job answers unusably: its entries are taken and failed, never
    sent. They leave the endpoint's hands too: a job queued again under the name numbers its
    entries alike, and one still held would be dropped from every read of the new job."""
    await enqueue_prompts(store, spec(), prompts(60))
    settings = make_settings(batch_size=10, max_attempts=2, circuit_failures=3)
    async with sim_fleet(1) as fleet:
        engine = Engine(settings, store, [_RewritingClient(fleet.urls[0], _duplicated)])
        try:
            await engine.run(burst=True)
        finally:
            await engine.close()
    lines = await collect_lines(store, "j")
    assert len(lines) == 60 and all(x["error_kind"] == "malformed" for x in lines)
    assert engine.drainers[0].intake.hand("j") == set()


async def test_a_failing_endpoint_releases_its_batch_to_another_worker(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(20))
    async with sim_fleet(2, faults=[FaultConfig(error_rate=1.0), FaultConfig()]) as fleet:
        s = make_settings(batch_size=20, max_attempts=2, claim_idle_ms=60_000)
        bad = Engine(s, store, [EndpointClient(fleet.urls[0])])
        try:
            assert await bad.drainers[0].step() is True  # takes the batch, fails, releases it
        finally:
            await bad.close()
        assert bad.drainers[0].figures.prompts_done == 0
        status = await store.status("j")
        # Released, they are in no worker's hands: waiting, not in flight (seen: a job "in
        # flight 96" during its endpoint's death, while that endpoint's row said 0).
        assert (status.in_flight, status.pending, status.done) == (0, 20, 0)
        # Released entries are taken over at once, not after claim_idle_ms (60 s here).
        good = Engine(
            make_settings(worker_name="other", claim_idle_ms=60_000),
            store,
            [EndpointClient(fleet.urls[1])],
        )
        try:
            await good.run(burst=True)
        finally:
            await good.close()
    lines = await collect_lines(store, "j")
    assert [x["endpoint"] for x in lines] == [fleet.urls[1]] * 20
    assert all(x["error"] is None for x in lines)


async def test_a_restarted_worker_finishes_its_own_unacked_entries_first(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(30))
    async with sim_fleet(1) as fleet:
        consumer = f"test|{fleet.urls[0]}"
        taken = await store.read_new("j", consumer, 10)  # a worker took 10 entries, then died
        assert len(taken) == 10
        engine = Engine(
            make_settings(batch_size=10, inflight=1), store, [EndpointClient(fleet.urls[0])]
        )
        try:
            assert await engine.drainers[0].step() is True
        finally:
            await engine.close()
    lines = await collect_lines(store, "j")
    assert [x["index"] for x in lines] == list(range(10))  # its own leftovers came first


async def test_orphans_of_a_dead_worker_are_reclaimed_after_the_idle_time(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await enqueue_prompts(store, spec(), prompts(40))
    await store.read_new("j", "dead-host|http://gone:1", 15)  # taken by a worker that died
    async with sim_fleet(1) as fleet:
        await run_engine(make_settings(claim_idle_ms=200), store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert [x["index"] for x in lines] == list(range(40))
    assert all(x["error"] is None for x in lines)


async def test_undecodable_entries_fail_under_their_index(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    await store.create_job(spec())
    await store.add_items("j", [PromptItem(0, "good")], gen=await gen_of(store, "j"))
    await store.redis.xadd(store.keys.stream("j"), {b"d": b"\xc1garbage"}, id="0-2")
    await store.seal("j", 2, gen=await gen_of(store, "j"))
    async with sim_fleet(1) as fleet:
        await run_engine(settings, store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert lines[0]["error"] is None
    assert lines[1]["index"] == 1 and lines[1]["error"].startswith("undecodable stream entry")


async def test_heartbeat_and_release_touch_only_entries_still_owned(store: JobStore) -> None:
    await enqueue_prompts(store, spec(), prompts(6))
    mine = [eid for eid, _ in await store.read_new("j", "slow", 6)]
    # Another worker takes over the first three (say the slow one looked dead for a while).
    taken = await store.redis.xclaim(
        store.keys.stream("j"), "workers", "fast", 0, mine[:3], justid=True
    )
    assert taken == mine[:3]
    assert (
        await store.touch("j", "slow", mine, gen=await gen_of(store, "j")) == 3
    )  # the heartbeat keeps only its own 3
    assert await store.release("j", "slow", mine, gen=await gen_of(store, "j")) == 3
    detail = await store.redis.xpending_range(store.keys.stream("j"), "workers", "-", "+", 10)
    owner = {d["message_id"]: d["consumer"] for d in detail}
    assert [owner[e] for e in mine] == [b"fast"] * 3 + [b"slow"] * 3
    # Released entries are instantly reclaimable; the taken-over ones are not. A release is
    # no death: they come back with none counted against them.
    reclaimed = await store.autoclaim("j", "third", 60_000, 10)
    assert [(eid, n) for eid, _, n in reclaimed] == [(e, 0) for e in mine[3:]]


async def test_enqueue_window_keeps_at_most_n_unfinished_prompts_in_redis(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    import asyncio

    n, window = 1200, 100
    stream, meta = store.keys.stream("j"), store.keys.meta("j")
    seen: list[int] = []
    unfinished: list[int] = []
    await store.create_job(spec())  # a burst engine finding no job at all would just exit
    async with sim_fleet(1) as fleet:
        engine = Engine(
            make_settings(batch_size=16, inflight=2), store, [EndpointClient(fleet.urls[0])]
        )
        drain = asyncio.create_task(engine.run(burst=True))
        producing = asyncio.create_task(
            enqueue_prompts(store, spec(), prompts(n), chunk=50, window=window)
        )
        try:
            while not producing.done():  # observe the stream while the producer streams
                seen.append(await store.redis.xlen(stream))
                counts = await store.redis.hmget(meta, ["enqueued", "done", "failed"])
                queued, done, failed = (int(c or 0) for c in counts)
                unfinished.append(queued - done - failed)
                await asyncio.sleep(0.002)
            report = await producing
            await drain
        finally:
            await engine.close()
    assert report.total == n
    assert 0 < max(unfinished) <= window
    # The stream holds them, and finished ones' entries until its next trim (TRIM_EVERY).
    assert 0 < max(seen) <= window + TRIM_EVERY
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(n)]


async def test_collect_evict_leaves_only_unwritten_results_in_redis(
    store: JobStore, tmp_path: pytest.TempPathFactory
) -> None:
    from swarm_queue.producer.outfile import CursorFile
    from swarm_queue.producer.output import collect_output

    n = 5000
    await enqueue_prompts(store, spec(), prompts(n))
    got = await store.read_new("j", "c", n)
    await store.commit(
        "j",
        [(eid, Result(index=i, text=f"t{i}"), None) for i, (eid, _) in enumerate(got) if i < 4500],
        gen=await gen_of(store, "j"),
    )
    out = str(tmp_path / "out.jsonl")
    first = await collect_output(store, "j", out, wait=False, progress=False, evict=True)
    assert (first.written, first.complete) == (4500, False)
    assert await store.redis.hlen(store.keys.results("j")) == 0  # all written lines evicted
    assert CursorFile(out).load("j") is not None
    await store.commit(
        "j",
        [(eid, Result(index=i, text=f"t{i}"), None) for i, (eid, _) in enumerate(got) if i >= 4500],
        gen=await gen_of(store, "j"),
    )
    second = await collect_output(store, "j", out, wait=False, progress=False, evict=True)
    assert (second.start, second.written, second.complete) == (4500, 500, True)
    assert await store.redis.hlen(store.keys.results("j")) == 0
    from pathlib import Path

    raw = await asyncio.to_thread(Path(out).read_bytes)
    lines = [msgspec.json.decode(x) for x in raw.splitlines()]
    assert [x["text"] for x in lines] == [f"t{i}" for i in range(n)]


async def test_another_input_under_an_existing_job_name_is_refused(store: JobStore) -> None:
    def other(n: int) -> Iterator[tuple[str, str | None]]:
        return ((f"a different question {i}", None) for i in range(n))

    await enqueue_prompts(store, spec(), prompts(2000))
    # The same count of lines from another file: refused, not "2000 already queued".
    with pytest.raises(JobConflictError, match="already holds 2000 prompts queued from another"):
        await enqueue_prompts(store, spec(), other(2000))
    again = await enqueue_prompts(store, spec(), prompts(2000))  # its own input: fine
    assert (again.added, again.already_queued) == (0, 2000)

    # An interrupted enqueue resumed with another file: refused before anything is mixed in.
    def crashing() -> Iterator[tuple[str, str | None]]:
        for i, p in enumerate(prompts(3000)):
            if i == 1200:
                raise KeyboardInterrupt
            yield p

    with pytest.raises(KeyboardInterrupt):
        await enqueue_prompts(store, spec("k"), crashing(), chunk=500)
    with pytest.raises(JobConflictError, match="already holds 1000 prompts queued from another"):
        await enqueue_prompts(store, spec("k"), other(3000), chunk=500)
    assert await store.enqueued_count("k") == 1000
    report = await enqueue_prompts(store, spec("k"), prompts(3000), chunk=700)  # other chunks
    assert (report.added, report.already_queued) == (2000, 1000)
    entries = await store.redis.xrange(store.keys.stream("k"))
    assert [decode_item(f[b"d"]).prompt for _, f in entries] == [p for p, _ in prompts(3000)]


async def test_an_input_refused_on_its_first_lines_leaves_no_job_behind(store: JobStore) -> None:
    def refused() -> Iterator[tuple[str, str | None]]:
        yield "fine", None
        raise InputError("p.jsonl", 2, "invalid JSON")

    with pytest.raises(InputError):
        await enqueue_prompts(store, spec("nothing"), refused())
    assert await store.list_jobs() == []
    assert [k async for k in store.redis.scan_iter(match=f"{store.keys.prefix}:*")] == []


async def test_a_burst_worker_does_not_wait_for_an_unsealed_job_whose_producer_is_gone(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    def dies_halfway() -> Iterator[tuple[str, str | None]]:
        for i, p in enumerate(prompts(500)):
            if i == 300:
                raise InputError("p.txt", 301, "line too long")  # the rest never comes
            yield p

    with pytest.raises(InputError):
        await enqueue_prompts(store, spec(), dies_halfway(), chunk=100)
    async with sim_fleet(1) as fleet:
        await asyncio.wait_for(run_engine(make_settings(), store, fleet.urls), timeout=30)
    status = await store.status("j")
    assert (status.done, status.total, status.finished) == (300, None, False)


async def test_strikes_count_the_endpoints_that_gave_an_entry_back_the_times_and_tries_apart(
    store: JobStore,
) -> None:
    """One endpoint that answers unusably and takes back what it gave back (its probes pass:
    a wrong-dimension vector is a good shape to a probe) must not use up an entry's strikes
    alone, failing it while a good endpoint could answer it (seen under CPU pressure:
    test_uneven_fleet's wrong-dimension endpoint failed 32 prompts by itself); the times are
    counted apart, so that one retaking what it gave back for ever is bounded too (seen: a
    prompt failing with HTTP 500 given back about 200 times by one endpoint). The requests
    that carried it to the endpoints that gave it back add up, for the line that says them."""
    await enqueue_prompts(store, spec(), prompts(2))
    gen = await gen_of(store, "j")
    ids = [eid for eid, _ in await store.read_new("j", "bad", 2)]
    for _ in range(3):  # given back, taken back, given back...
        assert await store.release("j", "bad", ids, gen=gen, strike=True, tries=2) == 2
        assert [e for e, _, _ in await store.autoclaim("j", "bad", 60_000, 10)] == ids
    assert await store.strikes("j", ids) == [(1, 3, 6), (1, 3, 6)]
    await store.release("j", "bad", ids, gen=gen, strike=True)  # never sent: no try
    assert [e for e, _, _ in await store.autoclaim("j", "other", 60_000, 10)] == ids
    await store.release("j", "other", ids[:1], gen=gen, strike=True, tries=1)
    assert await store.strikes("j", ids) == [(2, 5, 7), (1, 4, 6)]
