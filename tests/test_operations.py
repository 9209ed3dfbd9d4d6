"""Operator commands against a real Redis: swarm-retry and swarm-cancel, each safe to run twice."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm_queue.common.errors import JobCancelledError
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.engine import Engine
from tests.helpers import collect_lines, gen_of, prompts, run_engine, spec

BIN = Path(sys.executable).parent


async def test_retry_requeues_exactly_the_failed_prompts_and_a_second_retry_finds_none(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    items = [("z" * 300 if i % 10 == 3 else f"p{i}", None) for i in range(40)]
    await enqueue_prompts(store, spec(max_tokens=8), items)
    settings = make_settings(batch_size=8)
    async with sim_fleet(1, EngineConfig(max_model_len=40, step_base_ms=0.5)) as small:
        await run_engine(settings, store, small.urls)
    status = await store.status("j")
    assert (status.done, status.failed, status.failed_by_kind) == (36, 4, {"rejected": 4})
    assert [i for i, _ in await store.failed_indices("j", {"rejected"})] == [3, 13, 23, 33]
    assert await store.failed_indices("j", {"cancelled"}) == []

    # The operator fixes the cause (a server with a longer context) and retries.
    assert (
        await store.requeue("j", await store.failed_indices("j"), gen=await gen_of(store, "j")) == 4
    )
    status = await store.status("j")
    assert (status.done, status.failed, status.finished, status.pending) == (36, 0, False, 4)
    assert (
        await store.requeue("j", await store.failed_indices("j"), gen=await gen_of(store, "j")) == 0
    )
    async with sim_fleet(1, EngineConfig(max_model_len=4096, step_base_ms=0.5)) as big:
        await run_engine(settings, store, big.urls)
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 8)[0] for p, _ in items]
    status = await store.status("j")
    assert (status.done, status.failed, status.finished, status.failed_by_kind) == (40, 0, True, {})
    assert await store.enqueued_count("j") == 40  # retried IDs do not move the resume point


async def test_cancel_records_the_rest_as_cancelled_and_retry_resumes_it(
    make_settings: Callable[..., Settings], store: JobStore, sim_fleet: Callable[..., SimFleet]
) -> None:
    # Each with its custom_id, which a cancelled prompt's line keeps (an OpenAI output line
    # names its request by it).
    await enqueue_prompts(store, spec(), ((p, f"id-{i}") for i, (p, _) in enumerate(prompts(100))))
    async with sim_fleet(1) as fleet:
        settings = make_settings(batch_size=10, inflight=1)
        engine = Engine(settings, store, [EndpointClient(fleet.urls[0])])
        try:
            assert await engine.drainers[0].step() is True  # 10 answered before the cancel
        finally:
            await engine.close()
        assert await store.cancel("j") == (True, 90)
        assert await store.cancel("j") == (False, 0)
        status = await store.status("j")
        assert (status.cancelled, status.finished, status.done, status.failed) == (
            True,
            True,
            10,
            90,
        )
        lines = await collect_lines(store, "j")
        assert len(lines) == 100
        assert {x["error"] for x in lines[10:]} == {"cancelled by operator (swarm-cancel)"}
        assert [x["custom_id"] for x in lines] == [f"id-{i}" for i in range(100)]
        assert not await Engine(settings, store, [EndpointClient(fleet.urls[0])]).any_work()
        with pytest.raises(JobCancelledError, match="was cancelled"):
            await enqueue_prompts(store, spec("j"), prompts(200))

        assert (
            await store.requeue(
                "j", await store.failed_indices("j", {"cancelled"}), gen=await gen_of(store, "j")
            )
            == 90
        )
        assert not (await store.status("j")).cancelled
        await run_engine(settings, store, fleet.urls)
    lines = await collect_lines(store, "j")
    assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(100)]


async def test_cancel_of_a_job_still_being_enqueued_seals_it_where_input_stopped(
    store: JobStore,
) -> None:
    from swarm_queue.common.models import PromptItem

    await store.create_job(spec())
    await store.add_items(
        "j", [PromptItem(i, f"p{i}") for i in range(7)], gen=await gen_of(store, "j")
    )  # producer still going
    assert await store.cancel("j") == (True, 7)
    status = await store.status("j")
    assert (status.total, status.failed, status.finished) == (7, 7, True)
    with pytest.raises(JobCancelledError):
        await store.add_items("j", [PromptItem(7, "late")], gen=await gen_of(store, "j"))


@pytest.mark.slow
def test_retry_and_cancel_commands(tmp_path: Path, redis_url: str, prefix: str) -> None:
    env = {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix, "PATH": str(BIN)}
    src = tmp_path / "p.txt"
    src.write_text("".join(f"prompt {i}\n" for i in range(25)))

    def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True, timeout=60
        )

    assert sh("swarm-enqueue", str(src), "--job", "ops").returncode == 0
    first, second = sh("swarm-cancel", "ops"), sh("swarm-cancel", "ops")
    assert first.stdout.startswith("job ops: cancelled; 25 unanswered prompts recorded as failed")
    assert second.stdout.startswith("job ops: already cancelled; 0 unanswered prompts")
    status = sh("swarm-status", "ops").stdout
    assert "job ops: cancelled" in status and "failed     25  (cancelled 25)" in status
    assert sh("swarm-retry", "ops", "--kind", "rejected").stdout == (
        "job ops: no failed prompts of kind rejected to retry\n"
    )
    assert (
        sh("swarm-retry", "ops").stdout
        == "job ops: 25 failed prompts queued again (cancelled 25)\n"
    )
    assert sh("swarm-retry", "ops").stdout == "job ops: no failed prompts to retry\n"
    missing = sh("swarm-cancel", "nope")
    assert missing.returncode == 2 and "no job named 'nope'" in missing.stderr
