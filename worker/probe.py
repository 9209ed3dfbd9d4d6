"""One probe of an endpoint: what tells that it can take work again (see :mod:`worker.circuit`,
which runs one prober per endpoint)."""

from __future__ import annotations

import contextlib

from common.errors import EndpointRejected, EndpointRetryable, ModelNotServed
from common.models import SamplingParams
from worker.backend import Backend
from worker.served import ServedModels

__all__ = ["probe_endpoint"]


async def probe_endpoint(
    client: Backend, served: ServedModels, *, timeout_s: float, generate: bool
) -> None:
    """``/health``, then the models served (read again: a restarted server may serve others),
    and with ``generate`` one token of one prompt: after failures, since a hung engine still
    answers the first two. Raises an EndpointError while the endpoint cannot work; a refusal
    of the token is an answer too (the server is alive), a timeout or a 5xx is not."""
    if not await client.ready(timeout_s):
        raise EndpointRetryable(client.label, "/health not ready")
    await served.read()
    if generate and served.names:
        with contextlib.suppress(EndpointRejected, ModelNotServed):
            await client.complete(
                served.names[0], ["ping"], SamplingParams(max_tokens=1), timeout_s=timeout_s
            )
