"""Who serves what: the fleet registry read back, for the commands that tell a user whether a
job's model has a live endpoint (``swarm-enqueue``'s warning, ``swarm-status``'s waiting)."""

from __future__ import annotations

from collections.abc import Iterable

from common.models import EndpointInfo

__all__ = ["live_models", "serving", "waiting_reason"]


def _usable(e: EndpointInfo, now: float) -> bool:
    """Its worker publishes, and it can take work (a broken endpoint serves nothing)."""
    return e.live(now) and e.circuit != "broken"


def live_models(fleet: Iterable[EndpointInfo], now: float) -> list[str]:
    """Every model some live endpoint serves, sorted."""
    return sorted({m for e in fleet if _usable(e, now) for m in e.models})


def serving(model: str | None, fleet: Iterable[EndpointInfo], now: float) -> int:
    """How many live endpoints serve ``model`` (None: any model)."""
    return sum(1 for e in fleet if _usable(e, now) and (model is None or model in e.models))


def waiting_reason(model: str | None, fleet: Iterable[EndpointInfo], now: float) -> str | None:
    """Why a job for ``model`` (None: any model) cannot run now, or None when a live endpoint
    serves it."""
    served = live_models(fleet, now)
    if not served:
        return "no live endpoint: no worker has published in the last few periods"
    if model is None or model in served:
        return None
    return f"no live endpoint serves model {model!r}; live endpoints serve: {', '.join(served)}"
