"""One inference endpoint, and the one boundary where openai/httpx errors become ours.

Calls go through ``AsyncOpenAI`` with its own retries turned off (``max_retries=0``): the worker
owns the single retry loop. Responses are read raw and decoded with msgspec, which is several
times cheaper than building pydantic models for hundreds of choices per request. vLLM's routes
outside the OpenAI API (``/health``, ``/metrics``, ``/tokenize``) go through the same client
(openai's documented custom requests, on a copy rooted at the server's URL that shares its
connection pool): one HTTP stack, one auth header, one error boundary.
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
from typing import Any, TypeVar

import aiohttp
import msgspec
import openai

from swarm_queue.common.errors import (
    EndpointRejected,
    EndpointRetryable,
    EndpointUnusable,
    ModelNotServed,
    RouteMissing,
)
from swarm_queue.common.models import SamplingParams
from swarm_queue.common.settings import mask_url
from swarm_queue.worker.replies import ChatBody, CompletionBody, EmbeddingBody, Load, ModelInfo

T = TypeVar("T")

__all__ = ["EndpointClient", "parse_load"]


class _ModelList(msgspec.Struct):
    data: list[ModelInfo] = []


_GAUGE = re.compile(
    rb"^vllm:num_requests_(running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M
)


def parse_load(text: bytes) -> Load | None:
    """Sum each gauge over its label sets; None when the text has neither (not a vLLM)."""
    found: dict[bytes, float] = {}
    for name, value in _GAUGE.findall(text):
        found[name] = found.get(name, 0.0) + float(value)
    if b"running" not in found or b"waiting" not in found:
        return None
    return Load(found[b"running"], found[b"waiting"])


class _Tokenized(msgspec.Struct):
    count: int


_tokenize_decoder = msgspec.json.Decoder(_Tokenized)
_completion_decoder = msgspec.json.Decoder(CompletionBody)
_chat_decoder = msgspec.json.Decoder(ChatBody)
_embedding_decoder = msgspec.json.Decoder(EmbeddingBody)
_models_decoder = msgspec.json.Decoder(_ModelList)

# 408 Request Timeout and 409 Conflict are the server's transient states, not the prompt's fault.
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
# The route of each kind of answer, as a 404 for a missing one names it.
_ROUTES = {
    "completion": "/v1/completions",
    "chat": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
}
# Wrong credentials: no request to this endpoint will succeed.
_UNUSABLE = frozenset({401, 403})


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own message, from vLLM's nested ``{"error": {...}}`` or older flat body."""
    body = exc.body
    if isinstance(body, dict):
        msg = body.get("message")
        if isinstance(msg, str) and msg:
            return msg
    return exc.response.text[:500] if exc.response is not None else str(exc)


def _error_object(body: object) -> bool:
    """Whether an error body is an OpenAI error object (``{"message", "type", ...}``, what the
    openai client hands on of vLLM's ``{"error": {...}}``), not a web framework's ``Not Found``."""
    return isinstance(body, dict) and ("type" in body or "code" in body) and "message" in body


def _translate(
    endpoint: str,
    exc: openai.OpenAIError,
    timeout_s: float,
    *,
    generation: bool = True,
    route: str = "",
) -> Exception:
    """Our error for an openai error. A 404 on a generation route names a model the server does
    not serve (vLLM's answer for an unknown model: an OpenAI error object): the job's trouble,
    not the endpoint's; a 404 without that object is a ``route`` the server does not have. A
    404 on ``/v1/models`` (``generation`` False) means no OpenAI server at that URL."""
    refused = _refused(exc)
    if isinstance(exc, openai.APITimeoutError) and refused is None:
        return EndpointRetryable(endpoint, f"no answer within {timeout_s:g} s")
    if isinstance(exc, openai.APIConnectionError):
        cause = refused or exc.__cause__ or exc
        return EndpointRetryable(endpoint, f"connection failed: {type(cause).__name__}: {cause}")
    if isinstance(exc, openai.APIStatusError):
        status, message = exc.status_code, _server_message(exc)
        if status >= 500 or status in _RETRYABLE_4XX:
            return EndpointRetryable(endpoint, message, status)
        if status in _UNUSABLE or (status == 404 and not generation):
            return EndpointUnusable(endpoint, message, status)
        if status == 404 and not _error_object(exc.body):
            return RouteMissing(endpoint, f"no {route or 'such'} route ({message})", status)
        if status == 404:
            return ModelNotServed(endpoint, message, status)
        return EndpointRejected(endpoint, message, status)
    return EndpointRetryable(endpoint, f"{type(exc).__name__}: {exc}")


def _refused(exc: BaseException) -> BaseException | None:
    """The connection error under ``exc``, if it is one: aiohttp's transport (as vendored by
    openai) reports a refused or unreachable connection as a connect timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectorError):
            return seen
        seen = seen.__cause__
    return None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every endpoint of the process: building one loads the system's CA
    certificates (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` apply), about 15 ms each, which a
    client per endpoint would pay again and again (0.8 s for a worker of 50 endpoints)."""
    return ssl.create_default_context()


class EndpointClient:
    """Talks to one OpenAI-compatible server at ``url`` (base URL without ``/v1``)."""

    def __init__(self, url: str, api_key: str = "EMPTY", *, timeout_s: float = 600.0) -> None:
        self.url = url
        self.label = mask_url(url)
        self._timeout_s = timeout_s
        # Generation requests really sent (completion and chat), whatever their outcome.
        self.requests = 0
        self._client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key=api_key or "EMPTY",
            max_retries=0,
            timeout=timeout_s,
            # openai's own client on aiohttp's transport (its documented option), with the
            # process's one TLS context
            http_client=openai.DefaultAioHttpClient(verify=_tls_context()),
        )
        # vLLM's own routes sit beside /v1; the copy shares the client's connections.
        self._root = self._client.with_options(base_url=url)

    async def close(self) -> None:
        await self._client.close()

    async def _vllm_route(
        self, path: str, timeout_s: float, body: dict[str, str] | None = None
    ) -> bytes | None:
        """The body of a 200 answer from one of vLLM's own routes within ``timeout_s``; None
        for any other status, or when the server cannot be reached or answers too late."""
        try:
            async with asyncio.timeout(timeout_s):
                if body is None:
                    return await self._root.get(path, cast_to=bytes, options={"timeout": timeout_s})
                return await self._root.post(
                    path, cast_to=bytes, body=body, options={"timeout": timeout_s}
                )
        except (openai.OpenAIError, TimeoutError):
            return None

    async def ready(self, timeout_s: float = 10.0) -> bool:
        """True once the server answers ``/health`` (vLLM: 200 when the model is loaded). A
        server without that route (404) counts as ready: its other routes will tell."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._root.get("/health", cast_to=bytes, options={"timeout": timeout_s})
        except openai.NotFoundError:
            return True
        except (openai.OpenAIError, TimeoutError):
            return False
        return True

    async def tokenize(self, prompt: str, model: str, timeout_s: float = 30.0) -> int | None:
        """The exact prompt token count from vLLM's ``/tokenize``; None when the server has no
        such route (not a vLLM) or does not answer, so the caller falls back to an estimate."""
        raw = await self._vllm_route("/tokenize", timeout_s, {"model": model, "prompt": prompt})
        if raw is None:
            return None
        try:
            return _tokenize_decoder.decode(raw).count
        except msgspec.DecodeError:
            return None

    async def load(self, timeout_s: float = 5.0) -> Load | None:
        """The endpoint's scheduler load from ``/metrics`` (vLLM's Prometheus gauges), or None
        when it cannot be read: then the in-flight window simply stays where it is."""
        raw = await self._vllm_route("/metrics", timeout_s)
        return None if raw is None else parse_load(raw)

    async def models(self, timeout_s: float = 30.0) -> list[ModelInfo]:
        """The models served, with ``max_model_len`` where the server reports it (vLLM does)."""
        try:
            async with asyncio.timeout(timeout_s):
                raw = await self._client.models.with_raw_response.list(timeout=timeout_s)
            return _models_decoder.decode(raw.http_response.content).data
        except TimeoutError:
            raise EndpointRetryable(self.label, f"no answer within {timeout_s:g} s") from None
        except openai.OpenAIError as exc:
            raise _translate(self.label, exc, timeout_s, generation=False) from None
        except msgspec.DecodeError as exc:
            # A proxy's HTML page or a server restarting: probed again, not given up on.
            raise EndpointRetryable(self.label, f"unreadable /v1/models answer: {exc}") from None

    async def complete(
        self,
        model: str,
        prompts: list[str],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        add_special_tokens: bool | None = None,
    ) -> CompletionBody:
        """One ``/v1/completions`` request holding every prompt of ``prompts``.
        ``add_special_tokens`` False: the prompts carry their special tokens already (a chat
        template written out), so the server must not add its BOS again."""
        timeout = timeout_s or self._timeout_s
        body = {"model": model, "prompt": prompts, "max_tokens": params.max_tokens}
        body |= params.extra()
        if add_special_tokens is not None:
            body["add_special_tokens"] = add_special_tokens
        return await self._answer("/completions", body, _completion_decoder, timeout, "completion")

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
        """One ``/v1/chat/completions`` request of one conversation, the server's chat
        template applied; ``tools`` offered (the server's tool-call parser answers with
        ``tool_calls``), with ``tool_choice`` if given."""
        timeout = timeout_s or self._timeout_s
        body = {"model": model, "messages": messages, "max_tokens": params.max_tokens}
        body |= params.extra()
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        return await self._answer("/chat/completions", body, _chat_decoder, timeout, "chat")

    async def embed(
        self, model: str, texts: list[str], *, timeout_s: float | None = None
    ) -> EmbeddingBody:
        """One ``/v1/embeddings`` request holding every text of ``texts``, answered as floats
        (openai's client would otherwise ask for base64)."""
        timeout = timeout_s or self._timeout_s
        body = {"model": model, "input": texts, "encoding_format": "float"}
        return await self._answer("/embeddings", body, _embedding_decoder, timeout, "embeddings")

    async def _answer(
        self,
        route: str,
        body: dict[str, Any],
        decoder: msgspec.json.Decoder[T],
        timeout_s: float,
        what: str,
    ) -> T:
        """POST ``body`` to ``route`` and decode the answer: the one boundary where openai's
        errors and unreadable answers become swarm-queue's. The body is sent as built, through
        the client's documented raw ``post`` (its per-call typed transform of every message
        and tool cost more CPU than the rest of a chat turn's path). ``timeout_s`` is a
        deadline for the whole answer (httpx's own timeout acts per read, so a server that
        trickles bytes would otherwise hold the request for ever)."""
        self.requests += 1
        try:
            async with asyncio.timeout(timeout_s):
                content = await self._client.post(
                    route, cast_to=bytes, body=body, options={"timeout": timeout_s}
                )
        except TimeoutError:
            raise EndpointRetryable(self.label, f"no answer within {timeout_s:g} s") from None
        except openai.OpenAIError as exc:
            route = _ROUTES.get(what, what)
            raise _translate(self.label, exc, timeout_s, route=route) from None
        try:
            return decoder.decode(content)
        except msgspec.DecodeError as exc:
            # A body cut short or garbled on its way: transient, like a dropped connection.
            raise EndpointRetryable(self.label, f"unreadable {what} answer: {exc}") from None
