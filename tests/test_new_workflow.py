"""A new workflow is one folder and one line in flows/registry.py: the toy workflow of
tests/toyflow/, which the product has never seen, registered by that one line, runs on a
worker as the product's own do: every answer moved on once, its next step answered and
sealed, the worker's burst ended."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarm_queue.common.keys import step_name
from swarm_queue.common.models import decode_result
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows import registry
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.helpers import prompts, run_engine
from tests.toyflow.flow import ReverseFlow, reverse_specs, reversed_words


@pytest.fixture
def reverse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy workflow registered, as a new one is: one line in flows/registry.py."""
    monkeypatch.setattr(registry, "FLOWS", (*registry.FLOWS, ReverseFlow))


async def test_a_toy_workflow_registered_by_one_line_runs_every_answer_on_and_ends(
    reverse: None, settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    n = 40
    first, then = reverse_specs("t")
    await store.create_job(then)
    inputs = list(prompts(n))
    await enqueue_prompts(store, first, inputs)
    async with sim_fleet(2) as fleet:
        await run_engine(settings, store, fleet.urls)  # a burst: returns once nothing is left

    later = step_name("t", 1)
    status = await store.status(later)
    assert (status.total, status.done, status.failed, status.finished) == (n, n, 0, True)
    fed = {int(k): int(v) for k, v in (await store.redis.hgetall(store.keys.fed(later))).items()}
    assert sorted(fed) == list(range(n)) and sorted(fed.values()) == list(range(n))
    answers = await store.redis.hgetall(store.keys.results(later))
    for origin, (prompt, _) in enumerate(inputs):
        answer = completion_for(prompt, 256)[0]
        want = reversed_words(answer)
        got = decode_result(answers[str(fed[origin]).encode()])
        assert got.text == completion_for(want, 256)[0], origin
