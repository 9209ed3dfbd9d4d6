"""``swarm-collect --format parquet``: one row per prompt, in input order, with the fields of
the JSON Lines output, written part by part and resumed after a crash, against a real Redis;
read back the way users read it, with pandas and Hugging Face ``datasets``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from swarm_queue.common.models import JobSpec, Result, Usage, encode
from swarm_queue.common.store import JobStore
from swarm_queue.producer import parquet
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import collect_output
from swarm_queue.producer.parquet import part_name
from swarm_queue.producer.plain import COLUMNS, PlainOutput
from tests.harness import BIN
from tests.helpers import collect_lines, gen_of, prompts, spec

pd = pytest.importorskip("pandas")


def _result(i: int) -> Result:
    """Prompt ``i``'s outcome: every seventh fails, every third has a custom id."""
    cid = f"c{i}" if i % 3 == 0 else None
    if i % 7 == 0:
        return Result(index=i, error="prompt too long", error_kind="rejected", custom_id=cid)
    return Result(
        index=i,
        text=f" answer {i}",
        finish_reason="stop" if i % 2 else "length",
        usage=Usage(5 + i % 4, 3),
        endpoint="http://e:8000",
        attempts=1 + i % 2,
        custom_id=cid,
    )


async def _answer(store: JobStore, got: list[tuple[bytes, Any]], indices: range) -> None:
    await store.commit(
        "j", [(got[i][0], _result(i), None) for i in indices], gen=await gen_of(store, "j")
    )


_USAGE = ("prompt_tokens", "completion_tokens")


def _rows(frame: Any) -> list[dict[str, Any]]:
    """The frame's rows as JSON Lines would show them (no ``custom_id`` where there is none)."""
    rows = []
    for row in frame.to_dict("records"):
        row = {k: (None if v is None or v != v else v) for k, v in row.items()}  # NaN: null
        tokens = row.pop("prompt_tokens"), row.pop("completion_tokens")  # a column each
        row["usage"] = (
            None if tokens[0] is None else dict(zip(_USAGE, map(int, tokens), strict=True))
        )
        if row["custom_id"] is None:
            del row["custom_id"]
        if row["error_kind"] is None:  # a JSON line says it only on a failure
            del row["error_kind"]
        if row.pop("cached"):  # a JSON line says "cached" only when it was
            row["cached"] = True
        for name in ("embedding", "samples", "value"):  # only for jobs that have them
            if row[name] is None:
                del row[name]
        rows.append({k: int(v) if k in ("index", "attempts") else v for k, v in row.items()})
    return rows


async def test_parquet_rows_match_the_jsonl_lines_across_parts_and_a_resumed_run(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parquet, "PART_ROWS", 1000)
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 300)
    n = 3500
    await enqueue_prompts(store, spec(), prompts(n))
    got = await store.read_new("j", "c", n)
    await _answer(store, got, range(2600))
    out = tmp_path / "out.parquet"

    first = await collect_output(
        store, "j", str(out), "parquet", wait=False, progress=False, evict=True
    )
    assert (first.start, first.written, first.complete) == (0, 2600, False)
    # 2 full parts and a third closed at the end of the run; every written result left Redis
    # but the failures (kept for swarm-retry).
    assert sorted(os.listdir(out)) == [part_name(0), part_name(1), part_name(2)]
    kept = {int(i) for i in await store.redis.hkeys(store.keys.results("j"))}
    assert kept == {i for i in range(2600) if not _result(i).ok}
    assert len(await asyncio.to_thread(pd.read_parquet, out)) == 2600

    await _answer(store, got, range(2600, n))
    second = await collect_output(store, "j", str(out), "parquet", wait=False, progress=False)
    assert (second.start, second.written, second.complete) == (2600, 900, True)
    # The same rows as the JSON Lines output of the same results, in input order.
    await store.redis.hset(  # the first run evicted them (and marked them evicted)
        store.keys.results("j"), mapping={str(i): encode(_result(i)) for i in range(2600)}
    )
    await store.redis.hdel(store.keys.meta("j"), "evicted")
    expected = await collect_lines(store, "j")
    frame = await asyncio.to_thread(pd.read_parquet, out)
    # The CSV's columns (the usage as two), every one in every row, where a line may leave
    # some out.
    assert list(frame.columns) == [c.name for c in COLUMNS]
    assert _rows(frame) == expected
    assert frame["error"].notna().sum() == len([i for i in range(n) if i % 7 == 0])


async def test_parts_no_collection_of_this_job_wrote_are_left_alone_and_a_file_refused(
    store: JobStore, tmp_path: Path
) -> None:
    await enqueue_prompts(store, spec(), prompts(10))
    got = await store.read_new("j", "c", 10)
    await _answer(store, got, range(10))
    from swarm_queue.common.errors import ConfigError

    out = tmp_path / "out"
    out.mkdir()
    stale = (part_name(0), part_name(7), ".part-00003.parquet.inprogress")
    for name in stale:
        (out / name).write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="no unfinished swarm-collect of job 'j' wrote it"):
        await collect_output(store, "j", str(out), "parquet", wait=False, progress=False)
    assert sorted(os.listdir(out)) == sorted(stale)  # nothing deleted

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.txt").write_text("mine")  # no parts: a directory to collect into
    report = await collect_output(store, "j", str(mine), "parquet", wait=False, progress=False)
    assert report.complete
    assert sorted(os.listdir(mine)) == ["README.txt", part_name(0)]
    frame = await asyncio.to_thread(pd.read_parquet, mine / part_name(0))
    assert list(frame["index"]) == list(range(10))

    plain = tmp_path / "plain.parquet"
    plain.write_bytes(b"x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        await collect_output(store, "j", str(plain), "parquet", wait=False, progress=False)


def test_hugging_face_datasets_loads_the_parts_in_input_order(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "out.parquet"
    out.mkdir()
    for part, start in enumerate(range(0, 30, 10)):
        rows = [_result(i) for i in range(start, start + 10)]
        table = parquet.output_table(PlainOutput([spec("j")]), rows)
        import pyarrow.parquet as pq

        pq.write_table(table, out / part_name(part))
    ds = datasets.load_dataset(
        "parquet",
        data_files=str(out / "*.parquet"),
        split="train",
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert ds.num_rows == 30
    assert ds["index"] == list(range(30))
    assert ds[7]["error"] == "prompt too long" and ds[7]["text"] is None
    assert (ds[8]["prompt_tokens"], ds[8]["completion_tokens"]) == (5, 3)
    assert ds[9]["custom_id"] == "c9" and ds[8]["custom_id"] is None


@pytest.mark.slow
def test_a_killed_parquet_collector_resumes_to_the_same_rows(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    """A real ``swarm-collect --format parquet --wait`` killed with two parts closed and a
    third open: the rerun drops the open part and writes exactly the uninterrupted rows."""
    n, first = 230_000, 215_000
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env |= {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix}
    client = redis.Redis.from_url(redis_url)
    meta, results = f"{prefix}:{{big}}:meta", f"{prefix}:{{big}}:results"

    def answer(indices: range) -> None:
        for start in range(indices.start, indices.stop, 20_000):
            stop = min(start + 20_000, indices.stop)
            client.hset(results, mapping={str(i): encode(_result(i)) for i in range(start, stop)})

    out, cursor = tmp_path / "out.parquet", Path(f"{tmp_path / 'out.parquet'}.cursor")
    try:
        client.hset(meta, mapping={"spec": encode(JobSpec(job="big")), "total": n, "enqueued": n})
        answer(range(first))
        client.hset(meta, "done", first)
        proc = subprocess.Popen(
            [BIN / "swarm-collect", "big", "--out", out, "--format", "parquet", "--wait"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Killed once two parts are closed and the third is open (under its hidden name).
        open_part = out / f".{part_name(2)}.inprogress"
        deadline = time.monotonic() + 120
        parts = 0
        while not (parts == 2 and open_part.exists()):
            assert proc.poll() is None, "finished before it could be killed"
            assert time.monotonic() < deadline, f"never got there: {parts} parts closed"
            if cursor.exists():
                parts = msgspec.json.decode(cursor.read_bytes())["parts"]
            time.sleep(0.01)  # polling: leave the collector the CPU
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert sorted(os.listdir(out)) == [open_part.name, part_name(0), part_name(1)]

        answer(range(first, n))
        client.hset(meta, mapping={"done": n, "finished_s": "1"})
        again = subprocess.run(
            [BIN / "swarm-collect", "big", "--out", out, "--format", "parquet"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
        assert f"wrote {n} of {n} results" in again.stderr and "resumed at 200000" in again.stderr
        assert sorted(os.listdir(out)) == [part_name(0), part_name(1), part_name(2)]
        assert msgspec.json.decode(cursor.read_bytes())["complete"] is True
        frame = pd.read_parquet(out)
        assert list(frame["index"]) == list(range(n))
        assert list(frame["text"].iloc[[1, 200_001, n - 2]]) == [
            _result(i).text for i in (1, 200_001, n - 2)
        ]
    finally:
        client.delete(meta, results)
        client.close()


def test_parquet_to_stdout_is_refused_with_the_reason(redis_url: str, prefix: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env |= {"SWARM_REDIS_URL": redis_url, "SWARM_PREFIX": prefix}
    client = redis.Redis.from_url(redis_url)
    meta = f"{prefix}:{{tiny}}:meta"
    try:
        client.hset(meta, mapping={"spec": encode(JobSpec(job="tiny")), "total": 0})
        run = subprocess.run(
            [BIN / "swarm-collect", "tiny", "--out", "-", "--format", "parquet"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        client.delete(meta)
        client.close()
    assert run.returncode == 2
    assert "--format parquet writes a directory: give --out DIR, not -" in run.stderr
