"""Projects and deadlines on one fleet, with real gateway, worker and swarm-sim processes: a
project gets its share of the fleet however many batches it has, and a batch due sooner is
served before one of its project due later (a batch's completion window is its deadline)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai

from tests import gatewayproc as gw
from tests.harness import Fleet, FleetFactory


def _slow_fleet(fleet_factory: FleetFactory, *, worker: bool = True) -> Fleet:
    """One endpoint of 8 sequences and its worker (or none yet), 2 batches of 4 in flight:
    every batch a slot takes is one the service order chose."""
    fleet = fleet_factory(1, "--step-ms", "10", "--max-num-seqs", "8")
    if worker:
        _worker(fleet)
    return fleet


def _worker(fleet: Fleet) -> None:
    fleet.worker(
        "w", [0], burst=False, SWARM_BATCH_SIZE="4", SWARM_INFLIGHT_MAX="0", SWARM_INFLIGHT="2",
    )  # fmt: skip


def _queued(client: openai.OpenAI, batch_id: str, n: int, stall_s: float = 120.0) -> None:
    """Until the batch's ``n`` requests are all queued (its job holds them)."""
    since = time.monotonic()
    while (b := client.batches.retrieve(batch_id)).request_counts.total < n:
        assert time.monotonic() - since < stall_s, f"batch {batch_id} not queued: {b}"
        time.sleep(0.05)


def _batch(client: openai.OpenAI, tmp: Path, name: str, n: int, window: str = "24h") -> Any:
    lines = [gw.completion_line(i, set()) for i in range(n)]
    return client.batches.create(
        input_file_id=gw.upload(client, tmp, f"{name}.jsonl", lines),
        endpoint="/v1/completions",
        completion_window=window,
    )


def _done(client: openai.OpenAI, batch_id: str) -> int:
    return client.batches.retrieve(batch_id).request_counts.completed


def test_two_projects_get_half_the_fleet_each_whatever_their_number_of_batches(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = _slow_fleet(fleet_factory, worker=False)
    keys = tmp_path / "keys"
    keys.write_text("alice-key-0123456789 alice\nbulk-key-0123456789 bulk\n")
    with gw.gateway(fleet.env, tmp_path, "--keys", str(keys)) as (_, port, _log):
        alice = gw.client(port, "alice-key-0123456789")
        bulk = gw.client(port, "bulk-key-0123456789")
        ten = [_batch(bulk, tmp_path, f"b{i}", 40).id for i in range(10)]
        one = _batch(alice, tmp_path, "a", 240).id
        # Every batch queued before the fleet starts (a loaded machine queues ten batches
        # slowly); then what each project gets of it.
        for client, batch, n in [(bulk, b, 40) for b in ten] + [(alice, one, 240)]:
            _queued(client, batch, n)
        _worker(fleet)
        gw.wait_answered(alice, one, 1)
        a0, b0 = _done(alice, one), sum(_done(bulk, b) for b in ten)
        gw.wait_answered(alice, one, a0 + 80)
        a1, b1 = _done(alice, one), sum(_done(bulk, b) for b in ten)
        share = (a1 - a0) / ((a1 - a0) + (b1 - b0))
        assert 0.4 <= share <= 0.6, f"alice got {share:.2f} of the fleet ({a1 - a0} to {b1 - b0})"
        assert gw.wait_over(alice, one).request_counts.completed == 240
        assert all(gw.wait_over(bulk, b).request_counts.completed == 40 for b in ten)


def test_a_batch_due_in_half_an_hour_is_served_before_one_due_in_a_day(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = _slow_fleet(fleet_factory)
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        large = _batch(client, tmp_path, "large", 400).id
        gw.wait_answered(client, large, 20)
        small = _batch(client, tmp_path, "small", 40, window="30m").id
        gw.wait_answered(client, small, 1)
        began = _done(client, large)
        over = gw.wait_over(client, small)
        assert over.status == "completed" and over.request_counts.completed == 40
        # While the small one had work, the large one got only what was already in flight
        # (2 batches of 4, and their early answers' batches being taken).
        assert _done(client, large) - began <= 16
        assert client.batches.retrieve(large).status == "in_progress"
        assert gw.wait_over(client, large).request_counts.completed == 400


def test_a_batch_that_cannot_finish_in_its_window_says_so_while_it_runs(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = _slow_fleet(fleet_factory)
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        on_time = _batch(client, tmp_path, "on-time", 40)
        tight = _batch(client, tmp_path, "tight", 1000, window="10s")  # needs half a minute
        running = gw.wait_answered(client, tight.id, 40)
        assert running.status == "in_progress"
        [note] = running.errors.data
        assert note.code == "deadline_at_risk"
        assert "requests left need about" in note.message and "ends batch_expired" in note.message
        assert client.batches.retrieve(on_time.id).errors is None
        assert gw.wait_over(client, on_time.id).status == "completed"
        over = gw.wait_over(client, tight.id)
        assert over.status == "expired" and over.request_counts.completed < 1000
