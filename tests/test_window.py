"""The adaptive in-flight window: reading vLLM's gauges, the policy, the gate, and the effect
on a real (simulated) engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypedDict

from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient, parse_load
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.replies import Load
from swarm_queue.worker.window import Window, follow_load, next_window
from tests.helpers import collect_lines, prompts, spec


class _Limits(TypedDict):
    """The window's bounds and batch size, as next_window takes them."""

    lo: int
    hi: int
    batch: int


class _Bounds(_Limits):
    """The keyword arguments of next_window a test holds fixed."""

    busy: bool


VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 200.0
vllm:num_requests_running{engine="1",model_name="m"} 56.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
"""


def test_gauges_are_summed_over_label_sets_and_missing_ones_mean_no_load() -> None:
    assert parse_load(VLLM_METRICS) == Load(running=256.0, waiting=3.0)
    assert parse_load(b"vllm:num_requests_running 1\n") is None
    assert parse_load(b"<html>not found</html>") is None


def test_policy_grows_when_idle_sheds_half_the_surplus_queue_and_stays_in_bounds() -> None:
    kw = _Bounds(busy=True, lo=2, hi=20, batch=32)
    assert next_window(10, Load(running=180, waiting=0), **kw) == 11  # idle slots
    assert next_window(10, Load(running=256, waiting=32), **kw) == 10  # full, one batch waits
    assert next_window(10, Load(running=256, waiting=40), **kw) == 9  # more: 1 surplus
    assert next_window(10, Load(running=256, waiting=130), **kw) == 8  # 4 surplus: shed 2
    assert next_window(16, Load(running=256, waiting=256), **kw) == 13  # 8 batches: 7 surplus
    assert next_window(20, Load(running=100, waiting=0), **kw) == 20
    assert next_window(3, Load(running=256, waiting=500), **kw) == 2


def test_shedding_counts_the_surplus_from_the_batches_still_in_flight() -> None:
    kw = _Bounds(busy=True, lo=2, hi=20, batch=32)
    # 4 in flight, 2 batches waiting: one surplus batch, so 3; a window already cut to 3 while
    # the 4th is still in flight is not cut again for the same queue.
    assert next_window(4, Load(running=64, waiting=64), in_use=4, **kw) == 3
    assert next_window(3, Load(running=64, waiting=64), in_use=4, **kw) == 3
    assert next_window(3, Load(running=64, waiting=64), in_use=3, **kw) == 2


async def test_past_the_ramp_the_window_grows_only_on_nothing_waiting_seen_twice(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    settings = make_settings(inflight=4, inflight_max=32, adapt_period_s=0.01)
    engine = Engine(settings, store, [EndpointClient("http://127.0.0.1:9")])
    window = engine.drainers[0].window
    # A queue ends the ramp; then one gap (two batches ending together, their successors on
    # their way), one batch waiting again, and idle slots seen on two looks running.
    looks = [
        Load(running=64, waiting=32),
        Load(running=32, waiting=0),
        Load(running=64, waiting=32),
        Load(running=32, waiting=0),
        Load(running=32, waiting=0),
    ]
    sizes: list[int] = []

    async def load(timeout_s: float = 5.0) -> Load | None:
        sizes.append(window.size)
        return looks.pop(0) if looks else None  # then no gauges: the loop ends

    async def busy(seconds: float) -> bool:
        window.in_use = window.size  # every slot of the window has a batch in flight
        return False

    engine.drainers[0].client.load = load  # type: ignore[method-assign]
    try:
        await window.resize(3)
        await follow_load(
            window,
            load,
            answered=lambda: 0,
            in_flight=lambda: window.in_use,
            sleep=busy,
            hi=32,
            settings=settings,
            label="e",
        )
        assert sizes[:6] == [3, 3, 3, 3, 3, 4]
    finally:
        await engine.close()


def test_policy_doubles_while_ramping_up() -> None:
    kw = _Bounds(busy=True, lo=2, hi=32, batch=32)
    sizes = [2]
    while sizes[-1] < 32:
        sizes.append(next_window(sizes[-1], Load(running=1, waiting=0), ramping=True, **kw))
    assert sizes == [2, 4, 8, 16, 32]
    # a queue ends the ramp
    assert next_window(16, Load(running=256, waiting=256), ramping=True, **kw) == 13


def test_policy_does_not_grow_for_a_stalled_engine_or_an_unused_window() -> None:
    kw = _Limits(lo=2, hi=64, batch=32)
    assert next_window(16, Load(running=0, waiting=0), busy=True, **kw) == 16  # stalled
    # ... unless results keep coming: an engine faster than its gauges can show
    assert next_window(16, Load(running=0, waiting=0), busy=True, answering=True, **kw) == 17
    assert next_window(16, Load(running=90, waiting=0), busy=False, **kw) == 16  # no work
    assert next_window(16, Load(running=256, waiting=99), busy=False, **kw) == 15


async def test_window_gate_admits_at_most_size_and_follows_a_resize() -> None:
    window = Window(2)
    inside = 0
    peak = 0
    release = asyncio.Event()

    async def hold() -> None:
        nonlocal inside, peak
        async with window.token():
            inside += 1
            peak = max(peak, inside)
            await release.wait()
            inside -= 1

    tasks = [asyncio.create_task(hold()) for _ in range(5)]
    while window.in_use < 2:  # noqa: ASYNC110 - waiting for the tasks to reach the gate
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    assert (window.in_use, peak) == (2, 2)
    await window.resize(4)
    while window.in_use < 4:  # noqa: ASYNC110
        await asyncio.sleep(0)
    assert peak == 4
    release.set()
    await asyncio.gather(*tasks)
    assert window.in_use == 0


async def test_an_underfed_engine_gets_more_batches_in_flight(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    # Enough work that the job cannot end, on a machine however loaded, before the window
    # has opened (a minute of it at the starting window); stopped once it has.
    n = 6000
    await enqueue_prompts(store, spec(max_tokens=32), prompts(n))
    settings = make_settings(batch_size=8, inflight=2, inflight_max=32, adapt_period_s=0.05)
    cfg = EngineConfig(max_num_seqs=64, step_base_ms=5.0, step_per_seq_ms=0.0)
    async with sim_fleet(1, cfg) as fleet:
        sim = fleet.endpoints[0].engine
        engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
        window = engine.drainers[0].window
        sizes: list[int] = []
        resize = window.resize

        async def noted(size: int) -> None:
            sizes.append(size)
            await resize(size)

        window.resize = noted  # type: ignore[method-assign]
        run = asyncio.create_task(engine.run(burst=True))
        try:
            # 2 batches of 8 leave most of the 64 slots idle; the window must open up to the 8
            # batches that fill the engine. (The sizes it took, not a poll of it or of the
            # engine's running count: on a loaded machine all 8 batches are seldom inside the
            # engine at one moment, and a poll missed the moments they were.)
            while max(sizes, default=0) < 8:
                assert not run.done(), sizes
                await asyncio.sleep(0.01)
            # Then more than the starting window's 2 batches run at once: the batches the wider
            # window lets out reach the engine after it opened (on a loaded machine the peak at
            # the moment it opened was still 16), and before the job could end.
            while sim.peak_running <= 16:
                assert not run.done(), (sizes, sim.peak_running)
                await asyncio.sleep(0.01)
            peak = sim.peak_running
            engine.request_stop()
            await run
        finally:
            await engine.close()
    # The answers in so far, each its own prompt's: at least every sequence that ran at the peak,
    # since batches in flight finish and commit on a stop (the window can reach 8 while only a
    # few batches have landed: seen 32 answers on a loaded CI).
    lines = await collect_lines(store, "j")
    asked = list(prompts(n))
    assert len(lines) >= peak
    assert [x["text"] for x in lines] == [
        completion_for(asked[x["index"]][0], 32)[0] for x in lines
    ]


async def test_without_gauges_the_adaptive_window_falls_back_to_the_fixed_one(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    settings = make_settings(inflight=12, inflight_max=32, adapt_period_s=0.01)
    engine = Engine(settings, store, [EndpointClient("http://127.0.0.1:9")])
    drainer = engine.drainers[0]
    reads = 0

    async def no_gauges(timeout_s: float = 5.0) -> Load | None:
        nonlocal reads
        reads += 1
        return None

    drainer.client.load = no_gauges  # type: ignore[method-assign]
    try:
        await drainer.window.resize(2)
        await asyncio.wait_for(drainer._adapt(32), timeout=10)
        assert (reads, drainer.window.size) == (3, 12)
    finally:
        await engine.close()


async def test_with_no_request_in_flight_the_gauges_are_read_every_eighth_period(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(inflight=4, inflight_max=32, adapt_period_s=0.01)
    window = Window(2)
    window.in_use = 1  # a slot polling Redis for work holds a token: that is no request
    reads: list[int] = []  # the tick of each read
    ticks = requests = 0

    async def load(timeout_s: float = 5.0) -> Load | None:
        reads.append(ticks)
        return Load(running=0, waiting=0)

    async def tick(seconds: float) -> bool:
        nonlocal ticks, requests
        ticks += 1
        if ticks == 24:
            requests = 1  # a batch sent: every period looks again
        return ticks >= 28

    await follow_load(
        window,
        load,
        answered=lambda: 0,
        in_flight=lambda: requests,
        sleep=tick,
        hi=32,
        settings=settings,
        label="e",
    )
    assert reads == [7, 15, 23, 24, 25, 26, 27]
