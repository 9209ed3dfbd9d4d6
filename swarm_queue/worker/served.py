"""The models one endpoint serves: which jobs it may take.

Read from the endpoint's ``/v1/models`` (the base model first, then LoRA adapters) when it
first answers, re-read every ``models_refresh_s``, and soon after a 404 for a model (an adapter
unloaded, a server restarted with another model): a job whose model the endpoint does not
serve is left to endpoints that do, and never makes this one unusable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from swarm_queue.common.errors import EndpointError, EndpointRetryable
from swarm_queue.common.models import JobSpec
from swarm_queue.common.request import route_of
from swarm_queue.common.settings import Settings
from swarm_queue.worker.backend import Backend

__all__ = ["MODELS_RECHECK_S", "ServedModels"]

log = logging.getLogger("swarm.worker")

# After a 404 for a model, the served models are re-read this much later at the soonest: a
# server that lists a model it then refuses costs one request per job this often, no more.
MODELS_RECHECK_S = 5.0


class ServedModels:
    """The models of the endpoint of ``client``; ``names`` is None until it has answered."""

    def __init__(self, client: Backend, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.names: tuple[str, ...] | None = None
        # (model, route) the server has no route for (a generating server's /v1/embeddings,
        # a pooling server's generation routes): learnt from its 404 once and kept, as a
        # server's runner does not change while it runs; forgotten when its models change.
        self.missing: set[tuple[str, str]] = set()
        self._stale = asyncio.Event()

    def serves(self, spec: JobSpec) -> bool:
        """True when the endpoint takes work of ``spec``'s job: it serves the job's model (a
        job without one takes the endpoint's own)."""
        if not self.names:
            return False
        if spec.model is not None and spec.model not in self.names:
            return False
        return (self.model_for(spec) or "", route_of(spec)) not in self.missing

    def may_serve(self, spec: JobSpec) -> bool:
        """Like :meth:`serves`, but True while the served models are not yet known."""
        return self.names is None or self.serves(spec)

    def model_for(self, spec: JobSpec) -> str | None:
        """The model to ask for: the job's, else the endpoint's own (the first it lists)."""
        return spec.model or (self.names[0] if self.names else None)

    async def read(self) -> None:
        """Read them now; EndpointRetryable while the endpoint lists none."""
        infos = await self.client.models(timeout_s=self.settings.probe_timeout_s)
        names = tuple(m.id for m in infos)
        if not names:
            raise EndpointRetryable(self.client.label, "serves no model (/v1/models is empty)")
        if names != self.names:
            log.info("%s: serves %s", self.client.label, ", ".join(names))
            if self.names is not None:
                self.missing.clear()  # restarted with other models: its routes anew
            self.names = names

    def refused(self, model: str | None, route: str | None = None) -> bool:
        """The endpoint answered 404 for ``model``: it takes no work for it until the models,
        re-read soon, say otherwise; for its ``route`` only (a route it lacks), for good.
        True when the news is new."""
        if route is not None:
            new = (model or "", route) not in self.missing
            self.missing.add((model or "", route))
            return new
        self._stale.set()
        if self.names is None or model not in self.names:
            return False
        self.names = tuple(m for m in self.names if m != model)
        return True

    async def follow(
        self, sleep: Callable[[float], Awaitable[bool]], paused: Callable[[], bool]
    ) -> None:
        """Re-read the models every ``models_refresh_s``, and :data:`MODELS_RECHECK_S` after
        a 404; not while ``paused()`` (the probe reads them when the endpoint answers again).
        Returns when ``sleep`` says the worker stops."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stale.wait(), self.settings.models_refresh_s)
            if await sleep(MODELS_RECHECK_S if self._stale.is_set() else 0):
                return
            self._stale.clear()
            if paused():
                continue
            try:
                await self.read()
            except EndpointError as exc:  # requests will tell if the endpoint is in trouble
                log.debug("%s: served models not re-read: %s", self.client.label, exc)
