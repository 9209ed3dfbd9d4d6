"""Affinity: prompts that share a long prefix go to the engine that computed it. Their keys
(common/affinity.py), their routing as they are read (route.lua: the key's first reader owns
it, its later prompts wait in that endpoint's lane), a prefix computed once in the fleet on a
shuffled documents-by-questions job, and, with real processes, an engine never idle while
others' lanes hold work, a dead endpoint's keys taken over, every answer exactly once."""

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
from tests.harness import Fleet, FleetFactory, command, sync_client
from tests.helpers import run_engine, wait_count


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


# -- the routing, on Redis -----------------------------------------------------------------


async def _queued(store: JobStore, prompts: list[str]) -> None:
    spec = JobSpec(job="r", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, spec, [(p, None) for p in prompts])


async def test_a_keys_first_reader_owns_it_and_its_later_prompts_go_to_that_lane(
    store: JobStore,
) -> None:
    doc_a, doc_b = documents(2, 3000)
    await _queued(store, [doc_a + " q0", doc_b + " q0", doc_a + " q1", doc_b + " q1"])
    lane_a, lane_b = lane_name("http://a"), lane_name("http://b")
    kept_a, keyed = await store.take_new("r", lane_a, "w|http://a", 1)  # a reads doc a first
    assert keyed and [e for e, _ in kept_a] == [b"0-1"]
    kept_b, _ = await store.take_new("r", lane_b, "w|http://b", 3)
    # b owns doc b's key now; doc a's second prompt went to a's lane
    assert [e for e, _ in kept_b] == [b"0-2", b"0-4"]
    in_lane = await store.take_lane("r", lane_a, "w|http://a", 10)
    assert [e for e, _, _ in in_lane] == [b"0-3"]
    assert await store.has_affinity("r")


async def test_entries_taken_over_from_a_lane_take_their_keys_along(store: JobStore) -> None:
    doc = documents(1, 3000)[0]
    await _queued(store, [doc + " q0", doc + " q1", doc + " q2"])
    lane_a, lane_b = lane_name("http://a"), lane_name("http://b")
    await store.take_new("r", lane_a, "w|http://a", 1)
    await store.take_new("r", lane_b, "w|http://b", 1)  # handed to a's lane
    stolen = await store.steal_lanes("r", lane_b, "w|http://b", 10, 0)  # a is gone: b takes it
    assert [e for e, _, _ in stolen] == [b"0-2"]
    kept, _ = await store.take_new("r", lane_b, "w|http://b", 10)
    assert [e for e, _ in kept] == [b"0-3"]  # the key is b's now: its next prompt stays


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
        monkeypatch.setattr(Affinities, "keys", lambda self, texts: [""] * len(texts))
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


def _owners(fleet: Fleet, job: str) -> dict[str, str]:
    from swarm_queue.common.keys import Keys

    client = sync_client(fleet.redis_url)
    try:
        raw = client.hgetall(Keys(fleet.prefix).owners(job))
    finally:
        client.close()
    return {k.decode(): v.decode() for k, v in raw.items()}


def _answers(fleet: Fleet, job: str, prompts: list[str]) -> None:
    """Every prompt answered once, in order, with the engine's own answer."""
    got = command(fleet.env, "swarm-collect", job, "--out", fleet.tmp / f"{job}.jsonl")
    assert got.returncode == 0, got.stderr
    lines = [json.loads(x) for x in (fleet.tmp / f"{job}.jsonl").read_text().splitlines()]
    assert [x["index"] for x in lines] == list(range(len(prompts)))
    assert [x["text"] for x in lines] == [completion_for(p, 12)[0] for p in prompts]


def test_a_dead_endpoints_keys_are_taken_over_and_every_prompt_answered_once(
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
    before = _owners(fleet, "qa")
    dead, alive = lane_name(fleet.url(0)), lane_name(fleet.url(1))
    assert dead in before.values() and alive in before.values()
    fleet.faults(0, die_after_s=0)
    assert worker.wait(timeout=120) in (0, 1)  # (1: an endpoint given up on, said)
    assert fleet.done("qa") == len(prompts)
    after = _owners(fleet, "qa")
    moved = [k for k, lane in before.items() if lane == dead and after[k] == alive]
    assert moved, (before, after)
    _answers(fleet, "qa", prompts)


def test_an_endpoint_with_nothing_of_its_own_takes_a_slow_ones_lane_and_the_job_ends(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A slow engine (a twentieth of the other's speed) owns about half the documents: the
    fast one, its own done, takes what waited in the slow one's lane past the wait (and
    their keys with it), and the job ends."""
    fleet = fleet_factory(2, "--step-ms", "10", "--speed", "0.05,1")
    src, prompts = _input(tmp_path, per_doc=6, n_docs=20)
    queued = command(fleet.env, "swarm-enqueue", src, "--job", "qa", "--max-tokens", "12")
    assert queued.returncode == 0, queued.stderr
    worker = fleet.worker(
        "w", [0, 1], SWARM_LANE_WAIT_MS="500", SWARM_BATCH_SIZE="4", SWARM_INFLIGHT="2"
    )
    assert worker.wait(timeout=300) == 0
    owners = list(_owners(fleet, "qa").values())
    assert owners.count(lane_name(fleet.url(1))) > len(owners) / 2, owners
    assert fleet.answered(1) > len(prompts) / 2
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
