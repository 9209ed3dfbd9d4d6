"""swarm-sim charges prefill as vLLM's engine does (chunked prefill): one rule a test. Each
step processes at most ``max_num_batched_tokens`` tokens, one for each decoding sequence first,
then chunks of the prompts still to prefill, oldest first; cached leading blocks cost nothing;
the step that ends a prompt's prefill samples its first token; a step's time grows with the
tokens it prefills; with no prefill cost set, prefill is free and the engine is as before."""

from __future__ import annotations

import asyncio

import pytest

from swarm_queue.sim.engine import EngineConfig, SimEngine
from swarm_queue.sim.prefix import BLOCK_CHARS, PrefixCache

CHARGED = EngineConfig(max_num_seqs=4, max_num_batched_tokens=100, prefill_ms_per_token=0.01)


def steps_until(engine: SimEngine, done: asyncio.Future[None]) -> int:
    n = 0
    while not done.done():
        engine.step()
        n += 1
    return n


async def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks_over_several_steps() -> None:
    engine = SimEngine(CHARGED)
    done = engine.submit([1], [250])  # 100 + 100 + 50 tokens of prompt, then its one token
    assert steps_until(engine, done) == 3
    assert engine.prefilled_tokens == 250


async def test_the_step_that_ends_a_prefill_samples_the_first_token() -> None:
    engine = SimEngine(CHARGED)
    done = engine.submit([3], [100])  # one step of prefill and the first token, two more
    assert steps_until(engine, done) == 3
    assert engine.generated_tokens == 3


async def test_decoding_sequences_take_their_token_of_the_budget_before_any_prefill() -> None:
    engine = SimEngine(CHARGED)
    engine.submit([50, 50, 50], [1, 1, 1])  # three decoding for a while
    engine.step()
    assert engine.num_running == 3
    before = engine.prefilled_tokens
    engine.submit([1], [200])
    engine.step()  # 100 tokens: 3 of them decode, 97 prefill
    assert engine.prefilled_tokens - before == 97


async def test_a_new_sequence_waits_while_the_step_has_no_budget_left_for_it() -> None:
    engine = SimEngine(CHARGED)
    engine.submit([1], [300])
    engine.submit([1], [10])
    engine.admit()
    # The first prompt's 300 tokens take this step's whole budget: vLLM leaves the second
    # waiting (its gauges show it so), though a slot is free.
    assert (engine.num_running, engine.num_waiting) == (1, 1)


async def test_a_step_costs_its_prefilled_tokens_on_top_of_its_running_sequences() -> None:
    c = EngineConfig(step_base_ms=10, step_per_seq_ms=0.5, prefill_ms_per_token=0.02, speed=2)
    assert c.step_s(4, 1000) == pytest.approx((10 + 2 + 20) / 1000 / 2)


async def test_a_wholly_cached_prompt_computes_its_last_token_alone() -> None:
    cache = PrefixCache()
    prompt = "x" * (BLOCK_CHARS * 8)
    assert cache.lookup(prompt) == 128  # every token computed
    assert cache.lookup(prompt) == 0  # every block cached
    engine = SimEngine(CHARGED)
    done = engine.submit([1], [cache.lookup(prompt)])
    assert steps_until(engine, done) == 1 and engine.prefilled_tokens == 1


async def test_with_no_prefill_cost_the_prompt_is_free_and_decoding_starts_at_admission() -> None:
    engine = SimEngine(EngineConfig(max_num_seqs=4, max_num_batched_tokens=100))
    done = engine.submit([2], [10_000])
    assert steps_until(engine, done) == 2 and engine.prefilled_tokens == 0


def test_the_budget_is_refused_below_max_num_seqs_with_vllms_words() -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8\) must be greater than or "):
        EngineConfig(max_num_seqs=16, max_num_batched_tokens=8)
