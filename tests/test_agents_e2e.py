"""Agents with real processes: swarm-enqueue --task, worker processes and a tool runner
process (each SIGKILLed once mid-run), swarm-collect; beside them on one fleet a plain job, a
pipeline, an agent job deleted mid-run and queued again under its name with other input, and
an agent job naming a tool no runner allows, which fails with that reason and stops nothing
else."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from swarm_queue.common.keys import Keys, step_name
from swarm_queue.common.models import decode_spec
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.agents.spec import agent_of
from tests.harness import (
    AGENT_SCHEMA,
    AGENT_TASK,
    BIN,
    TOOL_PARSER_ARGS,
    FleetFactory,
    agents_unfinished,
    collect,
    command,
    fleet_prompt,
    tool_runner,
)
from tests.helpers import wait_count, wait_until
from tests.servers import redis_server

pytestmark = pytest.mark.slow

SCHEMA, TASK = AGENT_SCHEMA, AGENT_TASK


def _collect(env: dict[str, str], tmp: Path, job: str, rc: int = 0) -> list[dict[str, Any]]:
    """``swarm-collect JOB --wait``'s lines, once it exits with ``rc``; if its agents stop
    moving, where the unfinished ones stand, and the tool runner's and workers' last words."""
    try:
        got = collect(env, job, tmp / f"{job}.jsonl")
    except AssertionError as exc:
        total = redis.Redis.from_url(env["SWARM_REDIS_URL"]).hget(
            Keys(env["SWARM_PREFIX"]).meta(job), Meta.ENQUEUED
        )
        logs = [
            f"{p.name}: ...{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(tmp.glob("*.log"))
        ]
        try:
            where = agents_unfinished(env, job, int(total or 0))
        except Exception as read:  # what it could not read must not hide the stall
            where = f"(where the agents stand could not be read: {read!r})"
        raise AssertionError("\n".join([str(exc), where, *logs])) from None
    assert got.returncode == rc, got.stderr
    return [msgspec.json.decode(x) for x in (tmp / f"{job}.jsonl").read_bytes().splitlines()]


def test_agents_survive_a_killed_worker_and_tool_runner_beside_other_jobs(
    fleet_factory: FleetFactory,
) -> None:
    n = 500
    fleet = fleet_factory(3, *TOOL_PARSER_ARGS)
    tmp = fleet.tmp
    (tmp / "task.txt").write_text(TASK)
    (tmp / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp / "in.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    (tmp / "bad.jsonl").write_text("".join(json.dumps({"q": i}) + "\n" for i in range(20)))
    (tmp / "bad-task.txt").write_text('Do {q}. CALL rm_rf({{"path": "/"}})')
    (tmp / "plain.txt").write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(300)))
    (tmp / "step.txt").write_text("Check: {answer}")
    for era, count in (("old", 150), ("new", 120)):  # an agent job deleted and queued again
        inputs = [{"n": i, "custom_id": f"{era}-{i}"} for i in range(count)]
        (tmp / f"rq-{era}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in inputs))
    requeued = ["--job", "rq", "--task", tmp / "task.txt", "--tools", "slow_add,fetch",
                "--max-turns", "3", "--max-tokens", "64"]  # fmt: skip
    # A tool no runner serves (rm_rf) waits this long, then fails its agents saying so.
    # A killed runner's call in hand is asked again once its label lapses (about 15 s), or
    # run again once arq's hold on that try lapses (2 x SWARM_TOOL_TIMEOUT_S + 20 s: 140 s at
    # the default, longer than the collector's no-progress limit: seen, 140 agents waiting).
    env = {**fleet.env, "SWARM_CLAIM_IDLE_MS": "2000", "SWARM_TOOL_WAIT_S": "5",
           "SWARM_TOOL_TIMEOUT_S": "10"}  # fmt: skip
    log = tmp / "runs.log"
    log.touch()
    for args in (
        [tmp / "in.jsonl", "--job", "ag", "--task", tmp / "task.txt", "--tools", "slow_add,fetch",
         "--schema", tmp / "schema.json", "--max-turns", "3", "--max-tokens", "64"],
        [tmp / "bad.jsonl", "--job", "nope", "--task", tmp / "bad-task.txt", "--tools", "rm_rf",
         "--max-turns", "2"],
        [tmp / "plain.txt", "--job", "j", "--max-tokens", "12"],
        [tmp / "plain.txt", "--job", "p", "--max-tokens", "12",
         "--then", tmp / "step.txt", "--max-tokens", "8"],
        [tmp / "rq-old.jsonl", *requeued],
    ):  # fmt: skip
        enq = command(env, "swarm-enqueue", *args)
        assert enq.returncode == 0, enq.stderr
    runner = tool_runner(env, log, tmp / "runner.log")
    doomed = fleet.worker("a", [0, 1], env=env)
    fleet.worker("b", [2], env=env)
    wait_count("agents at their second turn", lambda: fleet.done(step_name("ag", 1)), 21)
    # Job rq is deleted mid-run, its turns in flight, and queued again with other input.
    wait_count("rq at its second turn", lambda: fleet.done(step_name("rq", 1)), 6)
    gone = command(env, "swarm-jobs", "--delete", "rq", "--force")
    assert gone.returncode == 0, gone.stderr
    again = command(env, "swarm-enqueue", tmp / "rq-new.jsonl", *requeued)
    assert again.returncode == 0, again.stderr
    doomed.send_signal(signal.SIGKILL)
    runner.send_signal(signal.SIGKILL)
    doomed.wait()
    runner.wait()
    runner = tool_runner(env, log, tmp / "runner.log")
    fleet.worker("a2", [0, 1], env=env)
    try:
        lines = _collect(env, tmp, "ag")
        assert [x["index"] for x in lines] == list(range(n))  # every agent, once, in order
        for x in lines:
            assert "failure" not in x, x
            assert set(x["output"]) == {"title", "year"} and (x["turns"], x["tool_calls"]) == (3, 2)
        status = command(env, "swarm-status", "ag")
        assert f"agents: {n} done, 0 waiting for a tool, 0 thinking (of {n})" in status.stdout
        assert "tool calls (all jobs): " in status.stdout
        # Its tokens are its agents' every turn's (each line's own sum), once each.
        used = [sum(x[k] for x in lines) for k in ("prompt_tokens", "completion_tokens")]
        assert f"tokens     {used[0]} prompt, {used[1]} completion (every step)" in status.stdout
        runs = log.read_text().split()
        # The shared call ran once (again at most once per runner that died holding it).
        assert 1 <= runs.count("slow_add") <= 2
        assert n <= runs.count("fetch") <= n + 2 * 64  # each agent's own; a killed runner's again

        failed = _collect(env, tmp, "nope", rc=1)
        assert [x["index"] for x in failed] == list(range(20))
        for x in failed:
            assert x["failure"] == "tool"
            assert x["error"] == (
                "no tool runner serves 'rm_rf' (waited 5 s): start swarm-tools with SWARM_TOOLS "
                "allowing it"
            )
        assert len(_collect(env, tmp, "j")) == 300
        # The requeued agent job: the new input's agents only, each once, every turn taken.
        rq = _collect(env, tmp, "rq")
        assert [x["custom_id"] for x in rq] == [f"new-{i}" for i in range(120)]
        assert all("failure" not in x and (x["turns"], x["tool_calls"]) == (3, 2) for x in rq)
        chains = _collect(env, tmp, "p")
        assert len(chains) == 300 and all(len(c["steps"]) == 2 and c["text"] for c in chains)
    finally:
        runner.terminate()
        runner.wait(timeout=30)


def test_an_agent_toml_describes_the_agents_and_bad_input_is_named(
    fleet_factory: FleetFactory,
) -> None:
    fleet = fleet_factory(1, *TOOL_PARSER_ARGS)
    tmp = fleet.tmp
    (tmp / "agent.toml").write_text(
        "\n".join(
            [
                f"task = '''{TASK}'''",
                "system = 'Be exact.'",
                "max_turns = 3",
                "[[tools]]",
                "name = 'slow_add'",
                "description = 'adds'",
                "parameters = {type = 'object', properties = {a = {type = 'integer'}}}",
                "strict = true",
                "[[tools]]",
                "name = 'fetch'",
            ]
        )
    )
    (tmp / "loose.toml").write_text(f"task = '''{TASK}'''\n[[tools]]\nname = 'f'\nstrict = 'yes'\n")
    (tmp / "in.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(30)))
    (tmp / "bad.jsonl").write_text('{"n": 1}\n[1, 2]\n')
    (tmp / "missing.jsonl").write_text('{"n": 1}\n{"n": 2}\n{"m": 1}\n')
    env = fleet.env
    ok = command(
        env, "swarm-enqueue", tmp / "in.jsonl", "--job", "t", "--agent", tmp / "agent.toml"
    )
    assert ok.returncode == 0, ok.stderr
    assert "agent job t: 30 agents queued (30 new, 0 already queued), up to 3 turns" in ok.stdout
    bad = command(
        env, "swarm-enqueue", tmp / "bad.jsonl", "--job", "b", "--agent", tmp / "agent.toml"
    )
    assert bad.returncode == 2 and "bad.jsonl:2: an agent's input is a JSON object" in bad.stderr
    missing = command(
        env, "swarm-enqueue", tmp / "missing.jsonl", "--job", "m", "--agent", tmp / "agent.toml"
    )
    assert missing.returncode == 2
    assert "missing.jsonl:3: no field 'n' the task names (it has 'm')" in missing.stderr
    # A refused input leaves no trace: no job, no later turn, no key (before: m:s1..s3 stayed,
    # nothing could delete them, and the next try said m:s3 already exists).
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        for refused in ("b", "m"):
            assert client.keys(f"{fleet.prefix}:{{{refused}}}:*") == []
    finally:
        client.close()
    listed = command(env, "swarm-jobs")
    assert listed.returncode == 0 and not re.search(r"^(b|m)(:s\d)? ", listed.stdout, re.M)
    fixed = command(
        env, "swarm-enqueue", tmp / "in.jsonl", "--job", "m", "--agent", tmp / "agent.toml"
    )
    assert fixed.returncode == 0, fixed.stderr  # the same name, queued once the input is right
    assert command(env, "swarm-cancel", "m").returncode == 0
    loose = command(
        env, "swarm-enqueue", tmp / "in.jsonl", "--job", "l", "--agent", tmp / "loose.toml"
    )
    assert loose.returncode == 2 and "tool 'f': strict is true or false, got 'yes'" in loose.stderr
    log = tmp / "runs.log"
    log.touch()
    runner = tool_runner(env, log, tmp / "runner.log")
    fleet.worker("w", [0], env=env)
    try:
        got = collect(env, "t", tmp / "t.jsonl")
        assert got.returncode == 0, got.stderr
        lines = [msgspec.json.decode(x) for x in (tmp / "t.jsonl").read_bytes().splitlines()]
        assert [(x["index"], x["turns"], x["tool_calls"]) for x in lines] == [
            (i, 3, 2) for i in range(30)
        ]
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    client = redis.Redis.from_url(fleet.redis_url)
    spec = decode_spec(client.hget(Keys(fleet.prefix).meta("t"), "spec") or b"")
    client.close()
    agent = agent_of(spec)
    assert agent is not None and agent.max_turns == 3
    assert [t["function"]["name"] for t in spec.tools or []] == ["slow_add", "fetch"]
    assert (spec.tools or [])[0]["function"]["description"] == "adds"
    assert (spec.tools or [])[0]["function"]["parameters"]["properties"] == {
        "a": {"type": "integer"}
    }
    # strict goes to the server as OpenAI's field, only where the file says it
    assert [t["function"].get("strict") for t in spec.tools or []] == [True, None]


def test_agents_survive_their_producer_killed_mid_enqueue(fleet_factory: FleetFactory) -> None:
    """The producer dies with part of the input queued, while those agents take their turns;
    the same command run again queues the rest, and every agent finishes once."""
    n = 1_500
    fleet = fleet_factory(2, *TOOL_PARSER_ARGS)
    tmp = fleet.tmp
    (tmp / "task.txt").write_text('Find paper {n}. CALL slow_add({{"a": 1, "b": 2}})')
    lines = [json.dumps({"n": i}) + "\n" for i in range(n)]
    (tmp / "in.jsonl").write_text("".join(lines))
    log = tmp / "runs.log"
    log.touch()
    env = fleet.env
    runner = tool_runner(env, log, tmp / "runner.log")
    worker = fleet.worker("w", [0, 1], burst=False, env=env)
    flags = ["--job", "ag", "--task", tmp / "task.txt", "--tools", "slow_add", "--max-turns", "2"]
    producer = subprocess.Popen(
        [BIN / "swarm-enqueue", "-", *map(str, flags)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert producer.stdin is not None
        producer.stdin.write("".join(lines[:1_100]).encode())  # one chunk of 1,000 is queued
        producer.stdin.flush()
        wait_until("the first agents answered", lambda: fleet.done("ag") > 0)
        producer.send_signal(signal.SIGKILL)
        producer.wait()
        producer.stdin.close()
        again = command(env, "swarm-enqueue", tmp / "in.jsonl", *flags)
        assert again.returncode == 0, again.stderr
        assert f"{n} agents queued ({n - 1_000} new, 1000 already queued)" in again.stdout
        out = _collect(env, tmp, "ag")
    finally:
        for proc in (runner, worker):
            proc.terminate()
            proc.wait(timeout=60)
    assert [x["index"] for x in out] == list(range(n))  # every agent, once, in order
    assert all("failure" not in x and (x["turns"], x["tool_calls"]) == (2, 1) for x in out)
    assert log.read_text().split() == ["slow_add"]  # the one call all of them share


def test_agents_survive_a_redis_restart(fleet_factory: FleetFactory, tmp_path: Path) -> None:
    """Redis restarts mid-run (AOF on, the same data back): no turn and no agent is lost,
    the worker and the tool runner ride it out, every agent finishes once."""
    n = 300
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = redis_server(appendonly=True, workdir=str(workdir)).start()
    try:
        fleet = fleet_factory(2, *TOOL_PARSER_ARGS, url=server.url)
        tmp = fleet.tmp
        (tmp / "task.txt").write_text(TASK)
        (tmp / "in.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
        env = fleet.env
        args = [tmp / "in.jsonl", "--job", "ag", "--task", tmp / "task.txt"]
        enq = command(env, "swarm-enqueue", *args, "--tools", "slow_add,fetch", "--max-turns", "3")
        assert enq.returncode == 0, enq.stderr
        log = tmp / "runs.log"
        log.touch()
        runner = tool_runner(env, log, tmp / "runner.log")
        worker = fleet.worker("w", [0, 1], burst=False, env=env)
        try:
            wait_count("agents at their second turn", lambda: fleet.done(step_name("ag", 1)), 31)
            server.stop()
            server.start()
            lines = _collect(env, tmp, "ag")
        finally:
            for proc in (runner, worker):
                proc.terminate()
                proc.wait(timeout=60)
        assert [x["index"] for x in lines] == list(range(n))
        assert all((x["turns"], x["tool_calls"]) == (3, 2) for x in lines)
    finally:
        server.close()
