"""A worker reads the job registry once a refresh for its job table and every flow (each
reading on its own, a fleet's idle workers read it five times as often: issue 50), and a
read forced (a burst deciding whether to stay) is one sent after the ask (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.worker.jobtable import JobTable, Registry
from swarm_queue.worker.pumps import Pumps


def _counted(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    list_jobs = store.list_jobs

    async def counting() -> list[str]:
        reads.append(1)
        return await list_jobs()

    monkeypatch.setattr(store, "list_jobs", counting)
    return reads


async def test_one_read_of_the_registry_serves_the_job_table_and_every_flow(
    store: JobStore, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(jobs_refresh_s=60.0)
    await store.create_job(JobSpec(job="plain"))
    reads = _counted(store, monkeypatch)
    registry = Registry(store)
    table = JobTable(
        store, settings, lacks=lambda spec: None, on_over=lambda job: None, registry=registry
    )
    pumps = Pumps(store, settings, names=registry.names)
    assert len(pumps.flows) >= 4
    assert await table.sweep() == ["plain"] and set(table.jobs) == {"plain"}
    for flow in pumps.flows:
        await flow.step()
    assert len(reads) == 1
    # A burst's question (a flow's forced refresh) reads the registry again, once per flow.
    assert await pumps.has_work() is False
    assert len(reads) == 1 + len(pumps.flows)
    await pumps.close()


async def test_a_read_forced_is_one_sent_after_the_ask_and_callers_share_a_read_under_way(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    reads = _counted(store, monkeypatch)
    registry = Registry(store, clock=lambda: now[0])
    await store.create_job(JobSpec(job="a"))
    got = await asyncio.gather(*(registry.names(5.0) for _ in range(4)))
    assert got == [["a"]] * 4 and len(reads) == 1
    await store.create_job(JobSpec(job="b"))
    now[0] += 4.0
    assert await registry.names(5.0) == ["a"]  # young enough: what was read
    assert await registry.names() == ["a", "b"]  # forced: read now
    assert len(reads) == 2
