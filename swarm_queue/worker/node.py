"""``swarm-node``: one compute node in one command. It starts the node's inference engines (one
per device, each on a port of its own), drains them with one worker process, restarts an
engine that dies (with backoff; its work goes to the others meanwhile), and on SIGTERM (a
scheduler's walltime) stops the worker first, within its grace, then the engines:

    swarm-node --engines 4 --engine 'vllm serve MODEL --port {port}' \\
        --device-env CUDA_VISIBLE_DEVICES

``{port}`` and ``{index}`` in the engine command are each engine's; ``--device-env VAR`` sets
VAR to the engine's index (Aurora's tiles: ``ZE_AFFINITY_MASK``). Each engine logs to
``--log-dir``/engine-N.log, the worker to worker.log. With ``--burst`` the node ends once no
work is left for it: the worker exits, then the engines are stopped.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from swarm_queue.common.backoff import backoff_s
from swarm_queue.common.cli import Parser, plain
from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.settings import Settings

__all__ = ["Engine", "main"]

# How often the node looks at its processes, and how long an engine has to stop on SIGTERM
# before it is killed.
LOOK_S = 0.5
ENGINE_STOP_S = 15.0
# An engine's restarts wait 1-2, 2-4, 4-8... seconds (a healthy start resets them), at most
# this long.
RESTART_CAP_S = 60.0


def say(message: str) -> None:
    print(f"swarm-node: {message}", file=sys.stderr, flush=True)


class Engine:
    """One inference engine of the node: its command, port, device and log; started again on
    the same port when it dies."""

    def __init__(
        self, index: int, command: str, port: int, device_env: str | None, log_dir: Path
    ) -> None:
        self.index, self.port = index, port
        self.argv = [a.format(port=port, index=index) for a in shlex.split(command)]
        self.env = dict(os.environ)
        if device_env:
            self.env[device_env] = str(index)
        self.log = log_dir / f"engine-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.healthy_at: float | None = None
        self.started_at = 0.0
        self.late_said = False
        self.restarts = 0
        self.given_up = False  # it died --restarts times in a row, never healthy between
        self.due = 0.0  # when a dead engine starts again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        out: IO[bytes]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: its children stop with it
            )  # fmt: skip
        self.healthy_at, self.started_at, self.late_said = None, time.monotonic(), False
        say(f"engine {self.index} started (pid {self.proc.pid}, port {self.port})")

    def healthy(self) -> bool:
        """Whether it answers ``/health`` (vLLM's, once its model is loaded)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)


class Node:
    """The engines and the worker of one node, looked after until stopped."""

    def __init__(self, args: argparse.Namespace, grace_s: float) -> None:
        self.args, self.grace_s = args, grace_s
        self.log_dir = Path(args.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.engines = [
            Engine(i, args.engine, free_port(), args.device_env, self.log_dir)
            for i in range(args.engines)
        ]
        self.worker: subprocess.Popen[bytes] | None = None
        self.stopping: str | None = None

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: self._stop(f"{signal.Signals(s).name} received"))
        try:
            for engine in self.engines:
                engine.start()
        except OSError as exc:  # not there, not runnable: nothing would ever start it
            say(f"error: cannot start the engine command {self.engines[0].argv[0]!r}: {exc}")
            self._stop_engines()
            return 2
        self._start_worker()
        while self.stopping is None:
            self._look()
            assert self.worker is not None
            if (status := self.worker.poll()) is not None:
                say(f"the worker exited with status {status}")
                self._stop_engines()
                return status
            if all(e.given_up for e in self.engines):
                # Nothing left to serve the worker: the node ends, never waits for ever.
                self._stop("error: every engine given up on")
                self._shut_down()
                return 1
            time.sleep(LOOK_S)
        return self._shut_down()

    def _start_worker(self) -> None:
        env = {**os.environ, "SWARM_ENDPOINTS": ",".join(e.url for e in self.engines)}
        argv = [sys.executable, "-m", "swarm_queue.worker.main"]
        with open(self.log_dir / "worker.log", "ab") as out:
            self.worker = subprocess.Popen(
                argv + (["--burst"] if self.args.burst else []),
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        say(f"worker started (pid {self.worker.pid}) on {len(self.engines)} engines")

    def _look(self) -> None:
        """Each engine: healthy yet, dead (restarted after its backoff), or waited for."""
        now = time.monotonic()
        for e in self.engines:
            assert e.proc is not None
            if e.proc.poll() is not None:
                if e.given_up:
                    continue
                if not e.due and e.restarts >= self.args.restarts:
                    e.given_up = True
                    say(f"engine {e.index} given up on: it died {e.restarts + 1} times, never "
                        f"healthy between (see {e.log})")  # fmt: skip
                elif not e.due:
                    e.restarts += 1
                    wait = backoff_s(e.restarts - 1, base_s=2.0, cap_s=RESTART_CAP_S)
                    e.due = now + wait
                    why = f"engine {e.index} exited with status {e.proc.returncode}"
                    say(
                        f"{why}; restarting in {wait:.0f} s (its work goes to the others meanwhile)"
                    )
                elif now >= e.due:
                    e.due = 0.0
                    try:
                        e.start()
                    except OSError as exc:  # (its command went meanwhile: tried again later)
                        say(f"engine {e.index} could not start: {exc}")
            elif e.healthy_at is None and e.healthy():
                e.healthy_at, e.restarts = now, 0
                say(f"engine {e.index} healthy after {now - e.started_at:.0f} s")
            elif (
                e.healthy_at is None
                and not e.late_said
                and (now - e.started_at > self.args.health_timeout_s)
            ):
                e.late_said = True
                late = f"engine {e.index} not healthy after {self.args.health_timeout_s:.0f} s"
                say(f"{late}: see {e.log}")

    def _stop(self, why: str) -> None:
        if self.stopping is None:
            self.stopping = why

    def _shut_down(self) -> int:
        """The worker first (it hands back what it holds within its grace), then the
        engines; whatever is still running past its time is killed."""
        say(f"{self.stopping}: stopping the worker (grace {self.grace_s:.0f} s)")
        assert self.worker is not None
        if self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
        try:
            status = self.worker.wait(self.grace_s + 10)
        except subprocess.TimeoutExpired:
            os.killpg(self.worker.pid, signal.SIGKILL)
            status = self.worker.wait()
        self._stop_engines()
        say(f"stopped (the worker's status {status})")
        return status

    def _stop_engines(self) -> None:
        for e in self.engines:
            e.stop()
        deadline = time.monotonic() + ENGINE_STOP_S
        for e in self.engines:
            if e.proc is None:
                continue
            try:
                e.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                e.stop(signal.SIGKILL)
                e.proc.wait()


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="swarm-node", description=plain((__doc__ or "").split("\n\n")[0]))
    p.add_argument("--engines", type=int, default=1, metavar="N", help="engines to start (1)")
    p.add_argument(
        "--engine", required=True, metavar="CMD",
        help="each engine's command; {port} and {index} are its own "
        "(e.g. 'vllm serve MODEL --port {port}')",
    )  # fmt: skip
    p.add_argument(
        "--device-env", metavar="VAR",
        help="set VAR to each engine's index (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK...)",
    )  # fmt: skip
    p.add_argument("--log-dir", default="swarm-node-logs", help="engine-N.log and worker.log")
    p.add_argument(
        "--health-timeout-s", type=float, default=1800.0, metavar="S",
        help="say an engine is not healthy after S seconds (a large model loads for minutes)",
    )  # fmt: skip
    p.add_argument(
        "--restarts", type=int, default=5, metavar="N",
        help="give an engine up after N restarts in a row with no healthy start between (5); "
        "the node ends with status 1 once every engine is given up",
    )  # fmt: skip
    p.add_argument("--burst", action="store_true", help="end once no work is left for the node")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.engines < 1:
        parser().error("--engines must be at least 1")
    if "{port}" not in args.engine:
        parser().error("--engine must take its port: put {port} where the command names it")
    try:
        grace_s = Settings.from_env(os.environ).shutdown_grace_s
    except ConfigError as exc:
        print(f"swarm-node: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(Node(args, grace_s).run())


if __name__ == "__main__":
    main()
