"""An inference server as the worker uses it: the :class:`Backend` protocol, and which
implementation serves an endpoint (:func:`backend_for`).

What every backend must do: say whether it is ready, list the models it serves, and answer a
list of completion prompts, a chat conversation or a list of texts to embed. What it may not
know: its scheduler's load (the in-flight window then stays where it is) and a prompt's exact
token count (the reduce then estimates): those answer None. The drain loop, the window, the
probe and the reduce ask this protocol, in its own types (:mod:`worker.replies`), never a
server's, so another server (or new kinds of request: several samples, tools) is a new
implementation here, not edits across the worker.
The one implementation today is the vLLM OpenAI-compatible server (:class:`EndpointClient`),
chosen by default, or by an endpoint's hostfile tag ``backend=vllm``.
"""

from __future__ import annotations

from typing import Any, Protocol

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.hostfile import Endpoint
from swarm_queue.common.models import SamplingParams
from swarm_queue.worker.endpoint import EndpointClient
from swarm_queue.worker.replies import ChatBody, CompletionBody, EmbeddingBody, Load, ModelInfo

__all__ = ["BACKENDS", "Backend", "backend_for"]


class Backend(Protocol):
    """One inference server."""

    url: str
    # The server as logs and figures name it (a password in its URL masked).
    label: str
    # Generation requests really sent, whatever their outcome.
    requests: int
    # Why the last :meth:`ready` was False ("" after a True): what a failed probe says.
    unready: str

    async def ready(self, timeout_s: float = 10.0) -> bool:
        """Whether the server is up and its model loaded."""
        ...

    async def models(self, timeout_s: float = 30.0) -> list[ModelInfo]:
        """The models it serves (an EndpointError when it cannot say)."""
        ...

    async def complete(
        self,
        model: str,
        prompts: list[str],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        add_special_tokens: bool | None = None,
        token_ids: bool = False,
    ) -> CompletionBody:
        """One completion request holding every prompt of ``prompts``; ``token_ids``: each
        choice carries its prompt's token ids and its own (vLLM's ``return_token_ids``)."""
        ...

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> ChatBody:
        """One chat request of one conversation (``tools``: offered to the model, with
        ``tool_choice`` if given)."""
        ...

    async def respond(
        self,
        model: str,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
    ) -> ChatBody:
        """One Responses API request of one conversation (its ``input``), its answer read as
        a chat answer's one choice (a server without the route: :class:`RouteMissing`)."""
        ...

    async def embed(
        self, model: str, texts: list[str], *, timeout_s: float | None = None
    ) -> EmbeddingBody:
        """One embeddings request holding every text of ``texts``, vectors mapped by index."""
        ...

    async def load(self, timeout_s: float = 5.0) -> Load | None:
        """Its scheduler's load; None: unknown."""
        ...

    async def tokenize(self, prompt: str, model: str, timeout_s: float = 30.0) -> int | None:
        """The exact token count of ``prompt``; None: unknown."""
        ...

    async def close(self) -> None: ...


# The implementations, by the name an endpoint's hostfile tag ``backend=`` gives.
BACKENDS = {"vllm": EndpointClient}


def backend_for(endpoint: Endpoint, api_key: str, timeout_s: float) -> Backend:
    """The backend of ``endpoint``: its ``backend`` tag's, else vLLM's."""
    name = endpoint.tags.get("backend", "vllm")
    try:
        kind = BACKENDS[name]
    except KeyError:
        raise ConfigError(
            f"endpoint {endpoint.url}: no backend {name!r} (known: {', '.join(BACKENDS)})"
        ) from None
    return kind(endpoint.url, api_key, timeout_s=timeout_s)
