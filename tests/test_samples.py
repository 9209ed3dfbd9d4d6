"""Several samples per prompt and what is made of them per prompt: vLLM's ``n`` mapped by
choice index (prompt i's sample j at i * n + j), the vote, and the two uncertainty measures
against values computed by hand."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import replace

import pytest

from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.perprompt import (
    PER_PROMPT_KINDS,
    cluster,
    kernel_entropy,
    semantic_entropy,
    vote,
)
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.flows.pipeline.spec import build_pipeline, enqueue_pipeline
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet
from swarm_queue.sim.text import embedding_for, sample_for
from tests.helpers import collect_lines, output_lines, prompts, run_engine

FAST = EngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0)


def test_a_vote_takes_the_majority_and_breaks_ties_by_the_first_sample() -> None:
    assert vote(["Yes.", "no", " yes", "maybe"]) == {
        "answer": "Yes.",
        "votes": 2,
        "share": 0.5,
        "distinct": 3,
    }
    assert vote(["b", "a", "a", "b"])["answer"] == "b"  # 2 to 2: b was sampled first


def test_semantic_entropy_of_clusters_known_by_hand() -> None:
    same, other = [1.0, 0.0], [0.0, 1.0]
    two_and_two = semantic_entropy(["a", "b", "c", "d"], [same, other, same, other])
    assert two_and_two["clusters"] == [[0, 2], [1, 3]]
    assert math.isclose(two_and_two["entropy"], math.log(2))
    three_and_one = semantic_entropy(["a", "b", "c", "d"], [same, same, other, same])
    assert three_and_one["answer"] == "a" and three_and_one["share"] == 0.75
    assert math.isclose(three_and_one["entropy"], -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert semantic_entropy(["x", "y"], [same, [2.0, 0.0]])["entropy"] == 0.0  # one meaning
    # Average linkage: [0.95, 0.31] joins [1, 0] at 0.95, not at 0.9 with the lower threshold
    near = [0.95, math.sqrt(1 - 0.95**2)]
    assert cluster([same, near, other], 0.9) == [[0, 1], [2]]
    assert cluster([same, near, other], 0.96) == [[0], [1], [2]]


def test_kernel_entropy_known_by_hand() -> None:
    same, other = [1.0, 0.0], [0.0, 1.0]
    assert math.isclose(kernel_entropy(list("abcd"), [same] * 4)["entropy"], 0.0, abs_tol=1e-9)
    # Two pairs of identical answers, the pairs orthogonal: eigenvalues 1/2, 1/2.
    assert math.isclose(
        kernel_entropy(list("abcd"), [same, same, other, other])["entropy"], math.log(2)
    )
    # Three orthogonal answers: K / tr K = I / 3, entropy log 3.
    three = [[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]
    assert math.isclose(kernel_entropy(list("abc"), three)["entropy"], math.log(3))


def test_sampling_settings_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="--per-prompt vote needs --samples 2 or more"):
        build_spec("j", JobOptions(per_prompt="vote"), source="t")
    with pytest.raises(ConfigError, match="unknown per-prompt reduce 'mode'"):
        build_spec("j", JobOptions(samples=3, per_prompt="mode"), source="t")
    with pytest.raises(ConfigError, match="name the embeddings model"):
        build_spec("j", JobOptions(samples=3, per_prompt="semantic-entropy"), source="t")
    with pytest.raises(ConfigError, match=r"samples \(n\) must be 1\.\.256, got 0"):
        build_spec("j", JobOptions(samples=0), source="t")
    with pytest.raises(ConfigError, match="not with --samples"):
        build_spec("j", JobOptions(samples=3, cache=True, model="m", seed=1), source="t")


@pytest.mark.parametrize("chat", [False, True])
async def test_samples_come_back_mapped_by_index_and_voted_per_prompt(
    settings: Settings, store: JobStore, sim_fleet: Callable[..., SimFleet], chat: bool
) -> None:
    n, k = 120, 5
    spec, _ = build_spec(
        "s",
        JobOptions(max_tokens=6, samples=k, temperature=0.8, per_prompt="vote", chat=chat),
        source="t",
    )
    await enqueue_prompts(store, spec, prompts(n))
    async with sim_fleet(2) as fleet:
        await run_engine(settings, store, fleet.urls)
    lines = await collect_lines(store, "s")
    assert [x["index"] for x in lines] == list(range(n))
    for x, (prompt, _) in zip(lines, prompts(n), strict=True):
        seen = prompt if not chat else f"<|user|>\n{prompt}\n<|assistant|>\n"
        want = [sample_for(seen, 6, j)[0] for j in range(k)]
        if chat:
            want = [w.lstrip() for w in want]
        assert x["samples"] == want, x["index"]
        assert x["value"] == vote(want) and x["text"] == vote(want)["answer"]
    assert {x["value"]["distinct"] for x in lines} <= {2, 3}  # samples agree in part


@pytest.mark.parametrize("kind", ["semantic-entropy", "kernel-entropy"])
async def test_an_uncertainty_measure_embeds_each_prompts_samples_on_the_fleet(
    settings: Settings, store: JobStore, kind: str
) -> None:
    n, k = 150, 6
    options = JobOptions(
        model="writer",
        max_tokens=8,
        samples=k,
        temperature=0.7,
        per_prompt=kind,
        per_prompt_model="embedder",
        similarity=0.8,
    )
    specs, _ = build_pipeline("u", options, [], source="t")
    assert [(s.job, s.embed, s.model) for s in specs] == [
        ("u", False, "writer"),
        ("u:s1", True, "embedder"),
    ]
    await enqueue_pipeline(store, specs, prompts(n))
    fleet = SimFleet(
        [
            SimEndpoint(free_port(), FAST, model="writer"),
            SimEndpoint(free_port(), FAST, model="embedder"),
        ]
    )
    async with fleet:
        await run_engine(settings, store, fleet.urls)
    chains = await output_lines(store, "u")
    assert [c.index for c in chains] == list(range(n))
    entropies = set()
    for c, (prompt, _) in zip(chains, prompts(n), strict=True):
        samples = [sample_for(prompt, 8, j)[0] for j in range(k)]
        # (as the engine sends them: float32 values, as vLLM's)
        vectors = [array("f", embedding_for(s)).tolist() for s in samples]
        if kind == "semantic-entropy":
            want = semantic_entropy(samples, vectors, similarity=0.8)
        else:
            want = kernel_entropy(samples, vectors)
        sampled, measured = c.steps
        assert sampled.samples == samples and measured.samples == samples
        assert measured.value == want and c.text == want["answer"], c.index
        entropies.add(round(want["entropy"], 6))
    assert len(entropies) > 2  # the measure tells prompts apart
    # Each embeddings request held the samples of several prompts.
    assert max(len(body["input"]) for body in fleet.endpoints[1].received) > k


async def test_a_measure_the_workers_cannot_compute_fails_its_prompts_saying_why(
    settings: Settings, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_numpy(*_: object, **__: object) -> dict[str, object]:
        raise ModuleNotFoundError("No module named 'numpy'")

    kind = PER_PROMPT_KINDS["semantic-entropy"]
    monkeypatch.setitem(PER_PROMPT_KINDS, "semantic-entropy", replace(kind, fn=no_numpy))
    options = JobOptions(
        max_tokens=6, samples=3, temperature=0.5, per_prompt="semantic-entropy",
        per_prompt_model="swarm-sim",
    )  # fmt: skip
    specs, _ = build_pipeline("m", options, [], source="t")
    await enqueue_pipeline(store, specs, prompts(20))
    async with SimFleet([SimEndpoint(free_port(), FAST)]) as fleet:
        await run_engine(settings, store, fleet.urls)
    chains = await output_lines(store, "m")
    assert len(chains) == 20
    for c in chains:
        assert c.stopped_at == 1 and c.steps[1].error_kind == "measure"
        assert c.error == (
            "step 1 failed: semantic-entropy needs numpy on the workers "
            "(pip install 'swarm-queue[uq]'): No module named 'numpy'"
        )
