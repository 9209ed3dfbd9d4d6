"""What is sent for one prompt, decided in one place: the route (completions, chat, responses),
the text or the messages, the sampling settings, whether the server adds its special tokens;
and the key that identifies its answer.

The batch runner sends what :func:`render` gives, the response cache keys its answers by
:func:`request_key` of the same, and the OpenAI batch output names the job's :func:`route_of`:
what is cached can no longer drift from what was asked. A new kind of request (embeddings,
several samples, tools) is a new :class:`Route` here and its rendering.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

import msgspec

from swarm_queue.common.models import Chat, JobSpec, PromptItem, SamplingParams

__all__ = ["Request", "Route", "render", "request_key", "route_of"]


class Route(StrEnum):
    """The API a request goes to."""

    COMPLETIONS = "completions"  # /v1/completions: one request may hold a list of prompts
    CHAT = "chat"  # /v1/chat/completions: one conversation a request
    EMBEDDINGS = "embeddings"  # /v1/embeddings: one request may hold a list of inputs
    RESPONSES = "responses"  # /v1/responses: one conversation a request, as its input


class Request(msgspec.Struct, frozen=True, array_like=True):
    """One prompt's request as it is sent, less the model an endpoint serves it with:
    ``model`` is the job's (None: whatever each endpoint serves). Its fields up to
    ``raw_template``, in this order, are what its key digests (then its tools, if any):
    changing them changes every key (a cache emptied)."""

    route: str
    model: str | None
    text: str | None  # completions: the prompt, its job's template filled in
    messages: list[dict[str, Any]] | None  # chat, responses: the conversation
    params: SamplingParams
    # The job's template is written out whole, its special tokens included: the server must
    # not add its own (vLLM's ``add_special_tokens``).
    raw_template: bool
    # Chat: the tools offered. Digested apart, after the rest, and only when there are
    # some: the keys of every request without tools are those kept before tools existed.
    tools: list[dict[str, Any]] | None = None
    # Chat: OpenAI's tool_choice (None: not sent). Digested after the tools, when set.
    tool_choice: str | dict[str, Any] | None = None

    @property
    def add_special_tokens(self) -> bool | None:
        """What to ask the server about its special tokens (None: its default)."""
        return False if self.raw_template else None


def route_of(spec: JobSpec) -> Route:
    if spec.embed:
        return Route.EMBEDDINGS
    if isinstance(spec.request, Chat):
        return Route.RESPONSES if spec.request.api == "responses" else Route.CHAT
    return Route.COMPLETIONS


def _tool_choice(spec: JobSpec) -> str | dict[str, Any] | None:
    return spec.request.tool_choice if isinstance(spec.request, Chat) else None


def render(spec: JobSpec, item: PromptItem) -> Request:
    """The request for ``item`` of ``spec``'s job."""
    route = route_of(spec)
    chat_tools = route is Route.CHAT and bool(spec.tools)
    messages = None
    if route in (Route.CHAT, Route.RESPONSES):
        messages = (
            [m.as_openai() for m in item.messages]
            if item.messages is not None
            else [{"role": "user", "content": spec.render(item.prompt)}]
        )
    return Request(
        route=route,
        model=spec.model,
        text=spec.render(item.prompt) if messages is None else None,
        messages=messages,
        params=item.params_in(spec),
        raw_template=spec.template is not None,
        tools=spec.tools if route is Route.CHAT else None,
        tool_choice=(item.tool_choice or _tool_choice(spec)) if chat_tools else None,
    )


# Sorted keys: two equal dicts (a response_format schema) give one key, whatever their order.
_key_encoder = msgspec.msgpack.Encoder(order="sorted")


def request_key(request: Request) -> str:
    """A digest of everything that determines the answer to ``request``."""
    core = (
        request.route,
        request.model,
        request.text,
        request.messages,
        request.params,
        request.raw_template,
    )
    digest = hashlib.blake2b(_key_encoder.encode(core), digest_size=20)
    if request.tools:
        digest.update(_key_encoder.encode(request.tools))
    if request.tool_choice is not None:
        digest.update(_key_encoder.encode(request.tool_choice))
    return digest.hexdigest()
