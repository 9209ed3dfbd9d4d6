"""The fleet as its workers publish it: each endpoint's figures per job (for ``swarm-status``
and the dashboard) and its row in the fleet registry; and who serves what, read back from it,
for the commands that tell a user whether a job's model has a live endpoint
(``swarm-enqueue``'s warning, ``swarm-status``'s waiting)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

__all__ = [
    "SILENT_PERIODS",
    "EndpointInfo",
    "EndpointStats",
    "decode_endpoint_info",
    "decode_endpoint_stats",
    "live_models",
    "serving",
    "takers",
    "usable",
    "waiting_reason",
]


class EndpointStats(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """What one worker's drain loop of one endpoint did for one job, since the worker started;
    published every ``period_s`` for ``swarm-status``.

    ``circuit``: ``waiting`` (for the endpoint's /health), ``closed`` (taking work), ``open``
    (failing: its work released, the endpoint probed), ``broken`` (wrong key, model or URL: no
    more work taken); then, once, ``finished`` (the job is over for this worker) or ``stopped``
    (the worker has exited).
    """

    endpoint: str
    worker: str
    circuit: str
    done: int = 0
    failed: int = 0
    # Failed requests to the endpoint (retried, or given up and released), all jobs together.
    errors: int = 0
    last_error: str = ""
    rate_per_s: float = 0.0
    window: int = 0
    in_flight: int = 0
    updated_s: float = 0.0
    period_s: float = 0.0
    # The model the endpoint asks for the job's prompts (its own, for a job without --model).
    model: str = ""


# A worker silent for this many of its publish periods is presumed gone (killed, unreachable).
SILENT_PERIODS = 5


class EndpointInfo(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One endpoint of one worker as the fleet registry shows it: the models it serves (as its
    ``/v1/models`` lists them, LoRA adapters included) and its circuit, refreshed every
    ``period_s``. What ``swarm-enqueue`` and ``swarm-status`` read to tell whether a job's
    model is served by any live endpoint."""

    endpoint: str
    worker: str
    models: tuple[str, ...] = ()
    circuit: str = "waiting"
    updated_s: float = 0.0
    period_s: float = 0.0
    # What its worker has beyond the endpoint (see common.abilities): the functions its
    # SWARM_REDUCE_FUNCTIONS allow, and whether numpy imports there.
    functions: tuple[str, ...] = ()
    numpy: bool = False

    def live(self, now: float) -> bool:
        """True while its worker publishes (it has not been silent for SILENT_PERIODS)."""
        return now - self.updated_s <= SILENT_PERIODS * max(self.period_s, 1.0)


_endpoint_stats_decoder = msgspec.msgpack.Decoder(EndpointStats)


def decode_endpoint_stats(data: bytes) -> EndpointStats:
    return _endpoint_stats_decoder.decode(data)


_endpoint_info_decoder = msgspec.msgpack.Decoder(EndpointInfo)


def decode_endpoint_info(data: bytes) -> EndpointInfo:
    return _endpoint_info_decoder.decode(data)


def usable(e: EndpointInfo, now: float) -> bool:
    """Its worker publishes, and it can take work (a broken endpoint serves nothing)."""
    return e.live(now) and e.circuit != "broken"


def live_models(fleet: Iterable[EndpointInfo], now: float) -> list[str]:
    """Every model some live endpoint serves, sorted."""
    return sorted({m for e in fleet if usable(e, now) for m in e.models})


def serving(model: str | None, fleet: Iterable[EndpointInfo], now: float) -> int:
    """How many live endpoints serve ``model`` (None: any model)."""
    return sum(1 for e in fleet if usable(e, now) and (model is None or model in e.models))


def takers(model: str | None, fleet: Iterable[EndpointInfo], now: float) -> set[str]:
    """The live endpoints that serve ``model`` (None: any) and may take work: their circuit
    closed, or waiting for a server still starting (not open: failing)."""
    return {
        e.endpoint
        for e in fleet
        if usable(e, now) and e.circuit != "open" and (model is None or model in e.models)
    }


def waiting_reason(model: str | None, fleet: Iterable[EndpointInfo], now: float) -> str | None:
    """Why a job for ``model`` (None: any model) cannot run now, or None when a live endpoint
    serves it."""
    served = live_models(fleet, now)
    if not served:
        return "no live endpoint: no worker has published in the last few periods"
    if model is None or model in served:
        return None
    return f"no live endpoint serves model {model!r}; live endpoints serve: {', '.join(served)}"
