"""``swarm-collect --format csv``: the sink seam's proof. One row per prompt under a header,
the same values as the JSON Lines output, resumed and evicted like it, against a real Redis."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from swarm_queue.common.models import Result, Usage
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.producer.output import collect_output
from swarm_queue.producer.plain import COLUMNS as PLAIN
from tests.harness import command
from tests.helpers import collect_lines, gen_of, prompts, spec


def _result(i: int) -> Result:
    """Every fifth fails; every third has a custom id; odd ones came from the cache."""
    if i % 5 == 0:
        return Result(index=i, error='too long, "really"', error_kind="rejected")
    return Result(
        index=i,
        text=f' answer {i},\n "quoted"',
        finish_reason="stop",
        usage=Usage(5, i),
        endpoint="http://e:8000",
        attempts=1,
        custom_id=f"c{i}" if i % 3 == 0 else None,
        model="m",
        cached=i % 2 == 1,
    )


COLUMNS = [c.name for c in PLAIN]


def _expected(line: dict[str, Any]) -> dict[str, str]:
    """A JSON line as its CSV row reads back: text cells, empty for what it lacks."""
    usage = line.get("usage") or {}
    values = {**line, **usage, "cached": line.get("cached", False)}
    return {c: "" if values.get(c) is None else str(values[c]) for c in COLUMNS}


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


async def test_csv_rows_hold_what_the_json_lines_hold_and_a_rerun_resumes(
    store: JobStore, tmp_path: Path
) -> None:
    n = 40
    await enqueue_prompts(store, spec(), prompts(n))
    got = await store.read_new("j", "c", n)
    gen = await gen_of(store)
    await store.commit("j", [(got[i][0], _result(i), None) for i in range(25)], gen=gen)
    out = str(tmp_path / "j.csv")

    first = await collect_output(store, "j", out, "csv", wait=False, progress=False)
    assert (first.written, first.complete) == (25, False)
    await store.commit("j", [(got[i][0], _result(i), None) for i in range(25, n)], gen=gen)
    second = await collect_output(store, "j", out, "csv", wait=False, progress=False)
    assert (second.start, second.written, second.complete) == (25, 15, True)

    rows = _rows(out)
    assert list(rows[0]) == COLUMNS  # one header, written once
    assert rows == [_expected(line) for line in await collect_lines(store, "j")]
    assert rows[1]["text"] == ' answer 1,\n "quoted"' and rows[0]["error"] == 'too long, "really"'


async def test_swarm_collect_writes_csv_and_evicts_what_it_holds(
    store: JobStore, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    await enqueue_prompts(store, spec(), prompts(12))
    got = await store.read_new("j", "c", 12)
    await store.commit(
        "j", [(got[i][0], _result(i), None) for i in range(12)], gen=await gen_of(store)
    )
    expected = [_expected(line) for line in await collect_lines(store, "j")]
    out = tmp_path / "j.csv"
    run = command(cli_env, "swarm-collect", "j", "--out", out, "--format", "csv", "--evict")
    assert run.returncode == 1, run.stderr  # some prompts failed: each row says why
    assert _rows(str(out)) == expected
    # Evicted once held, but the failures: kept (with their entries) for swarm-retry.
    kept = {int(i) for i in await store.redis.hkeys(store.keys.results("j"))}
    assert kept == {i for i in range(12) if not _result(i).ok}
    again = command(cli_env, "swarm-collect", "j", "--out", out, "--format", "csv")
    assert again.returncode == 1 and "already holds all 12 results of job j; left alone" in (
        again.stderr
    )
