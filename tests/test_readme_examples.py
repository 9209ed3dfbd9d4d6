"""Every shell example of README.md and docs/ runs as written (or is named with why not, and
where else it runs), on the embedded setup, and does what its text says: a private Redis
stands for the login node's, swarm-sim endpoints serve the models the examples name (a
node's vLLM), a worker runs beside them, and the example's input files are made here. Only
that much of an example is rewritten (the URLs, and the long-running tool runner started in
the background); each block then runs under ``bash -euo pipefail``, its every command
exiting 0, and its outputs are checked. Seen: the pipeline example's filter, on the wrong
step, stopped every input."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from swarm_queue.common.embedded import free_port
from tests.harness import BIN, REPO, TOOL_PARSER_ARGS, FleetFactory, command

pytestmark = pytest.mark.slow

# The blocks no test here runs, and why (where another test runs them, which): a new block
# of README.md or docs/ is run unless named here.
NOT_RUN = {
    "python3 -m venv .venv": "the two set-up commands: .ci/run is the second, CI the first",
    "swarm-retry JOB [--kind": "a synopsis of the operator's commands, not a script",
    "redis-server --port 0 --tls-port 6380 --appendonly": "a TLS Redis from a site's "
    "certificates: tests/test_acl.py starts Redis with its --user line, read from docs/HPC.md",
    "redis-server --port 0 --tls-port 6380 \\": "a TLS Redis from a site's certificates: "
    "tests/test_security.py starts one with its --user line, read from docs/SECURITY.md",
    "export SWARM_REDIS_URL='rediss://": "a site's TLS Redis: tests/test_security.py",
    "export SWARM_PREFIX=genes": "a prefix and an ACL: tests/test_acl.py, tests/test_security.py",
    "sbatch --parsable": "needs a Slurm scheduler: tests/test_hpc_scripts.py runs the script",
    "apptainer build": "needs Docker and Apptainer",
    "swarm-node --engines 4 --engine 'vllm serve": "vLLM on a compute node: tests/test_node.py "
    "runs swarm-node with swarm-sim as the engine command",
    "SWARM_REDIS_CLUSTER=1": "a Redis Cluster: tests/test_cluster.py runs the same commands",
    "bench/interop_litellm.py": "a benchmark of minutes (bench/)",
    "bench/interop_vllm.py": "a real vLLM (bench/vllm_cpu.py installs it): docs/INTEROP.md",
    "bench/prefill_vllm.py": "a real vLLM (bench/vllm_cpu.py installs it): docs/INTEROP.md",
    "bench/interop_prefix.py": "four real vLLM servers (bench/vllm_cpu.py): docs/INTEROP.md",
    "python -m bench.run": "the benchmarks, hours (docs/BENCHMARKS.md)",
    "swarm-sim --ports 8001": "servers on fixed ports left running: the harness starts "
    "swarm-sim by its command line for every end-to-end test (tests/harness.py)",
}
DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


def _blocks() -> list[tuple[str, str]]:
    """The shell blocks of README.md and docs/: (``FILE:LINE``, text)."""
    out: list[tuple[str, str]] = []
    for doc in DOCS:
        lines, at, text = (REPO / doc).read_text().splitlines(), None, list[str]()
        for n, line in enumerate(lines, 1):
            if at is None and re.fullmatch(r"```(bash|sh|shell)", line):
                at, text = n, []
            elif at is not None and line == "```":
                out.append((f"{doc}:{at}", "\n".join(text) + "\n"))
                at = None
            elif at is not None:
                text.append(line)
    return out


BLOCKS = _blocks()


def test_the_blocks_left_out_are_the_ones_named_each_once() -> None:
    for key in NOT_RUN:
        assert len([w for w, text in BLOCKS if key in text]) == 1, key
    assert len(BLOCKS) - len(NOT_RUN) >= 6


def _inputs(d: Path) -> None:
    """The files the examples read, as a user would have them."""
    (d / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What does gene G{i} do?"}) + "\n" for i in range(40))
    )
    (d / "findings.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Finding {i} about kinases."}) + "\n" for i in range(30))
    )
    (d / "questions.txt").write_text("".join(f"Is protein P{i} a kinase?\n" for i in range(20)))
    (d / "judge.txt").write_text("Answer yes or no: is this right? {answer}")
    (d / "summary.txt").write_text("Summarise for {prompt}: {answer}")
    (d / "rate.txt").write_text("Rate this answer to {prompt} from 0 to 9, as [[score]]: {answer}")
    (d / "abstracts.txt").write_text("".join(f"Abstract {i}: enzymes.\n" for i in range(20)))
    (d / "papers.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(10)))
    (d / "task.txt").write_text(
        'Find paper {n}. CALL search({{"query": "enzymes"}}) then CALL fetch({{"url": "doc{n}"}})'
    )
    (d / "system.txt").write_text("Be exact.")
    (d / "requests.jsonl").write_text(  # an OpenAI Batch API file, for swarm-gateway's example
        "".join(
            json.dumps(
                {
                    "custom_id": f"q{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": f"Is P{i} a kinase?"}]},
                }
            )
            + "\n"
            for i in range(12)
        )
    )
    (d / "schema.json").write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
                "required": ["title", "year"],
            }
        )
    )


def _lines(path: Path) -> list[dict[str, object]]:
    return [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]


def test_every_readme_example_runs_and_does_what_it_says(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    # A context for the examples' 512-token answers (the harness's 600 is for its own tests).
    models = ("--model", "swarm-sim,judge-model,my-embedder", "--max-model-len", "32768")
    fleet = fleet_factory(3, *models, *TOOL_PARSER_ARGS)
    _inputs(tmp_path)
    # The examples run from a checkout (the tool runner's PYTHONPATH=examples).
    (tmp_path / "examples").symlink_to(REPO / "examples")
    worker = fleet.worker("w", [0, 1, 2], burst=False)
    # The installed commands, as a user's shell finds them; the gateway's files in the test's
    # folder, and on a port of its own.
    env = {
        **fleet.env,
        "PATH": f"{BIN}:{fleet.env.get('PATH', '/usr/bin:/bin')}",
        "SWARM_GATEWAY_DIR": str(tmp_path / "gateway"),
    }
    gateway_port = str(free_port())
    ran = []
    try:
        for line, text in BLOCKS:
            if any(k in text for k in NOT_RUN):
                continue
            script = (
                text.replace("redis://login-node:6379/0", fleet.redis_url)
                .replace("http://127.0.0.1:8000", fleet.url(0))
                .replace("8080", gateway_port)
                # The tool runner serves until stopped: in the background, for this block.
                .replace(
                    "swarm-tools   #",
                    "swarm-tools >tools.log 2>&1 & trap 'kill $!' EXIT   #",
                )
            )
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{line}: {done.stderr[-3000:]}"
            ran.append(line)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert len(ran) == len(BLOCKS) - len(NOT_RUN)
    # What each says it does.
    batch: list[Any] = _lines(tmp_path / "batch-results.jsonl")  # the gateway's output file
    assert sorted(x["custom_id"] for x in batch) == sorted(f"q{i}" for i in range(12))
    assert all(x["response"]["body"]["choices"][0]["message"]["content"] for x in batch)
    results = _lines(tmp_path / "results.jsonl")
    assert [x["index"] for x in results] == list(range(40)) and all(x["text"] for x in results)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary.get("error") is None and summary["value"] and summary["used"] == 30
    study = _lines(tmp_path / "study.jsonl")
    assert len(study) == 20
    # The judge answers (the simulator's words, never a yes or no) are kept out of the
    # summary step by its filter, and say so; an input is never stopped before the judge.
    assert all(x["stopped_at"] == 2 and "does not match keep-if" in str(x["error"]) for x in study)
    assert all(len(x["steps"]) == 2 for x in study)
    table = pq.read_table(tmp_path / "study.parquet").to_pydict()
    assert table["index"] == list(range(20)) and all(table["s1_text"])
    best = _lines(tmp_path / "best.jsonl")
    assert [x["index"] for x in best] == list(range(20))
    for x in best:  # the best of eight judged candidates, each with its score
        candidates = x["candidates"]
        assert isinstance(candidates, list) and len(candidates) == 8
        scores = [c["score"] for c in candidates if "score" in c]
        assert x["score"] == max(scores) and candidates[x["best"]]["text"] == x["text"]
    with open(tmp_path / "best.csv", newline="") as fh:
        best_rows = list(csv.DictReader(fh))
    assert [r["text"] for r in best_rows] == [x["text"] for x in best]
    assert [float(r["c7_score"]) for r in best_rows] == [x["candidates"][7]["score"] for x in best]
    votes = pq.read_table(tmp_path / "sc.parquet")
    assert votes.schema.field("value.share").type == "double"
    assert votes.schema.field("value.votes").type == "int64"
    rows = votes.to_pylist()
    assert len(rows) == 20
    for row in rows:  # the typed columns are the value's own fields
        value = json.loads(row["value"])
        assert [row[f"value.{k}"] for k in ("answer", "votes", "share", "distinct")] == [
            value[k] for k in ("answer", "votes", "share", "distinct")
        ]
        assert row["text"] == value["answer"] and 0 < value["share"] <= 1
    sc_csv = command(env, "swarm-collect", "sc", "--out", tmp_path / "sc.csv", "--format", "csv")
    assert sc_csv.returncode == 0, sc_csv.stderr
    with open(tmp_path / "sc.csv", newline="") as fh:
        shares = [float(r["value.share"]) for r in csv.DictReader(fh)]
    assert shares == [row["value.share"] for row in rows]
    measured = pq.read_table(tmp_path / "uq.parquet")
    assert measured.schema.field("s1_value.entropy").type == "double"
    for row in measured.to_pylist():
        value = json.loads(row["s1_value"])
        assert row["s1_value.entropy"] == value["entropy"] and row["s1_value.answer"]
    vectors = pq.read_table(tmp_path / "vec.parquet").to_pydict()["embedding"]
    assert len(vectors) == 20 and all(len(v) > 0 for v in vectors)
    frame = pq.read_table(tmp_path / "answers.parquet")
    assert frame.schema.field("output.year").type == "int64"
    columns = frame.to_pydict()
    papers = _lines(tmp_path / "answers.jsonl")
    assert columns["output.year"] == [x["output"]["year"] for x in papers]
    assert columns["output.title"] == [x["output"]["title"] for x in papers]
    assert columns["tool_calls"] == [2] * 10
    as_csv = command(env, "swarm-collect", "papers", "--out", tmp_path / "a.csv", "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    with open(tmp_path / "a.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["output.year"]) for r in rows] == columns["output.year"]
    assert [json.loads(r["output"]) for r in rows] == [x["output"] for x in papers]
    assert [x["index"] for x in papers] == list(range(10))
    assert all(x["tool_calls"] == 2 and set(x["output"]) == {"title", "year"} for x in papers)
