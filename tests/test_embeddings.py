"""Embeddings jobs against real Redis and simulated endpoints: list requests to
``/v1/embeddings`` on the endpoints serving the job's model only, vectors in input order and
mapped by index, an over-long input failing alone, JSON Lines and Parquet (list<float32>)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.jobspec import JobOptions, build_spec
from swarm_queue.common.models import JobSpec, SamplingParams
from swarm_queue.common.perprompt import cluster
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.vectors import pack_vector, unpack_vector
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import collect_output
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet
from swarm_queue.sim.text import embedding_for
from tests.harness import command
from tests.helpers import collect_lines, prompts, run_engine

FAST = EngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0, max_model_len=512)


def _float32(values: list[float]) -> list[float]:
    return unpack_vector(pack_vector(values))


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_the_simulators_vectors_put_near_duplicates_together() -> None:
    a = "the enzyme binds the receptor at low temperature in every sample we took"
    b = "the enzyme binds the receptor at high temperature in every sample we took"
    c = "galaxies in the local group drift apart as the universe expands"
    assert _cosine(embedding_for(a), embedding_for(b)) > 0.8
    assert abs(_cosine(embedding_for(a), embedding_for(c))) < 0.5
    assert embedding_for(a) == embedding_for(a.upper())
    # Near-duplicates land in one cluster of meaning, the unrelated text in its own.
    assert cluster([embedding_for(t) for t in (a, c, b)], 0.8) == [[0, 2], [1]]
    assert math.isclose(_cosine(embedding_for(a), embedding_for(a)), 1.0)


async def test_an_embeddings_job_goes_to_its_models_endpoints_and_fails_one_input_alone(
    settings: Settings, store: JobStore, tmp_path: Path
) -> None:
    n = 400
    texts = [p for p, _ in prompts(n)]
    texts[123] = "word " * 700  # 875 tokens: over the 512 of the embedding model
    embed, _ = build_spec("e", JobOptions(model="embedder", embed=True), source="t")
    await enqueue_prompts(store, embed, [(t, None) for t in texts])
    gen = JobSpec(job="g", model="writer", params=SamplingParams(max_tokens=8))
    await enqueue_prompts(store, gen, prompts(100))
    ports = [free_port(), free_port()]
    fleet = SimFleet(
        [SimEndpoint(ports[0], FAST, model="embedder"), SimEndpoint(ports[1], FAST, model="writer")]
    )
    async with fleet:
        await run_engine(settings, store, fleet.urls)
    embedder, writer = fleet.endpoints
    assert all("input" in body for body in embedder.received)
    assert not any("input" in body for body in writer.received)
    assert max(len(body["input"]) for body in embedder.received) > 1  # lists, not one by one

    lines = await collect_lines(store, "e")
    assert [x["index"] for x in lines] == list(range(n))
    failed = [x for x in lines if x["error"] is not None]
    assert [x["index"] for x in failed] == [123]
    assert "maximum context length is 512 tokens" in failed[0]["error"]
    for x in lines:
        if x["index"] != 123:
            assert x["embedding"] == _float32(embedding_for(texts[x["index"]])), x["index"]
            assert x["text"] is None and x["model"] == "embedder"
    assert all(x["text"] for x in await collect_lines(store, "g"))

    out = tmp_path / "e.parquet"
    report = await collect_output(store, "e", str(out), "parquet", wait=False, progress=False)
    assert report.complete
    table = pq.read_table(out)
    kind = table.schema.field("embedding").type
    assert pa.types.is_list(kind) and kind.value_type == pa.float32()
    vectors = table.column("embedding").to_pylist()
    assert vectors[123] is None
    assert vectors[7] == _float32(embedding_for(texts[7]))
    # Ready for Hugging Face datasets: a float32 sequence per row.
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "parquet", data_files=str(out / "*.parquet"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert str(ds.features["embedding"].feature.dtype) == "float32"
    assert ds[7]["embedding"] == vectors[7] and ds.num_rows == n


def test_an_embeddings_job_refuses_settings_of_generation(cli_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"an embeddings job \(embed\) has no chat, schema"):
        build_spec("e", JobOptions(embed=True, chat=True, schema={"type": "string"}), source="t")
    with pytest.raises(ConfigError, match="the response cache keeps generated answers only"):
        build_spec("e", JobOptions(embed=True, model="m", cache=True, temperature=0), source="t")
    out = command(cli_env, "swarm-enqueue", "-", "--job", "e", "--embed", "--chat", stdin="x\n")
    assert out.returncode == 2
    assert "an embeddings job (embed) has no chat" in out.stderr


async def test_the_python_api_embeds(
    redis_url: str, prefix: str, sim_fleet: Callable[..., SimFleet]
) -> None:
    from swarm_queue.producer.api import Swarm

    texts = [f"sample {i} of the survey" for i in range(50)]
    async with (
        sim_fleet(1) as fleet,
        Swarm(redis_url, endpoints=fleet.urls, prefix=prefix, poll_ms=50) as swarm,
    ):
        job = await swarm.submit(texts, embed=True)
        results = await swarm.gather(job)
    got = [unpack_vector(r.embedding or b"") for r in results]
    assert got == [_float32(embedding_for(t)) for t in texts]
    assert msgspec.json.decode(msgspec.json.encode(results[0].index)) == 0
