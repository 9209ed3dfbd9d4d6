"""The backend seam: the worker drives any implementation of the Backend protocol, and an
endpoint's backend is chosen by its hostfile tag."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.hostfile import Endpoint, parse_hostfile
from swarm_queue.common.models import Embedding
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.worker.backend import Backend, backend_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from swarm_queue.worker.inmemory import InMemoryBackend
from tests.helpers import collect_lines, prompts, spec


async def test_the_worker_drives_any_backend_the_protocol_describes(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    backend: Backend = InMemoryBackend()  # mypy checks it is one
    await enqueue_prompts(store, spec(), prompts(100))
    engine = Engine(make_settings(batch_size=8), store, [backend])
    try:
        await engine.run(burst=True)
    finally:
        await engine.close()
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [p.upper() for p, _ in prompts(100)]
    assert {x["model"] for x in lines} == {"shout"} and backend.requests == 100 // 8 + 1


async def test_an_embeddings_job_fits_the_protocol_as_a_request_kind(
    make_settings: Callable[..., Settings], store: JobStore
) -> None:
    backend = InMemoryBackend()
    texts = ["abc", "Hello World", "X"] * 10
    embed = msgspec.structs.replace(spec(), request=Embedding())
    await enqueue_prompts(store, embed, [(t, None) for t in texts])
    engine = Engine(make_settings(batch_size=8), store, [backend])
    try:
        await engine.run(burst=True)
    finally:
        await engine.close()
    lines = await collect_lines(store, "j")
    assert [x["embedding"] for x in lines] == [
        [float(len(t)), float(sum(c.isupper() for c in t))] for t in texts
    ]
    assert all(x["text"] is None for x in lines) and backend.requests == 30 // 8 + 1


async def test_an_endpoints_backend_is_its_hostfile_tag_and_vllm_by_default() -> None:
    hosts = "n1\t8000\nn2\t8000\tbackend=vllm\nn3\t8000\tbackend=tgi\n"
    plain, tagged, other = parse_hostfile(hosts)
    made = [backend_for(e, "k", 60) for e in (plain, tagged, Endpoint("http://n4:1"))]
    try:
        assert all(isinstance(b, EndpointClient) for b in made)
        assert made[2].label == "http://n4:1"
    finally:
        for b in made:
            await b.close()
    with pytest.raises(ConfigError, match=r"http://n3:8000: no backend 'tgi' \(known: vllm\)"):
        backend_for(other, "k", 60)
