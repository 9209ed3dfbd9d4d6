"""An honest response cache: answers an endpoint got wrong for a while can be asked again
(`swarm-retry --uncached`, `--indexes`, `swarm-enqueue --refresh`) and purged by endpoint and
time (`swarm-jobs --clear-cache --endpoint URL --since T`); only complete answers are kept, each
with the endpoint and the time it came from. Real Redis, the engine in this process, the
commands as real processes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from aiohttp import web

from swarm_queue.common.cache import decode_answer
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import BIN
from tests.helpers import collect_lines, run_engine, serve

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
PROMPTS = [f"Name gene number {i}." for i in range(10)]


def _wrong_app() -> tuple[web.Application, list[int]]:
    """A bad deployment: a wrong answer to every prompt, an empty one to prompt 3."""
    calls: list[int] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        ps = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        calls.append(len(ps))
        choices = [
            {"index": i, "text": "" if p == PROMPTS[3] else f"WRONG {p}", "finish_reason": "stop"}
            for i, p in enumerate(ps)
        ]
        return web.json_response({"model": "m", "choices": choices})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app, calls


def _sh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / args[0], *args[1:]], env=env, capture_output=True, text=True, timeout=60
    )


async def _job(store: JobStore, name: str, **kw: Any) -> None:
    spec = JobSpec(job=name, model="m", params=GREEDY, cache=True, **kw)
    await enqueue_prompts(store, spec, [(p, None) for p in PROMPTS])


async def _kept(store: JobStore) -> dict[str, str]:
    """What the cache keeps: the text of each answer, by the endpoint it came from."""
    raw = await store.redis.hgetall(store.keys.cache_answers)
    return {decode_answer(v).text: decode_answer(v).endpoint for v in raw.values()}


async def test_wrong_answers_kept_by_the_cache_are_asked_again_replaced_and_purged(
    make_settings: Callable[..., Settings],
    store: JobStore,
    sim_fleet: Callable[..., SimFleet],
    cli_env: dict[str, str],
) -> None:
    settings = make_settings()
    right = [completion_for(p, 16)[0] for p in PROMPTS]
    wrong_app, wrong_calls = _wrong_app()
    async with serve(wrong_app) as bad, sim_fleet(1, model="m") as fleet:
        good = fleet.urls[0]
        await _job(store, "a")
        await run_engine(settings, store, [bad])
        kept = await _kept(store)
        # Nine wrong answers kept, from the bad endpoint; the empty one never.
        assert sorted(kept) == sorted(f"WRONG {p}" for i, p in enumerate(PROMPTS) if i != 3)
        assert set(kept.values()) == {bad}
        times = [
            decode_answer(v).cached_s
            for v in (await store.redis.hgetall(store.keys.cache_answers)).values()
        ]
        now = await store.server_time()
        assert all(now - 60 < t <= now for t in times)

        await _job(store, "b")  # the same prompts: nine answered (wrongly) from the cache
        await run_engine(settings, store, [good])
        lines = await collect_lines(store, "b")
        assert [x.get("cached", False) for x in lines] == [i != 3 for i in range(10)]

        some = _sh(cli_env, "swarm-retry", "b", "--indexes", "0-1,3")
        assert some.returncode == 0, some.stderr
        assert some.stdout == "job b: 2 prompts queued again (from the cache 2)\n"
        assert "1 of the given indexes kept no entry to queue again" in some.stderr
        await run_engine(settings, store, [good])
        texts = [x["text"] for x in await collect_lines(store, "b")]
        fixed = {0, 1, 3}
        assert texts == [right[i] if i in fixed else f"WRONG {p}" for i, p in enumerate(PROMPTS)]

        rest = _sh(cli_env, "swarm-retry", "b", "--uncached")
        assert rest.stdout == "job b: 7 prompts queued again (from the cache 7)\n", rest.stderr
        await run_engine(settings, store, [good])
        lines = await collect_lines(store, "b")
        assert [x["text"] for x in lines] == right
        status = await store.status("b")
        assert (status.done, status.failed, status.cache_hits) == (10, 0, 0)
        assert await _kept(store) == dict.fromkeys(right, good)  # every wrong one replaced

        # The bad deployment again, for a job that refreshes: asked again, kept again.
        before = sum(wrong_calls)
        await _job(store, "c", cache_refresh=True)
        await run_engine(settings, store, [bad])
        assert sum(wrong_calls) - before == 10  # not one answered from the cache
        assert sum(1 for e in (await _kept(store)).values() if e == bad) == 9

        purge = _sh(
            cli_env, "swarm-jobs", "--clear-cache", "--endpoint", bad + "/", "--since", "10m"
        )
        assert purge.returncode == 0, purge.stderr
        assert purge.stdout.startswith(f"response cache: 9 answers from {bad} kept since ")
        assert await _kept(store) == {right[3]: good}

        await _job(store, "d")
        await run_engine(settings, store, [good])
        lines = await collect_lines(store, "d")
        assert [x["text"] for x in lines] == right
        assert [x.get("cached", False) for x in lines] == [i == 3 for i in range(10)]

    too_early = _sh(cli_env, "swarm-jobs", "--clear-cache", "--until", "2020-01-01T00:00")
    assert too_early.stdout == "response cache: 0 answers before 2020-01-01 00:00:00 UTC deleted\n"
    bad_time = _sh(cli_env, "swarm-jobs", "--clear-cache", "--since", "yesterday")
    assert bad_time.returncode == 2 and "'yesterday' is neither a time" in bad_time.stderr
