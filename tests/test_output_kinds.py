"""One output path: every kind of job is written in every format through one seam
(``common/output.py``). A kind of job the product has never seen, declared here in the test
and registered by one line, is collected as JSON Lines, CSV and Parquet with its own lines and
columns, and no format names it."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from swarm_queue.common.models import FlowRef, JobSpec, Result
from swarm_queue.common.output import Column, JobOutput, Json
from swarm_queue.common.store import JobStore
from swarm_queue.flows import registry
from swarm_queue.flows.flow import Flow
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import collect_output
from tests.helpers import gen_of, prompts


class Shout(msgspec.Struct, frozen=True):
    """The toy kind's line: each answer in capitals, with its length."""

    index: int
    loud: str | None
    size: int
    extra: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.loud is not None


class ShoutOutput(JobOutput[Result]):
    what = "shout"

    def start(self, first: Result) -> Result:
        return first

    def line(self, row: Result) -> Shout:
        text = row.text.upper() if row.text is not None else None
        return Shout(row.index, text, len(row.text or ""), {"even": row.index % 2 == 0})

    def columns(self) -> list[Column]:
        return [
            Column("index", int),
            Column("loud", str),
            Column("size", int),
            Column("extra", Json),
        ]

    def cells(self, line: Any) -> list[Any]:
        return [line.index, line.loud, line.size, line.extra]


class ShoutFlow(Flow):
    """Its flow (never pumped here: its answers are committed by the test)."""

    name = "shout"
    output = ShoutOutput

    async def find(self) -> dict[str, JobSpec]:
        return {}

    async def advance(self, name: str, spec: JobSpec) -> bool:
        return False


@pytest.fixture
def shout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy kind registered, as a new workflow is: one line in flows/registry.py."""
    monkeypatch.setattr(registry, "FLOWS", (*registry.FLOWS, ShoutFlow))


async def _answered(store: JobStore, n: int) -> None:
    job = JobSpec(job="s", flow=FlowRef(kind="shout"))
    await enqueue_prompts(store, job, prompts(n))
    got = await store.read_new("s", "c", n)
    answers = [(eid, Result(index=i, text=f"word {i}"), None) for i, (eid, _) in enumerate(got)]
    await store.commit("s", answers, gen=await gen_of(store, "s"))


async def test_a_new_kind_of_job_is_collected_in_every_format_without_a_format_naming_it(
    shout: None, store: JobStore, tmp_path: Path
) -> None:
    n = 12
    await _answered(store, n)
    want = [
        {"index": i, "loud": f"WORD {i}", "size": len(f"word {i}"), "extra": {"even": i % 2 == 0}}
        for i in range(n)
    ]

    jsonl = tmp_path / "s.jsonl"
    report = await collect_output(store, "s", str(jsonl), "jsonl", wait=False, progress=False)
    assert (report.written, report.ok, report.complete) == (n, n, True)
    assert [json.loads(x) for x in jsonl.read_text().splitlines()] == want

    table = tmp_path / "s.csv"
    await collect_output(store, "s", str(table), "csv", wait=False, progress=False)
    rows = list(csv.DictReader(table.read_text().splitlines(keepends=True)))
    assert [
        {"index": int(r["index"]), "loud": r["loud"], "size": int(r["size"]),
         "extra": json.loads(r["extra"])}
        for r in rows
    ] == want  # fmt: skip

    pq = pytest.importorskip("pyarrow.parquet")
    parts = tmp_path / "s.parquet"
    await collect_output(store, "s", str(parts), "parquet", wait=False, progress=False)
    got = pq.read_table(parts).to_pylist()
    assert [{**r, "extra": json.loads(r["extra"])} for r in got] == want
    assert str(pq.read_schema(next(parts.glob("*.parquet"))).field("size").type) == "int64"


async def test_a_format_a_kind_does_not_list_is_refused_naming_those_it_does(
    shout: None, store: JobStore, tmp_path: Path
) -> None:
    await _answered(store, 2)
    from swarm_queue.common.errors import ConfigError

    with pytest.raises(ConfigError, match="a shout is collected as jsonl, csv, parquet"):
        await collect_output(store, "s", str(tmp_path / "o"), "openai", wait=False, progress=False)
