"""Affinity: prompts that share a long prefix go to the engine that computes it. Their keys
(common/affinity.py), their routing as they are read (each key given to the live lane that
holds the fewest, its prompts handed there: route.lua), a prefix computed about once in the
fleet on a shuffled documents-by-questions job, and, with real processes, an engine never
idle while others' lanes hold work, a dead endpoint's share taken over, every answer exactly
once."""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm_queue.common.affinity import BLOCK_CHARS, MAX_GROUP, Affinities
from swarm_queue.common.keys import lane_name
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.intake import Intake
from swarm_queue.worker.sources import Copies
from tests.harness import Fleet, FleetFactory, command
from tests.helpers import run_engine, wait_count


async def _no_sleep(_: float) -> bool:
    return True


def documents(n: int, chars: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghij ") for _ in range(chars)) for _ in range(n)]


def questions(docs: list[str], per_doc: int, seed: int = 2) -> list[tuple[int, str]]:
    """Each document with each of ``per_doc`` questions, shuffled: (document, prompt)."""
    out = [(d, f"{doc}\nQuestion {q}: what does it say?") for d, doc in enumerate(docs)
           for q in range(per_doc)]  # fmt: skip
    random.Random(seed).shuffle(out)
    return out


# -- the keys ------------------------------------------------------------------------------


def test_the_prompts_of_one_document_share_a_key_and_other_documents_have_others() -> None:
    asked = questions(documents(12, 3000), 5)
    keys = Affinities().keys([p for _, p in asked])
    by_doc: dict[int, set[str]] = {}
    for (d, _), key in zip(asked, keys, strict=True):
        by_doc.setdefault(d, set()).add(key)
    assert all(len(k) == 1 and "" not in k for k in by_doc.values())
    assert len({next(iter(k)) for k in by_doc.values()}) == 12


def test_a_short_shared_system_prompt_gives_no_key() -> None:
    system = "You are a careful reader. " * 45  # 1,170 characters before each document
    prompts = [system + doc for doc in documents(6, 2000)]
    assert Affinities().keys(prompts) == [""] * 6  # shared: under half of each prompt


def test_short_prompts_carry_no_key() -> None:
    assert Affinities().keys(["same short prompt"] * 4) == [""] * 4


def test_a_key_of_more_prompts_than_a_group_is_split_into_groups() -> None:
    doc = documents(1, 4000)[0]
    keys = Affinities().keys([f"{doc} q{i}" for i in range(MAX_GROUP * 2 + 1)])
    groups = [keys.count(k) for k in dict.fromkeys(keys)]
    assert groups == [MAX_GROUP, MAX_GROUP, 1]


def test_a_prompt_shares_its_key_with_one_seen_in_an_earlier_chunk() -> None:
    a, b = documents(2, 2 * 16 * BLOCK_CHARS)
    keys = Affinities()
    first = keys.keys([a + " q1", b + " q1"])
    assert first == ["", ""]  # alone in its chunk, no other prompt seen yet
    second = keys.keys([a + " q2"])
    assert second[0] != ""
    assert second == Affinities().keys([a + " q1", a + " q2"])[1:]


def test_a_prompt_whose_siblings_all_come_in_the_next_chunk_shares_their_key() -> None:
    a = documents(1, 2 * 16 * BLOCK_CHARS)[0]
    keys = Affinities()
    first = keys.keys([a + " q1"], ahead=[a + " q2"])
    assert first[0] != ""
    assert keys.keys([a + " q2"]) == first


async def test_a_document_asked_on_both_sides_of_a_chunk_boundary_carries_one_key(
    store: JobStore,
) -> None:
    """The producer queues a chunk once it has read the next: a document's first question,
    alone in its chunk, is keyed with the questions that follow in the next chunk."""
    doc, other = documents(2, 3000)
    asked = [f"{doc} q0", f"{other} q0", f"{other} q1", f"{doc} q1", f"{doc} q2"]
    spec = JobSpec(job="c", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(p, None) for p in asked], chunk=3)
    read = await store.read_keyed("c", "w|http://a", 10)
    keys = [k for _, _, k in read]
    assert len(keys) == 5 and "" not in keys
    assert keys[0] == keys[3] == keys[4] and keys[1] == keys[2] != keys[0]


async def test_a_take_runs_at_once_only_the_entries_without_an_affinity_key(
    store: JobStore,
) -> None:
    """A keyed entry may go to another endpoint's lane as it is read: it runs from the start
    where it runs, never from the read that routes it. Like any entry read, it counts as
    running once until it is handed on (``route.lua`` marks it 0) or started: a worker dying
    between its read and its route leaves one death, which alone changes nothing."""
    doc, other = documents(2, 3000)
    spec = JobSpec(job="c", params=SamplingParams(max_tokens=8))
    asked = [f"{doc} q0", f"{other} q0", f"{doc} q1", f"{other} q1"]
    await enqueue_prompts(store, spec, [(p, None) for p in asked])
    gen = (await store.load_spec("c")).generation
    entries, marked = await store.take_new("c", "w|http://a", 10, gen=gen)
    assert len(entries) == 4 and all(key for _, _, key in entries)
    assert marked == set()
    over = await store.autoclaim("c", "w|http://b", 0, 10)
    assert [deaths for _, _, deaths in over] == [1, 1, 1, 1]


# -- the routing, on Redis -----------------------------------------------------------------


async def test_each_new_key_goes_to_the_live_lane_holding_fewest_and_stays_there(
    store: JobStore,
) -> None:
    """Twelve documents, each asked twice, read by endpoint a with three live lanes: each
    lane is given four documents (a's own stay with it, the others' prompts wait in their
    lanes); a document's second prompt goes where its first went."""
    docs = documents(12, 3000)
    asked = [f"{d} q{q}" for q in range(2) for d in docs]
    spec = JobSpec(job="r", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(p, None) for p in asked])
    lanes = sorted(lane_name(u) for u in ("http://a", "http://b", "http://c"))
    mine = lane_name("http://a")
    read = await store.read_keyed("r", "w|http://a", 100)
    handed = await store.route("r", mine, lanes, [(e, k) for e, _, k in read])
    kept = [e for e, _, _ in read if e not in handed]
    assert len(kept) == 8  # its four documents, twice each
    given = {lane: await store.take_lane("r", lane, f"w|{lane}", 100) for lane in lanes}
    assert given[mine] == [] and [len(given[x]) for x in lanes if x != mine] == [8, 8]
    assert {n for taken in given.values() for _, _, n in taken} == {0}  # (none ran: no death)
    by_key = dict(zip([e for e, _, _ in read], [k for _, _, k in read], strict=True))
    for lane, taken in given.items():
        assert len({by_key[e] for e, _, _ in taken}) in (0, 4), lane


async def test_a_key_whose_lane_left_the_fleet_is_given_to_a_live_one(store: JobStore) -> None:
    doc = documents(1, 3000)[0]
    spec = JobSpec(job="r", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(f"{doc} q{i}", None) for i in range(3)])
    a, b = lane_name("http://a"), lane_name("http://b")
    first = await store.read_keyed("r", "w|http://b", 1)
    await store.route("r", b, [a], [(e, k) for e, _, k in first])  # b is not live: a's key
    assert [e for e, _, _ in await store.take_lane("r", a, "w|a", 10)] == [b"0-1"]
    rest = await store.read_keyed("r", "w|http://b", 10)
    handed = await store.route("r", b, [b], [(e, k) for e, _, k in rest])  # a has gone
    assert handed == set()  # the key is b's now: its prompts stay with it


async def test_an_endpoint_that_read_nothing_of_a_job_still_takes_its_lane(
    store: JobStore, make_settings: Callable[..., Settings]
) -> None:
    """A worker that restarts (or joins) after every entry of a job was read, some of them
    handed to its lane, takes that lane's entries first: it need not have read a keyed entry
    itself to know the job's prompts carry keys."""
    docs = documents(4, 3000)
    spec = JobSpec(job="k", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(f"{d} q{q}", None) for d in docs for q in range(2)])
    a, b = lane_name("http://a"), lane_name("http://b")
    read = await store.read_keyed("k", "w|http://b", 100)
    handed = await store.route("k", b, [a, b], [(e, k) for e, _, k in read])
    assert len(handed) == 4  # two documents given to a's lane, each asked twice
    spec = await store.load_spec("k")
    fresh = Intake(store, "w|http://a", make_settings(batch_size=8), "http://a", _no_sleep)
    taken = await fresh.next([spec], None)
    assert taken is not None and {e for e, _, _ in taken.deliveries} == handed


async def test_a_steal_takes_the_entries_of_one_key_together(store: JobStore) -> None:
    """Entries waiting in a busy endpoint's lane, two documents interleaved: an endpoint with
    nothing to do takes the oldest entry's document whole, not the oldest entries of both
    (each of which it would compute again)."""
    doc_a, doc_b = documents(2, 3000)
    asked = [f"{(doc_a, doc_b)[i % 2]} q{i}" for i in range(8)]
    spec = JobSpec(job="r", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(p, None) for p in asked])
    read = await store.read_keyed("r", "w|http://a", 10)
    busy = lane_name("http://a")
    await store.route("r", lane_name("http://c"), [busy], [(e, k) for e, _, k in read])
    stolen = await store.steal_lanes("r", lane_name("http://b"), "w|http://b", 4, 0)
    assert [e for e, _, _ in stolen] == [b"0-1", b"0-3", b"0-5", b"0-7"]  # doc a's four


# -- a prefix computed once ----------------------------------------------------------------

PREFILL = EngineConfig(
    step_base_ms=2.0, step_per_seq_ms=0.05, prefill_ms_per_token=0.01, max_model_len=4096
)


@pytest.mark.parametrize("affinity", [True, False])
async def test_a_shuffled_documents_job_computes_each_document_about_once_in_the_fleet(
    affinity: bool,
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 documents x 8 questions, shuffled, on 4 engines that charge prefill: with affinity,
    the engines prefill close to each document once (its last partial block and each
    question's tail aside); without, about as many times as engines it reaches. Every answer
    is the engine's own for its prompt, in its place."""
    if not affinity:
        monkeypatch.setattr(Affinities, "keys_of", lambda self, texts, ahead: [""] * len(texts))
    docs = documents(40, 4000)
    asked = questions(docs, 8)
    await enqueue_prompts(
        store,
        JobSpec(job="qa", params=SamplingParams(max_tokens=8)),
        [(p, None) for _, p in asked],
    )
    # No tail copies: a copy on an idle engine computes its prefix again, by design.
    settings = make_settings(batch_size=8, inflight=2, speculate=False, lane_wait_ms=60_000)
    async with sim_fleet(4, PREFILL) as fleet:
        await run_engine(settings, store, fleet.urls)
        prefilled = sum(e.engine.prefilled_tokens for e in fleet.endpoints)
    status = await store.status("qa")
    assert (status.done, status.failed) == (len(asked), 0)
    results = await store.read_results("qa", len(asked))
    assert [r.text for r in results] == [completion_for(p, 8)[0] for _, p in asked]
    tail = len(asked) * (4000 % BLOCK_CHARS + len("\nQuestion 0: what does it say?")) // 4 + 8
    once = 40 * (4000 // 4) + tail  # each document's whole blocks once, each tail every time
    if affinity:
        assert prefilled <= 1.1 * once, (prefilled, once)
    else:
        assert prefilled >= 2 * once, (prefilled, once)


# -- real processes ------------------------------------------------------------------------

DOC_CHARS = 1300  # 325 tokens: the fleet's engines take 600


def _input(tmp: Path, per_doc: int, n_docs: int) -> tuple[Path, list[str]]:
    asked = questions(documents(n_docs, DOC_CHARS), per_doc)
    src = tmp / "input.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for _, p in asked))
    return src, [p for _, p in asked]


def _answers(fleet: Fleet, job: str, prompts: list[str]) -> None:
    """Every prompt answered once, in order, with the engine's own answer."""
    got = command(fleet.env, "swarm-collect", job, "--out", fleet.tmp / f"{job}.jsonl")
    assert got.returncode == 0, got.stderr
    lines = [json.loads(x) for x in (fleet.tmp / f"{job}.jsonl").read_text().splitlines()]
    assert [x["index"] for x in lines] == list(range(len(prompts)))
    assert [x["text"] for x in lines] == [completion_for(p, 12)[0] for p in prompts]


def test_a_dead_endpoints_share_is_taken_over_and_every_prompt_answered_once(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2, "--step-ms", "15", "--prefill-ms-per-token", "0.05")
    src, prompts = _input(tmp_path, per_doc=6, n_docs=30)
    queued = command(fleet.env, "swarm-enqueue", src, "--job", "qa", "--max-tokens", "12")
    assert queued.returncode == 0, queued.stderr
    # Small batches, few in flight: most of what the endpoint that dies owns waits in its lane.
    worker = fleet.worker(
        "w",
        [0, 1],
        SWARM_LANE_WAIT_MS="300",
        SWARM_ENDPOINT_DEAD_S="5",
        SWARM_BATCH_SIZE="4",
        SWARM_INFLIGHT="2",
    )
    wait_count("answers before the death", lambda: fleet.done("qa"), 40)
    answered = fleet.answered(0)
    assert answered > 0  # it had its share
    fleet.faults(0, die_after_s=0)
    assert worker.wait(timeout=120) in (0, 1)  # (1: an endpoint given up on, said)
    assert fleet.done("qa") == len(prompts)
    _answers(fleet, "qa", prompts)


def test_an_endpoint_with_nothing_of_its_own_takes_a_slow_ones_lane_and_the_job_ends(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A slow engine (a twentieth of the other's speed) has half the documents: the fast
    one, its own done, takes what waited in the slow one's lane past the wait, and the job
    ends."""
    fleet = fleet_factory(2, "--step-ms", "10", "--speed", "0.05,1")
    src, prompts = _input(tmp_path, per_doc=6, n_docs=20)
    queued = command(fleet.env, "swarm-enqueue", src, "--job", "qa", "--max-tokens", "12")
    assert queued.returncode == 0, queued.stderr
    worker = fleet.worker(
        "w", [0, 1], SWARM_LANE_WAIT_MS="500", SWARM_BATCH_SIZE="4", SWARM_INFLIGHT="2"
    )
    assert worker.wait(timeout=300) == 0
    assert fleet.answered(1) > len(prompts) * 3 / 4  # its half, and most of the slow one's
    _answers(fleet, "qa", prompts)


def test_a_worker_killed_mid_job_leaves_its_lanes_to_the_next_and_counts_stay_exact(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2, "--step-ms", "15")
    src, prompts = _input(tmp_path, per_doc=6, n_docs=30)
    queued = command(fleet.env, "swarm-enqueue", src, "--job", "qa", "--max-tokens", "12")
    assert queued.returncode == 0, queued.stderr
    first = fleet.worker("w1", [0, 1], SWARM_LANE_WAIT_MS="60000")
    wait_count("answers before the kill", lambda: fleet.done("qa"), 40)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # Its successor on the same endpoints finds the lanes it left: no wait for a steal.
    second = fleet.worker("w1", [0, 1], SWARM_LANE_WAIT_MS="60000")
    assert second.wait(timeout=120) == 0
    assert fleet.done("qa") == len(prompts)
    _answers(fleet, "qa", prompts)


async def test_a_job_of_affinity_keys_copies_only_batches_three_times_as_late(
    store: JobStore, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tail copy computes its prompts' prefix again on another engine: for a job whose
    prompts carry keys, only a batch in flight three times as long as this endpoint's own
    take is copied (a stuck one still is)."""
    asked: list[int] = []

    async def copies(
        job: str, consumer: str, count: int, *, gen: str, min_idle_ms: int
    ) -> list[tuple[bytes, bytes]]:
        asked.append(min_idle_ms)
        return []

    monkeypatch.setattr(store, "copies", copies)
    source = Copies(store, "w|http://a", make_settings(claim_idle_ms=60_000))
    source.took("j", 2.0)
    await source.take(JobSpec(job="j"), 32)
    source.cadence.now("j")
    await source.take(JobSpec(job="j"), 32, affine=True)
    assert asked == [2000, 6000]
