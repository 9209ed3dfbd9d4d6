"""The response cache shared by every job of one Redis: what it keys answers on, what it keeps
and evicts (against a real Redis), and a rerun under a new job name answered without a single
request, with real worker processes, while a changed setting misses it."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from swarm_queue.common.cache import CachedAnswer, answer_key, check_cache_spec, decode_answer
from swarm_queue.common.chat import Message
from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import Chat, Completion, JobSpec, PromptItem, Result, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.cache import CacheSize
from swarm_queue.producer.api import Swarm
from swarm_queue.producer.overview import read_overview
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.cache import AnswerCache
from tests.harness import (
    MAX_TOKENS,
    OVER_CONTEXT,
    Fleet,
    FleetFactory,
    check_output,
    fleet_prompt,
    wrong_key_endpoint,
)

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"job": "j", "model": "m", "params": GREEDY, "cache": True}
    return JobSpec(**(base | kw))


def test_the_key_covers_everything_that_determines_an_answer() -> None:
    item = PromptItem(0, "What is 2+2?")
    key = answer_key(_spec(), item)
    assert key is not None and len(key) == 40
    assert answer_key(_spec(job="other"), PromptItem(7, "What is 2+2?", "id-7")) == key
    changed = [
        _spec(model="m2"),
        _spec(params=SamplingParams(max_tokens=17, temperature=0.0)),
        _spec(params=SamplingParams(max_tokens=16, temperature=0.0, stop=["\n"])),
        _spec(params=SamplingParams(max_tokens=16, temperature=0.0, top_p=0.9)),
        _spec(params=SamplingParams(max_tokens=16, seed=1)),
        _spec(params=SamplingParams(max_tokens=16, temperature=0.0, seed=1)),
        _spec(request=Completion(template="<s>[INST] {prompt} [/INST]")),
        _spec(request=Completion(template="{prompt}")),  # the same text, without the BOS
        _spec(request=Chat()),
    ]
    keys = {answer_key(s, item) for s in changed}
    assert key not in keys and len(keys) == len(changed)
    assert answer_key(_spec(), PromptItem(0, "What is 2+3?")) != key
    # Two equal schemas written in another order are one request.
    a = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"a": 1, "b": 2}}}
    b = {"json_schema": {"schema": {"b": 2, "a": 1}, "name": "x"}, "type": "json_schema"}
    sa = _spec(params=SamplingParams(max_tokens=16, temperature=0.0, response_format=a))
    sb = _spec(params=SamplingParams(max_tokens=16, temperature=0.0, response_format=b))
    assert answer_key(sa, item) == answer_key(sb, item) != key
    # A conversation is keyed by its messages.
    chat = _spec(request=Chat())
    talk = PromptItem.of(0, (Message("system", "Be brief."), Message("user", "Hi")), None)
    other = PromptItem.of(0, (Message("system", "Be long."), Message("user", "Hi")), None)
    assert answer_key(chat, talk) != answer_key(chat, other)


def test_only_deterministic_requests_of_cached_jobs_with_a_model_are_cached() -> None:
    item = PromptItem(0, "hello")
    sampled = SamplingParams(max_tokens=16, temperature=0.7)
    assert answer_key(_spec(cache=False), item) is None
    assert answer_key(_spec(model=None), item) is None
    assert answer_key(_spec(params=sampled), item) is None
    assert answer_key(_spec(params=SamplingParams(max_tokens=16)), item) is None  # server default
    assert answer_key(_spec(params=sampled, cache_sampled=True), item) is not None
    # A prompt's own settings decide for it (an OpenAI batch line's).
    own = PromptItem(0, "hello", None, None, GREEDY)
    assert answer_key(_spec(params=sampled), own) is not None
    # One kept answer is one text: a line asking for several samples is never kept.
    seeded = SamplingParams(max_tokens=16, temperature=0.7, seed=1, n=3)
    assert answer_key(_spec(), PromptItem(0, "hello", None, None, seeded)) is None
    assert answer_key(_spec(params=seeded, cache_sampled=True), item) is None

    with pytest.raises(ConfigError, match=r"the cache needs a model \(--model NAME, or model=\)"):
        check_cache_spec(_spec(model=None))
    assert "sampled" in (check_cache_spec(_spec(params=sampled)) or "")
    assert check_cache_spec(_spec(params=sampled, cache_sampled=True)) is None
    assert check_cache_spec(_spec()) is None


def _answer(text: str) -> bytes:
    return msgspec.msgpack.encode(CachedAnswer(text, "stop", None, "m", "http://e"))


async def test_answers_expire_after_the_ttl_and_the_least_recently_used_go_past_the_cap(
    store: JobStore,
) -> None:
    await store.cache_put([("a", _answer("A")), ("b", _answer("B")), ("c", _answer("C"))], 60, 10)
    got = await store.cache_get(["a", "b", "c", "nope"], 60)
    assert [None if g is None else decode_answer(g).text for g in got] == ["A", "B", "C", None]
    # Last used: a long ago, b and c a little less.
    now = time.time()
    await store.redis.zadd(store.keys.cache_used, {"a": now - 100, "b": now - 50, "c": now - 40})
    assert await store.cache_get(["a"], 60) == [None]  # unused for 100 s > 60: expired
    assert not await store.redis.hexists(store.keys.cache_answers, "a")
    assert (await store.cache_get(["b"], 60))[0] is not None  # b is used now: c is the oldest
    evicted = await store.cache_put([("d", _answer("D"))], 60, 2)
    assert evicted == 1
    assert sorted(await store.redis.hkeys(store.keys.cache_answers)) == [b"b", b"d"]
    assert (await store.cache_size()).answers == 2
    assert await store.cache_clear() == 2
    assert (await store.cache_size()).answers == 0


async def test_a_failure_is_never_kept(store: JobStore, settings: Settings) -> None:
    cache = AnswerCache(store, settings, "http://e")
    spec = _spec()
    items = [(b"0-1", b"", PromptItem(0, "ok")), (b"0-2", b"", PromptItem(1, "too long"))]
    results = [
        Result(index=0, text="fine", finish_reason="stop", endpoint="http://e"),
        Result(index=1, error="prompt too long", error_kind="rejected", endpoint="http://e"),
    ]
    await cache.keep([answer_key(spec, item) for _, _, item in items], results)
    assert (await store.cache_size()).answers == 1
    hits, rest, _ = await cache.answered(spec, items)
    assert [(eid, r.text, r.cached, r.index) for eid, r, _ in hits] == [(b"0-1", "fine", True, 0)]
    assert [it.index for _, _, it in rest] == [1]


def _sent(fleet: Fleet) -> int:
    return fleet.answered(0) + fleet.answered(1)


def _run(fleet: Fleet, job: str, n: int, *args: str) -> None:
    """Queue ``job`` and drain it with a burst worker on both endpoints."""
    assert fleet.enqueue(job, n, set(), "--model", "swarm-sim", *args).wait(60) == 0
    worker = fleet.worker(f"w-{job}", [0, 1])
    assert worker.wait(120) == 0, fleet.logs[-1].read_text()


@pytest.mark.slow
async def test_a_rerun_under_a_new_job_sends_no_request_and_a_changed_setting_misses(
    fleet_factory: FleetFactory, store: JobStore, tmp_path: Path
) -> None:
    fleet = fleet_factory(2)
    n = 10_000
    await asyncio.to_thread(_run, fleet, "first", n, "--cache", "--temperature", "0")
    sent = _sent(fleet)
    assert sent >= n  # and a few speculative copies at its tail
    assert (await store.cache_size()).answers == n

    # The same prompts under another name: every one answered from the cache, none sent.
    # The worker serves Prometheus metrics, scraped before it exits.
    port = free_port()
    queued = fleet.enqueue(
        "again", n, set(), "--model", "swarm-sim", "--cache", "--temperature", "0"
    )
    assert await asyncio.to_thread(queued.wait, 60) == 0
    worker = fleet.worker("w-again", [0, 1], burst=False, SWARM_METRICS_PORT=str(port))
    deadline = time.monotonic() + 120
    while not (await store.status("again")).finished:
        assert time.monotonic() < deadline and worker.poll() is None, "never finished"
        await asyncio.sleep(0.05)
    page = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    worker.terminate()
    assert await asyncio.to_thread(worker.wait, 60) == 0
    hits = sum(
        s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == "swarm_cache_hits_total" and s.labels["job"] == "again"
    )
    assert hits == n
    assert _sent(fleet) == sent  # not one request more
    again = await store.status("again")
    assert (again.done, again.failed, again.cache_hits) == (n, 0, n)
    lines = [msgspec.json.decode(x) for x in await _lines(fleet, "again")]
    assert [x["index"] for x in lines] == list(range(n))
    assert all(x["cached"] is True for x in lines)
    assert [x["text"] for x in lines[:3]] == [
        completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0] for i in range(3)
    ]

    # One setting changed (max tokens), or no --cache at all: every prompt is sent again.
    await asyncio.to_thread(
        _run, fleet, "longer", 1000, "--cache", "--temperature", "0", "--max-tokens", "13"
    )
    assert _sent(fleet) - sent >= 1000
    sent = _sent(fleet)
    assert (await store.status("longer")).cache_hits == 0
    await asyncio.to_thread(_run, fleet, "uncached", 1000, "--temperature", "0")
    assert _sent(fleet) - sent >= 1000
    assert (await store.status("uncached")).cache_hits == 0
    assert (await store.cache_size()).answers == n + 1000  # the uncached job kept nothing


async def _lines(fleet: Fleet, job: str, expect: int = 0) -> list[bytes]:
    """The job's collected lines; ``expect``: swarm-collect's exit status (1: some failed)."""
    proc = fleet.collect(job)
    _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == expect, err
    return (await asyncio.to_thread((fleet.tmp / f"{job}.jsonl").read_bytes)).splitlines()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def test_the_python_api_caches_across_jobs_and_refuses_what_it_cannot_cache(
    redis_url: str,
    prefix: str,
    sim_fleet: Callable[..., SimFleet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    texts = [f"Name the capital of country {i}." for i in range(200)]
    fleet = sim_fleet(2)
    # No speculative copies at a job's tail: one may still be answered after a job's last
    # commit, a request the count below would take for one the cache failed to spare.
    async with (
        fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50, speculate=False) as swarm,
    ):
        with pytest.raises(ConfigError, match=r"the cache needs a model \(--model NAME, or"):
            await swarm.submit(texts, cache=True, temperature=0)
        with pytest.raises(
            ConfigError, match="job settings: Object contains unknown field `tempreature`"
        ):
            # (A type checker refuses it too: the settings are typed.)
            await swarm.submit(texts, cache=True, model="swarm-sim", tempreature=0)  # type: ignore[call-arg]
        # Sampled: a warning, as from swarm-enqueue (the same rule), and nothing kept.
        with caplog.at_level(logging.WARNING, "swarm"):
            sampled = await swarm.gather(
                await swarm.submit(texts[:10], max_tokens=8, model="swarm-sim", cache=True)
            )
        assert "--cache keeps deterministic answers only" in caplog.text
        assert len(sampled) == 10 and await swarm.store.cache_size() == CacheSize(0, 0)
        first = await swarm.gather(
            await swarm.submit(texts, max_tokens=8, model="swarm-sim", seed=7, cache=True)
        )
        sent = sum(e.requests_total for e in fleet.endpoints)
        again = await swarm.gather(
            await swarm.submit(texts, max_tokens=8, model="swarm-sim", seed=7, cache=True)
        )
        assert sum(e.requests_total for e in fleet.endpoints) == sent
    assert [r.text for r in again] == [r.text for r in first]
    assert [r.text for r in first] == [completion_for(t, 8)[0] for t in texts]
    assert all(r.cached for r in again) and not any(r.cached for r in first)


async def test_a_value_that_is_not_an_answer_is_a_miss_and_is_replaced(
    store: JobStore, settings: Settings
) -> None:
    cache = AnswerCache(store, settings, "http://e")
    spec = _spec()
    items = [(b"0-1", b"", PromptItem(0, "hello"))]
    key = answer_key(spec, items[0][2])
    assert key is not None
    await store.cache_put([(key, b"\xc1 not msgpack")], 60, 10)
    hits, rest, keys = await cache.answered(spec, items)
    assert (hits, rest) == ([], items)
    await cache.keep(keys, [Result(index=0, text="hi", finish_reason="stop")])
    hits, _, _ = await cache.answered(spec, items)
    assert [r.text for _, r, _ in hits] == ["hi"]


@pytest.mark.slow
def test_jobs_sharing_the_cache_and_the_fleet_at_once_each_get_every_answer_once(
    fleet_factory: FleetFactory, redis_url: str, prefix: str
) -> None:
    """Three jobs at once on one fleet: two with --cache whose prompts overlap (the second
    holds all of the first's and more, over-long ones among them), one without. Every job gets
    every answer in order; the cache holds each distinct answer once and no failure."""
    fleet = fleet_factory(2)
    poison = {5, 4500}
    queued = [
        fleet.enqueue("a", 4000, poison, "--model", "swarm-sim", "--temperature", "0", "--cache"),
        fleet.enqueue("b", 6000, poison, "--model", "swarm-sim", "--temperature", "0", "--cache"),
        fleet.enqueue("c", 2000, poison, "--model", "swarm-sim", "--temperature", "0"),
    ]
    assert [q.wait(60) for q in queued] == [0, 0, 0]
    workers = [fleet.worker("w0", [0]), fleet.worker("w1", [1])]
    assert [w.wait(120) for w in workers] == [0, 0], [log.read_text() for log in fleet.logs]
    for job, n in (("a", 4000), ("b", 6000), ("c", 2000)):
        proc = fleet.collect(job)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err  # 1: some prompts failed (the over-long ones)
        check_output(fleet.tmp / f"{job}.jsonl", n, {i for i in poison if i < n})
    client = redis.Redis.from_url(redis_url)
    try:
        kept = client.hlen(f"{prefix}:{{~cache}}:answers")
        hits = {j: int(client.hget(f"{prefix}:{{{j}}}:meta", "cache_hits") or 0) for j in "abc"}
    finally:
        client.close()
    assert kept == 6000 - len(poison)  # a's and b's distinct answers, once; no failure
    assert hits["c"] == 0 and hits["a"] + hits["b"] <= 4000 - 1  # only the overlap can hit


@pytest.mark.slow
async def test_the_shared_case_two_models_a_broken_endpoint_and_a_job_nobody_serves(
    fleet_factory: FleetFactory, store: JobStore, redis_url: str
) -> None:
    """One fleet and one cache for several jobs: two models, one job for a model nobody
    serves, an endpoint with a wrong key. A rerun for model A is answered from the cache (its
    over-long prompt sent and refused again); the same prompts for model B hit nothing of
    A's; the unserved job waits; the dashboard's board shows each as Redis holds it."""
    n, poison = 3000, {5}
    fleet = fleet_factory(3, "--model", "model-a,model-a,model-b")
    cache = ("--temperature", "0", "--cache")

    def queue(job: str, model: str) -> None:
        assert fleet.enqueue(job, n, poison, "--model", model, *cache).wait(60) == 0

    with wrong_key_endpoint() as locked:
        await asyncio.to_thread(queue, "a1", "model-a")
        first = fleet.worker("w1", [0, 1], SWARM_ENDPOINTS=f"{fleet.url(0)},{locked}")
        assert await asyncio.to_thread(first.wait, 120) == 1  # its broken endpoint
        sent_a = fleet.answered(0)
        for job, model in (("c", "model-c"), ("a2", "model-a"), ("b", "model-b")):
            await asyncio.to_thread(queue, job, model)
        urls = ",".join([fleet.url(0), locked, fleet.url(1), fleet.url(2)])
        worker = fleet.worker("w2", [0, 1, 2], burst=False, SWARM_ENDPOINTS=urls)
        try:
            deadline = time.monotonic() + 120
            while not all([(await store.status(j)).finished for j in ("a2", "b")]):
                assert time.monotonic() < deadline and worker.poll() is None, "never finished"
                await asyncio.sleep(0.05)
            board = await read_overview(store, redis_url)
            status = {j: await store.status(j) for j in ("a1", "a2", "b", "c")}
        finally:
            worker.terminate()
            await asyncio.to_thread(worker.wait, 60)

    for job in ("a1", "a2", "b"):
        lines = [msgspec.json.decode(x) for x in await _lines(fleet, job, expect=1)]
        assert [x["index"] for x in lines] == list(range(n))
        assert {x["index"] for x in lines if x["error"] is not None} == poison
        # The over-long prompt was sent again and refused again by the server: never cached.
        assert lines[5]["error"].startswith(OVER_CONTEXT)
    assert (status["a2"].done, status["a2"].cache_hits) == (n - 1, n - 1)
    assert status["b"].cache_hits == 0 and status["b"].done == n - 1
    assert fleet.answered(0) + fleet.answered(1) == sent_a  # a2: not one sequence generated
    assert fleet.answered(2) >= n - 1  # b: every answer from model B's endpoint
    assert (status["c"].done, status["c"].pending) == (0, n)

    rows = {row.job: row for row in board.jobs}
    assert {j: rows[j].state for j in rows} == {
        "a1": "finished", "a2": "finished", "b": "finished", "c": "waiting",
    }  # fmt: skip
    for job, s in status.items():
        assert (rows[job].done, rows[job].failed, rows[job].cache_hits) == (
            s.done, s.failed, s.cache_hits
        )  # fmt: skip
    circuits = {e.endpoint: e.circuit for e in board.endpoints if e.worker == "w2"}
    assert circuits[locked] == "broken"
    assert [circuits[fleet.url(i)] for i in range(3)] == ["closed"] * 3
