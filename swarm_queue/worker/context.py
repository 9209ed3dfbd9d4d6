"""What a drain loop needs of the worker it runs in, and nothing more: the engine provides it
(checked by mypy where the engine builds its drainers), so the drain loop never imports the
engine, and the two can change on their own sides of this seam."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from swarm_queue.common.errors import BadRecordError, JobGoneError
from swarm_queue.common.models import JobSpec
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import WorkerStore
from swarm_queue.worker.caps import Caps
from swarm_queue.worker.metrics import Metrics
from swarm_queue.worker.sources import Looks

__all__ = ["DrainContext"]


class DrainContext(Protocol):
    """The worker as its drain loops see it."""

    settings: Settings
    metrics: Metrics
    rand: Callable[[], float]
    # Per urgent job, the batches one endpoint may start by preemption.
    shares: dict[str, int]
    burst: bool

    @property
    def store(self) -> WorkerStore:
        """The store as the drain path uses it."""
        ...

    @property
    def looks(self) -> Looks:
        """The looks one endpoint of the process makes for all (see worker/sources.py)."""
        ...

    @property
    def caps(self) -> Caps:
        """How many lines a look may take of a job: its project's cap (see worker/caps.py)."""
        ...

    @property
    def jobs(self) -> dict[str, JobSpec]:
        """The jobs served now, by name, with the spec each was taken up with."""
        ...

    @property
    def touched(self) -> set[str]:
        """Jobs with prompts finished since the figures were last published."""
        ...

    @property
    def stopping(self) -> bool:
        """A stop was asked for: take no new work."""
        ...

    async def sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a stop; True if stopping."""
        ...

    async def refresh_jobs(self, *, force: bool = False) -> None:
        """Pick up new jobs and drop the ones over (rate-limited unless ``force``)."""
        ...

    async def any_work(self, may_serve: Callable[[JobSpec], bool] | None = None) -> bool:
        """Whether some job (that ``may_serve`` says an endpoint may serve) still has work."""
        ...

    def job_gone(self, exc: JobGoneError, spec: JobSpec | None = None) -> None:
        """Work of a job was refused: the job is gone; forget it."""
        ...

    def unreadable(self, exc: BadRecordError) -> None:
        """A key of a job cannot be used: skip the job until the next sweep."""
        ...

    async def lanes(self, spec: JobSpec) -> list[str]:
        """The live lanes ``spec``'s affinity keys may be given to (see ``route.lua``)."""
        ...

    def takers(self, spec: JobSpec) -> set[str]:
        """This worker's endpoints that may take work of ``spec``'s job now (see
        :func:`common.fleet.takers`), known here before the fleet registry shows them."""
        ...

    def reclaim_soon(self, job: str) -> None:
        """Entries of ``job`` were released: every drain loop looks for them on its next step."""
        ...
