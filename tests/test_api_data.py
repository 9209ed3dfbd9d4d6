"""The Python API takes and gives the data people hold: prompts from a pandas DataFrame, a
Parquet file or a list; results as a DataFrame with the Parquet output's columns, embeddings
as lists (numpy arrays on request); and all of it without an event loop of one's own, also
inside a running one (a notebook's). Real swarm-sim endpoints, a private Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarm_queue import SyncSwarm, gather_prompts
from swarm_queue.common.errors import ConfigError
from swarm_queue.sim.text import completion_for, embedding_for
from tests.harness import FleetFactory, collect, command

pytestmark = pytest.mark.slow


def _questions(n: int) -> list[str]:
    return [f"What does gene G{i:04d} do?" for i in range(n)]


def test_a_dataframe_and_a_parquet_file_in_a_dataframe_out(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2)
    urls = [fleet.url(0), fleet.url(1)]
    qs = _questions(150)
    df = pd.DataFrame({"qid": [f"q{i}" for i in range(150)], "question": qs})
    table = tmp_path / "in.parquet"
    pq.write_table(pa.table({"question": qs}), table)
    with SyncSwarm(endpoints=urls) as swarm:
        job = swarm.submit(df, column="question", id_column="qid", max_tokens=8)
        frame = swarm.frame(job)
        dataset = swarm.dataset(job)
        again = swarm.submit(table, column="question", max_tokens=8)
        streamed = list(swarm.results(again))
        with pytest.raises(ConfigError, match="no column 'prompt' in the data"):
            swarm.submit(df, max_tokens=8)
    expected = [completion_for(q, 8)[0] for q in qs]
    assert list(frame["index"]) == list(range(150))
    assert list(frame["custom_id"]) == [f"q{i}" for i in range(150)]
    assert list(frame["text"]) == expected and frame["error"].isna().all()
    assert dataset["text"] == expected and dataset["custom_id"] == list(frame["custom_id"])
    assert [r.index for r in streamed] == list(range(150))
    assert [r.text for r in streamed] == expected


def test_embeddings_are_lists_and_the_one_call_runs_inside_a_running_loop(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(1)
    texts = _questions(20)

    async def in_a_notebook() -> list[list[float] | None]:
        # A loop runs already (as in Jupyter): asyncio.run could not be called here.
        results = gather_prompts(texts, [fleet.url(0)], embed=True)
        assert results[0].array() is not None and results[0].array().dtype == "float32"
        return [r.vector for r in results]

    vectors = asyncio.run(in_a_notebook())
    assert vectors == [pytest.approx(embedding_for(t), rel=1e-6) for t in texts]
    assert all(isinstance(v, list) for v in vectors)


def test_swarm_enqueue_reads_a_parquet_column(fleet_factory: FleetFactory, tmp_path: Path) -> None:
    fleet = fleet_factory(1)
    qs = _questions(30)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"qid": [f"q{i}" for i in range(30)], "question": qs}), src)
    env = fleet.env
    queued = command(env, "swarm-enqueue", src, "--job", "pq", "--column", "question",
                     "--id-column", "qid", "--max-tokens", "8")  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert "job pq: 30 prompts queued (30 new" in queued.stdout
    wrong = command(env, "swarm-enqueue", src, "--job", "pq2")
    assert wrong.returncode == 2
    assert f"{src} has no column 'prompt' (it has 'qid', 'question')" in wrong.stderr
    # Custom ids as a batch file's: each given, none twice (seen: both taken silently); the
    # file refused whole, nothing queued.
    for ids, why in (
        ([f"q{i}" for i in range(29)] + ["q3"], "30: custom id 'q3' repeats row 4's"),
        ([f"q{i}" for i in range(29)] + [None], "30: column 'qid' is null"),
    ):
        bad = tmp_path / "bad.parquet"
        pq.write_table(pa.table({"qid": ids, "question": qs}), bad)
        refused = command(env, "swarm-enqueue", bad, "--job", "pq3", "--column", "question",
                          "--id-column", "qid")  # fmt: skip
        assert refused.returncode == 2 and f"{bad}:{why}" in refused.stderr, refused.stderr
    listed = command(env, "swarm-jobs")
    assert "pq3" not in listed.stdout
    assert fleet.worker("w", [0]).wait(timeout=120) == 0
    out = tmp_path / "pq.jsonl"
    assert collect(env, "pq", out).returncode == 0
    lines = [msgspec.json.decode(x) for x in out.read_bytes().splitlines()]
    assert [x["custom_id"] for x in lines] == [f"q{i}" for i in range(30)]
    assert [x["text"] for x in lines] == [completion_for(q, 8)[0] for q in qs]
