"""The process harness shared by the tests with real processes: the installed commands, a
swarm-sim process with worker processes around one Redis and key prefix (:class:`Fleet`), and
the checks of their output. Tests get a Fleet through conftest's ``fleet_factory``."""

from __future__ import annotations

import contextlib
import http.server
import os
import shlex
import signal
import string
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import msgspec
import redis

from swarm_queue.common.embedded import EmbeddedRedis, free_port
from swarm_queue.common.keys import Keys
from swarm_queue.common.reduce import render
from swarm_queue.sim.launch import SimExited, launch, wait_listening
from swarm_queue.sim.text import completion_for
from tests.servers import redis_server

__all__ = [
    "BIN",
    "MAX_MODEL_LEN",
    "MAX_TOKENS",
    "TEMPLATE",
    "Fleet",
    "FleetFactory",
    "RedisClusterProcs",
    "agents_unfinished",
    "check_output",
    "collect",
    "command",
    "doc_acl_user",
    "expected_tree",
    "fleet_prompt",
    "sync_client",
    "wait_port",
]

BIN = Path(sys.executable).parent


def command(
    env: Mapping[str, str], *args: str | Path, stdin: str = "", timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """One installed command (``swarm-...`` and its arguments) run with ``env``, ``stdin`` on
    its standard input, its output captured as text."""
    return subprocess.run(
        [BIN / str(args[0]), *map(str, args[1:])],
        input=stdin,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


REPO = Path(__file__).resolve().parent.parent


def doc_acl_user(doc: str, **values: str) -> tuple[str, ...]:
    """The redis-server ``--user`` arguments of the recipe in ``doc`` (a path under the
    repository), as a shell passes them with ``values`` for its variables: what a test starts
    Redis with, read from the file so the two cannot drift."""
    lines = (REPO / doc).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("--user "))
    text = lines[first]
    while text.endswith("\\"):
        first += 1
        text = text[:-1] + lines[first]
    words = shlex.split(text)
    end = next((i for i, w in enumerate(words[1:], 1) if w.startswith("--")), len(words))
    return tuple(string.Template(w).substitute(values) for w in words[:end])


def sync_client(url: str, *, cluster: bool = False) -> redis.Redis:
    """A plain Redis client of ``url`` for a test's own looks, a cluster client on a Redis
    Cluster (it follows the slots, a failover included)."""
    if cluster:
        return redis.RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


def collect(
    env: Mapping[str, str], job: str, out: Path, *extra: str, stall_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``swarm-collect JOB --out OUT --wait`` run with ``env`` (its Redis and prefix), waited
    for as long as the job moves: it fails only when neither the job's results in Redis (its
    steps' and stages' included) nor the output grew for ``stall_s``. A loaded machine is
    slow, not stuck: no fixed time limit stands in for progress."""
    client = sync_client(env["SWARM_REDIS_URL"], cluster=bool(env.get("SWARM_REDIS_CLUSTER")))
    pattern = Keys(env["SWARM_PREFIX"]).job_pattern(job).replace("{", "\\{").replace("}", "\\}")
    logs = out.with_name(f"{out.name}.collect")
    with open(f"{logs}.out", "w+") as so, open(f"{logs}.err", "w+") as se:
        proc = subprocess.Popen(
            [BIN / "swarm-collect", job, "--out", out, "--wait", *extra],
            env=dict(env),
            stdout=so,
            stderr=se,
            text=True,
        )
        try:
            last: tuple[int, int] | None = None
            since = time.monotonic()
            while proc.poll() is None:
                metas = [
                    k for k in client.scan_iter(match=pattern, count=1000) if k.endswith(b":meta")
                ]
                moved = sum(int(x or 0) for k in metas for x in client.hmget(k, ["done", "failed"]))
                mark = (moved, out.stat().st_size if out.exists() else 0)
                if mark != last:
                    last, since = mark, time.monotonic()
                elif time.monotonic() - since > stall_s:
                    proc.send_signal(signal.SIGUSR1)  # its stacks on stderr: where it waits
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=2)
                    proc.kill()
                    proc.wait()
                    se.seek(0)
                    raise AssertionError(
                        f"swarm-collect {job}: no progress for {stall_s:g} s: {se.read()[-6000:]}"
                    )
                time.sleep(0.2)
        finally:
            client.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        so.seek(0)
        se.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, so.read(), se.read())


def agents_unfinished(env: Mapping[str, str], job: str, total: int, show: int = 5) -> str:
    """Where the first ``show`` unfinished agents of agent job ``job`` stand, read from Redis:
    what a test whose agents stopped moving says of them (their state, the tool calls a
    parked one waits on with each call's claim and answer, each turn's pending entries)."""
    keys = Keys(env["SWARM_PREFIX"])
    client = sync_client(env["SWARM_REDIS_URL"], cluster=bool(env.get("SWARM_REDIS_CLUSTER")))
    try:
        done = client.hmget(keys.outcomes(job), [str(i) for i in range(total)])
        missing = [i for i, d in enumerate(done) if d is None]
        lines = [f"{len(missing)} of {total} agents unfinished: {missing[:50]}"]
        for i in missing[:show]:
            parked = client.hget(keys.parked(job), str(i))
            state = client.hget(keys.input_states(job), str(i))
            counts = msgspec.msgpack.decode(state) if state else {}
            counts.pop("prior", None)
            lines.append(f"agent {i}: state {counts}")
            if parked is None:
                lines.append("  not parked")
                continue
            wait = msgspec.msgpack.decode(parked)
            lines.append(f"  parked at turn {wait.get('turn')} since {wait.get('since_s')}")
            for key, call in wait.get("calls", []):
                claim = keys.tool_claim(key) if key else ""
                lines.append(
                    f"  call {call} key {key!r}: claim {client.get(claim) if key else '-'!r} "
                    f"for {client.pttl(claim) if key else '-'} ms, answer "
                    f"{bool(client.exists(keys.tool_answer(key))) if key else '-'}"
                )
        pattern = keys.job_pattern(job).replace("{", "\\{").replace("}", "\\}")
        for k in client.scan_iter(match=pattern):
            if client.type(k) == b"stream":
                for group in client.xinfo_groups(k):
                    pending = client.xpending(k, group["name"])
                    lines.append(
                        f"{k.decode()} group {group['name'].decode()}: "
                        f"pending {pending['pending']} {pending.get('consumers')}"
                    )
        return "\n".join(lines)
    finally:
        client.close()


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Wait until something listens on ``port``; fail if ``proc`` (its server) exits first."""
    wait_listening([port], proc, timeout_s)


MAX_TOKENS = 12
MAX_MODEL_LEN = 600


def over_context(limit: int) -> str:
    """How vLLM 0.32 (and swarm-sim) begins its refusal of a prompt over a context of ``limit``."""
    return (
        f"This model's maximum context length is {limit} tokens. However, your prompt contains "
        f"at least {limit + 1} input tokens, which exceeds this limit even without any output "
        "tokens."
    )


# The refusal of a Fleet job's poison prompt (see fleet_prompt).
OVER_CONTEXT = over_context(MAX_MODEL_LEN)


def fleet_prompt(i: int, poison: set[int]) -> str:
    """Prompt ``i`` of a Fleet job: over the context where ``i`` is in ``poison``."""
    # Over the simulator's context (600 tokens = 2,400 characters) with 12 output tokens.
    return "p" * 3000 if i in poison else f"Explain observation #{i} of the survey."


class RedisClusterProcs:
    """A Redis Cluster of ``n`` primaries on loopback ports, each a redis-server child process
    (``--cluster-enabled yes``), the 16384 slots split evenly between them; with ``replicas``,
    one replica of each primary (``nodes[n + i]`` of ``nodes[i]``), AOF on, that takes over
    when its primary fails for ``node_timeout_ms``."""

    def __init__(self, n: int = 3, *, replicas: bool = False, node_timeout_ms: int = 5000) -> None:
        self.primaries = n
        self.node_timeout_s = node_timeout_ms / 1000
        self.nodes = [
            redis_server(
                appendonly=replicas,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                ),
            )
            for _ in range(2 * n if replicas else n)
        ]

    @property
    def url(self) -> str:
        """The URL of one node: a cluster client finds the others from it."""
        return self.nodes[0].url

    def start(self, timeout_s: float = 90.0) -> RedisClusterProcs:
        """Start the nodes and form the cluster (gossip is slow on a loaded machine: a long
        limit); on failure, every node started is stopped again."""
        try:
            return self._start(timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, timeout_s: float) -> RedisClusterProcs:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=node.port) for node in self.nodes]
        n = self.primaries
        try:
            share = 16384 // n
            for i, client in enumerate(clients[:n]):
                hi = 16384 if i == n - 1 else (i + 1) * share
                client.execute_command("CLUSTER ADDSLOTS", *range(i * share, hi))
            deadline, met = time.monotonic() + timeout_s, 0.0
            while not all(_cluster_ok(c, len(clients)) for c in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not come up")
                # A handshake not answered within the node timeout is dropped, never tried
                # again (seen under the suite's load): meet again until every node is known.
                if time.monotonic() - met > 3 * self.node_timeout_s:
                    for node in self.nodes[1:]:
                        clients[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
                    met = time.monotonic()
                time.sleep(0.05)
            for primary, replica in zip(clients[:n], clients[n:], strict=False):
                replica.execute_command(
                    "CLUSTER REPLICATE", primary.execute_command("CLUSTER MYID")
                )
            while not all(
                r.info("replication").get("master_link_status") == "up" for r in clients[n:]
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster's replicas did not come up")
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()
        return self

    def primary_of(self, key: str) -> EmbeddedRedis:
        """The node that serves ``key`` now (after a failover, the replica that took over)."""
        live = next(x for x in self.nodes if x.proc is not None and x.proc.poll() is None)
        with redis.RedisCluster(host="127.0.0.1", port=live.port) as client:
            node = client.get_node_from_key(key)
        return next(x for x in self.nodes if x.port == int(node.port))

    def fail_over(self, key: str, *, takeover: bool = False, timeout_s: float = 60.0) -> None:
        """Move ``key``'s slot to the replica of its primary (``CLUSTER FAILOVER``, or without
        the primary's agreement with ``takeover``), asked again every 5 s until that replica
        serves it: under load the first ask was seen to leave the slot where it was for a
        minute."""
        replica = self.nodes[self.primaries + self.node_of(key)]
        args = ("CLUSTER FAILOVER", "TAKEOVER") if takeover else ("CLUSTER FAILOVER",)
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=replica.port) as client:
            while True:
                client.execute_command(*args)
                again = time.monotonic() + 5.0
                while time.monotonic() < again:
                    if self.primary_of(key) is replica:
                        return
                    time.sleep(0.05)
                assert time.monotonic() < deadline, f"{key}'s slot never moved to its replica"

    def node_of(self, key: str) -> int:
        """Which of the primaries, as started, serves ``key``."""
        with redis.Redis(port=self.nodes[0].port) as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
        return min(slot // (16384 // self.primaries), self.primaries - 1)

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _cluster_ok(client: redis.Redis, n: int) -> bool:
    info = client.execute_command("CLUSTER INFO")  # parsed by redis-py into a dict
    return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == n


class FleetFactory(Protocol):
    """What conftest's ``fleet_factory`` fixture is: ``fleet_factory(n_ports, *sim_args,
    url=...)`` makes a :class:`Fleet` around the test's Redis (or ``url``) and key prefix."""

    def __call__(self, n_ports: int, *sim_args: str, url: str = ...) -> Fleet: ...


class Fleet:
    """A swarm-sim process, worker processes and helpers around one Redis and key prefix."""

    def __init__(self, tmp: Path, redis_url: str, prefix: str, n_ports: int, *sim_args: str):
        self.tmp, self.redis_url, self.prefix = tmp, redis_url, prefix
        self.ports = [free_port() for _ in range(n_ports)]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        self.env.update(
            SWARM_REDIS_URL=redis_url,
            SWARM_PREFIX=prefix,
            SWARM_POLL_MS="50",
            SWARM_JOBS_REFRESH_S="0.2",
            SWARM_BACKOFF_BASE_S="0.05",
            SWARM_BACKOFF_CAP_S="0.5",
        )
        args = ("--step-ms", "2", "--max-model-len", str(MAX_MODEL_LEN), *sim_args)
        for attempt in range(3):  # a port taken meanwhile by another test: choose others
            try:
                self.sim = launch(self.ports, *args)
                break
            except SimExited:
                if attempt == 2:
                    raise
                self.ports = [free_port() for _ in range(n_ports)]
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def worker(
        self,
        name: str,
        endpoints: list[int],
        *,
        burst: bool = True,
        arq_cli: bool = False,
        env: Mapping[str, str] | None = None,
        **extra: str,
    ) -> subprocess.Popen[bytes]:
        """A worker process on the given ports: ``swarm-worker``, or with ``arq_cli`` the same
        worker through ``arq swarm_queue.worker.WorkerSettings``; ``env`` and ``extra``: environment
        variables."""
        env = {
            **self.env,
            "SWARM_WORKER_NAME": name,
            "SWARM_ENDPOINTS": ",".join(self.url(i) for i in endpoints),
            **(env or {}),
            **extra,
        }
        log = self.tmp / f"worker-{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                (
                    [sys.executable, "-m", "arq", "swarm_queue.worker.WorkerSettings"]
                    if arq_cli
                    else [sys.executable, "-m", "swarm_queue.worker.main"]
                )
                + (["--burst"] if burst else []),
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        self.workers.append(proc)
        return proc

    def enqueue(self, job: str, n: int, poison: set[int], *args: str) -> subprocess.Popen[bytes]:
        src = self.tmp / f"{job}.txt"
        src.write_text("".join(fleet_prompt(i, poison) + "\n" for i in range(n)))
        with open(self.tmp / f"enqueue-{job}.log", "wb") as log:
            return subprocess.Popen(
                [BIN / "swarm-enqueue", src, "--job", job, "--max-tokens", str(MAX_TOKENS), *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def collect(self, job: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [BIN / "swarm-collect", job, "--out", self.tmp / f"{job}.jsonl", "--wait"],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def done(self, job: str) -> int:
        client = sync_client(self.redis_url, cluster=bool(self.env.get("SWARM_REDIS_CLUSTER")))
        try:
            raw = client.hmget(Keys(self.prefix).meta(job), ["done", "failed"])
        except (redis.ConnectionError, redis.exceptions.ClusterError):
            return 0
        finally:
            client.close()
        return sum(int(x or 0) for x in raw)

    def answered(self, i: int) -> int:
        """Sequences port ``i`` has generated (vLLM's ``request_success_total``)."""
        return self._counter(i, "vllm:request_success_total")

    def requests(self, i: int) -> int:
        """Generation requests port ``i`` has received, answered or not (swarm-sim's own)."""
        return self._counter(i, "swarm_sim:http_requests_total")

    def peak(self, i: int) -> int:
        """The most sequences port ``i``'s engine ever ran at once (swarm-sim's own)."""
        return self._counter(i, "swarm_sim:peak_running")

    def _counter(self, i: int, name: str) -> int:
        with urllib.request.urlopen(f"{self.url(i)}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith(name)
        )

    def faults(self, i: int, **faults: object) -> None:
        req = urllib.request.Request(
            f"{self.url(i)}/sim/faults",
            data=msgspec.json.encode(faults),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=5).read()

    def close(self) -> None:
        for proc in [*self.workers, self.sim]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


TEMPLATE = "Level {level}: merge these findings into one.\n{responses}\nMerged:"


def expected_tree(n: int, fanin: int) -> tuple[str, list[int]]:
    """The final answer of a tree reduce of Fleet prompts 0..n-1 with :data:`TEMPLATE`, and the
    prompts at each level."""
    answers = [completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0] for i in range(n)]
    per_level, level = [], 0
    while len(answers) > 1:
        level += 1
        sup = [
            render(TEMPLATE, answers[i : i + fanin], level) for i in range(0, len(answers), fanin)
        ]
        per_level.append(len(sup))
        answers = [completion_for(p, 2 * MAX_TOKENS)[0] for p in sup]
    return answers[0].strip(), per_level


def check_output(path: Path, n: int, poison: set[int]) -> None:
    lines = [msgspec.json.decode(x) for x in path.read_bytes().splitlines()]
    assert len(lines) == n
    assert [x["index"] for x in lines] == list(range(n))  # in order, so no index twice
    failed = {x["index"] for x in lines if x["error"] is not None}
    assert failed == poison
    for x in lines:
        if x["index"] in poison:
            assert x["error"].startswith(OVER_CONTEXT)
            assert x["model"], x  # the model it was asked of (seen: "" on every rejection)
        else:
            assert x["text"] == completion_for(fleet_prompt(x["index"], poison), MAX_TOKENS)[0]


class WrongKey(http.server.BaseHTTPRequestHandler):
    """vLLM started with --api-key, asked with another key: /health is open, /v1 refuses."""

    def _answer(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
            return
        body = b'{"error": {"message": "invalid API key", "code": 401}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def wrong_key_endpoint() -> Iterator[str]:
    """The URL of a :class:`WrongKey` server, for as long as the block runs: an endpoint a
    worker finds unusable (``broken``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WrongKey)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# What the agent tests share: their output schema and their task, whose two directives have the
# simulator call tests.agent_tools's slow_add (the same for every agent) then fetch (each its own).
AGENT_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}
# swarm-sim started as vLLM must be for agents whose model decides on its tools (tool_choice
# "auto", the default): without these flags both refuse such a request.
TOOL_PARSER_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")

AGENT_TASK = (
    'Find paper {n}. CALL slow_add({{"a": 1, "b": 2}}) then CALL fetch({{"url": "doc{n}"}})'
)


def tool_runner(env: Mapping[str, str], log: Path, out: Path) -> subprocess.Popen[bytes]:
    """A tool runner process (``swarm-tools``, as ``python -m swarm_queue.tools.runner``) running
    tests.agent_tools (all of them, unless ``env`` says SWARM_TOOLS), each run written to
    ``log``, its output to ``out``; ``env``: its Redis and any other setting."""
    repo = Path(__file__).resolve().parent.parent
    full = {
        "PATH": "/usr/bin:/bin",
        "SWARM_TOOLS": "tests.agent_tools:*",
        **env,
        "SWARM_TEST_TOOL_LOG": str(log),
    }
    with open(out, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "swarm_queue.tools.runner"],
            cwd=repo,
            env=full,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
