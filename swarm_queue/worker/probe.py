"""One probe of an endpoint: what tells that it can take work again (see :mod:`worker.circuit`,
which runs one prober per endpoint)."""

from __future__ import annotations

import contextlib

from swarm_queue.common.errors import EndpointRejected, EndpointRetryable, ModelNotServed
from swarm_queue.common.models import SamplingParams
from swarm_queue.worker.backend import Backend
from swarm_queue.worker.served import ServedModels
from swarm_queue.worker.verify import (
    EMBEDDINGS,
    check_choice_indices,
    check_vectors,
    missing_choices,
)

__all__ = ["probe_endpoint"]


async def probe_endpoint(
    client: Backend,
    served: ServedModels,
    *,
    timeout_s: float,
    generate: bool,
    embeddings: bool = False,
    samples: int = 1,
) -> None:
    """``/health``, then the models served (read again: a restarted server may serve others),
    and with ``generate`` one token of each of two prompts in one list: after failures, since
    a hung engine still answers the first two, and a server that shifts or drops choices must
    not look well because a token came back. With ``embeddings`` (the endpoint's vectors were
    what failed), two texts embedded too. Raises an EndpointError while the endpoint cannot
    work (:class:`EndpointMalformed` while it answers unusably); a refusal is an answer too
    (the server is alive), a timeout or a 5xx is not. ``samples``: the samples a prompt to ask
    for (vLLM's ``n``, sampled): what failed, where a server answered n > 1 wrongly."""
    if not await client.ready(timeout_s):
        raise EndpointRetryable(client.label, client.unready or "/health not ready")
    await served.read()
    if not (generate and served.names):
        return
    model, pair = served.names[0], ["ping", "pong"]
    params = (
        SamplingParams(max_tokens=1, n=samples, temperature=1.0)
        if samples > 1
        else SamplingParams(max_tokens=1)
    )
    with contextlib.suppress(EndpointRejected, ModelNotServed):
        body = await client.complete(model, pair, params, timeout_s=timeout_s)
        want = len(pair) * samples
        check_choice_indices(client.label, [c.index for c in body.choices], want, "", samples)
        if (flaw := missing_choices(client.label, len(body.choices), want, samples)) is not None:
            raise flaw
    if embeddings:
        with contextlib.suppress(EndpointRejected, ModelNotServed):
            vectors = await client.embed(model, pair, timeout_s=timeout_s)
            indices = [d.index for d in vectors.data]
            check_choice_indices(client.label, indices, len(pair), EMBEDDINGS)
            check_vectors(client.label, [d.embedding for d in vectors.data], None)
            if (flaw := missing_choices(client.label, len(indices), len(pair))) is not None:
                raise flaw
