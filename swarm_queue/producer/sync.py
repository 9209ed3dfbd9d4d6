"""The Python API without an event loop of one's own: :class:`SyncSwarm` for scripts and
notebooks (where a loop already runs, so ``asyncio.run`` cannot), and the one-call
:func:`gather_prompts`. The :class:`~producer.api.Swarm` behind it runs in an event loop on a
thread of its own; each call waits for its result there."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator, Sequence
from typing import Any, TypeVar, cast

from swarm_queue.common.final import ReduceOutput
from swarm_queue.common.models import Result
from swarm_queue.common.store import JobStatus
from swarm_queue.producer.api import Swarm

__all__ = ["SyncSwarm", "gather_prompts"]

T = TypeVar("T")


class SyncSwarm:
    """:class:`~producer.api.Swarm`'s session, called without ``await``: ``with
    SyncSwarm(url) as swarm: job = swarm.submit(df, column="question")``. Its arguments are
    Swarm's."""

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        self._swarm = Swarm(url, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SyncSwarm:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="swarm-loop", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._swarm.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(self._swarm.__aexit__(None, None, None))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
        self._loop = self._thread = None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("use SyncSwarm inside 'with'")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, prompts: Any, **kwargs: Any) -> str:
        """:meth:`Swarm.submit <producer.api.Swarm.submit>`."""
        return self._call(self._swarm.submit(prompts, **kwargs))

    def results(self, job: str, **kwargs: Any) -> Iterator[Result]:
        """:meth:`Swarm.results <producer.api.Swarm.results>`, as a plain iterator."""
        agen = cast(AsyncGenerator[Result, None], self._swarm.results(job, **kwargs))

        async def step() -> Result:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self._call(step())
                except StopAsyncIteration:
                    return
        finally:
            if self._loop is not None:
                self._call(agen.aclose())

    def gather(self, job: str) -> list[Result]:
        return self._call(self._swarm.gather(job))

    def frame(self, job: str) -> Any:
        """:meth:`Swarm.frame <producer.api.Swarm.frame>`: a pandas DataFrame."""
        return self._call(self._swarm.frame(job))

    def dataset(self, job: str) -> Any:
        """:meth:`Swarm.dataset <producer.api.Swarm.dataset>`: a ``datasets.Dataset``."""
        return self._call(self._swarm.dataset(job))

    def final(self, job: str, *, wait: bool = True) -> ReduceOutput | None:
        return self._call(self._swarm.final(job, wait=wait))

    def status(self, job: str) -> JobStatus:
        return self._call(self._swarm.status(job))

    def cancel(self, job: str) -> None:
        self._call(self._swarm.cancel(job))


def gather_prompts(
    prompts: Any, endpoints: Sequence[str] = (), *, url: str | None = None, **options: Any
) -> list[Result]:
    """:func:`~producer.api.scatter_gather` without ``await``: prompts (or a DataFrame...)
    in, results out in the same order."""
    with SyncSwarm(url, endpoints=endpoints) as swarm:
        return swarm.gather(swarm.submit(prompts, **options))
