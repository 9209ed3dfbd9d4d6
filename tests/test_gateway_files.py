"""Files that expire, as OpenAI's do: ``expires_after`` on an upload and
``output_expires_after`` on a batch (the official openai SDK against a real gateway process
and Redis), refused outside OpenAI's bounds, and deleted, record and bytes, once past."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import openai
import pytest

from swarm_queue.common.store import JobStore
from tests import gatewayproc as gw
from tests.harness import FleetFactory


def _gone(path: Path, stall_s: float = 30.0) -> None:
    since = time.monotonic()
    while path.exists():
        assert time.monotonic() - since < stall_s, f"{path} still there"
        time.sleep(0.05)


async def test_files_given_an_expiry_are_deleted_once_it_passes(
    fleet_factory: FleetFactory, tmp_path: Path, store: JobStore
) -> None:
    fleet = fleet_factory(1)
    fleet.worker("w", [0], burst=False)
    with gw.gateway(fleet.env, tmp_path) as (_, port, log):
        client = gw.client(port)
        data = b"".join(msgspec.json.encode(gw.completion_line(i, set())) + b"\n" for i in range(5))
        kept = client.files.create(file=("in.jsonl", data), purpose="batch")
        brief = client.files.create(
            file=("in.jsonl", data), purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )  # fmt: skip
        assert kept.expires_at is None
        assert brief.expires_at == brief.created_at + 3600
        for seconds in (60, 2_592_001):
            with pytest.raises(openai.BadRequestError, match=r"from 3600 \(1 hour\) to 2592000"):
                client.files.create(
                    file=("in.jsonl", data), purpose="batch",
                    expires_after={"anchor": "created_at", "seconds": seconds},
                )  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="the only anchor is 'created_at'"):
            client.batches.create(
                input_file_id=kept.id, endpoint="/v1/completions", completion_window="24h",
                output_expires_after={"anchor": "last_active_at", "seconds": 3600},
            )  # fmt: skip
        batch = client.batches.create(
            input_file_id=kept.id, endpoint="/v1/completions", completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 7200},
        )  # fmt: skip
        done = gw.wait_over(client, batch.id)
        out = client.files.retrieve(done.output_file_id)
        assert out.expires_at == out.created_at + 7200
        assert client.files.retrieve(kept.id).expires_at is None

        # The hour passes: the record says so (as a clock an hour on would), and the gateway
        # deletes the file, its bytes too; it is no more listed nor served meanwhile.
        [bytes_of] = list((tmp_path / "files").rglob(brief.id))
        project = bytes_of.parent.name
        record = await store.file(project, brief.id)
        assert record is not None
        await store.put_file(project, msgspec.structs.replace(record, expires_at=1))
        _gone(bytes_of)
        assert await store.file(project, brief.id) is None
        assert brief.id not in {f.id for f in client.files.list()}
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(brief.id)
        assert {kept.id, out.id} <= {f.id for f in client.files.list()}
        assert f"file {brief.id}: expired and deleted" in log.read_text()
