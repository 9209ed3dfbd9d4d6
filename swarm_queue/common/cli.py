"""What every swarm-queue command shares: the ``--redis`` option and turning errors into exits."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import io
import ipaddress
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, NoReturn

from swarm_queue.common.errors import (
    ConfigError,
    InputError,
    JobConflictError,
    JobNotFoundError,
    SwarmError,
)
from swarm_queue.common.keys import parse_stage
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.settings import DEFAULT_REDIS_URL, Settings
from swarm_queue.common.store import JobStore

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "Parser",
    "add_redis_arg",
    "default_redis_note",
    "is_loopback",
    "open_job_store",
    "plain",
    "run",
    "settings_from_args",
    "stop_on_signals",
]

EXIT_ERROR = 1
EXIT_USAGE = 2


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


_MARKUP = re.compile(r":[a-z]+:`~?([^`]+)`|``([^`]+)``")


def plain(text: str | None) -> str | None:
    """A docstring as ``--help`` shows it: without its Sphinx markup."""
    return None if text is None else _MARKUP.sub(lambda m: m.group(1) or m.group(2), text)


class Parser(argparse.ArgumentParser):
    """Every command's argument parser: its description shown without the docstring's
    markup; argparse echoes the values it refuses (an unknown ``--redis redis://:pw@host``
    among them), so any URL in its message is masked first."""

    def __init__(self, prog: str, description: str | None = None, **kwargs: Any) -> None:
        super().__init__(prog=prog, description=plain(description), **kwargs)

    def error(self, message: str) -> NoReturn:
        super().error(_URL.sub(lambda m: mask_url(m.group(0)), message))


def add_redis_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL (redis://, rediss://; a password may be in the URL). "
        "Default: $SWARM_REDIS_URL, else redis://127.0.0.1:6379/0",
    )


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """The one place a command turns environment + flags into :class:`Settings`."""
    settings = Settings.from_env(os.environ, redis_url=getattr(args, "redis", None), **overrides)
    note = default_redis_note(settings)
    if note:
        print(f"{Path(sys.argv[0]).name}: {note}", file=sys.stderr)
    return settings


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, for a server that stops between its own steps (a
    second signal ends the process at once). Setting an event, rather than cancelling what
    the loop awaits, keeps a stop from being lost inside a Redis call."""
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            os._exit(130)  # asked twice: stop now
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    return stop


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on) is this host only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def default_redis_note(settings: Settings) -> str:
    """What a process says when it uses the default Redis because no URL was given (on a
    shared node ``127.0.0.1:6379`` may be someone else's); "" when one was."""
    if not settings.redis_defaulted:
        return ""
    return (
        f"using the default Redis {DEFAULT_REDIS_URL} (SWARM_REDIS_URL is not set; "
        "`swarm-redis start` runs one of your own)"
    )


@contextlib.asynccontextmanager
async def open_job_store(
    args: argparse.Namespace, *, patient: bool = True
) -> AsyncIterator[tuple[str, JobStore]]:
    """``(job, store)`` for a command working on ``args.job``: settings parsed, the job name
    validated (a user's, or a job of a workflow: ``job:s1``, a pipeline's step), the store
    closed on the way out (see :func:`common.store.connect` for patience)."""
    settings = settings_from_args(args)
    job = args.job
    parse_stage(job)
    store = JobStore.from_settings(settings, patient=patient)
    try:
        yield job, store
    finally:
        # Bounded: a command's work is done here, and a cluster client's close was seen to
        # wait without end after a failover.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(store.close(), CLOSE_S)


# How long a command waits for its Redis connections to close once its work is done.
CLOSE_S = 5.0


def run(prog: str, coro: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine; print swarm errors as one clear line and map them to exits.
    ``kill -USR1 PID`` prints every thread's stack on stderr: where a command that seems
    stuck waits."""
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # (no real stderr: none)
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        # An interrupt before the loop ran it leaves the coroutine unstarted: closed here, it
        # says nothing more ("never awaited"); closing one that ran is a no-op.
        coro.close()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``swarm-status JOB | head -1``): end quietly, as a tool
        # killed by SIGPIPE would, and keep the interpreter's last flush from complaining.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (ConfigError, InputError, JobConflictError, JobNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SwarmError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
