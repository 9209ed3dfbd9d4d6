"""One inference endpoint over HTTP, and the one boundary where transport errors and error
statuses become swarm-queue's.

Requests go straight through one aiohttp session per endpoint, as vLLM's own benchmark client
sends them: the body built as a dict and encoded by msgspec, the answer read raw and decoded by
msgspec. The openai SDK stays the client of users' scripts (the gateway, the examples), not
the worker's: its request layers cost a third of a worker's CPU per list-batched prompt and
0.7 s of the 0.8 s a worker spent importing before its first request (docs/BENCHMARKS.md,
section 10). There is no retry here: the worker owns the single retry loop. vLLM's routes
outside the OpenAI API (``/health``, ``/metrics``, ``/tokenize``) share the session: one
connection pool, one auth header, one error boundary.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import msgspec

from swarm_queue.common.errors import (
    EndpointError,
    EndpointRejected,
    EndpointRetryable,
    EndpointServerError,
    EndpointUnusable,
    ModelNotServed,
    RouteMissing,
)
from swarm_queue.common.models import SamplingParams
from swarm_queue.common.redisurl import mask_url
from swarm_queue.worker.replies import (
    ANSWER_FIELDS,
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    Load,
    ModelInfo,
    ResponsesBody,
)

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


_encode = msgspec.json.Encoder().encode
_tokenize_decoder = msgspec.json.Decoder(_Tokenized)
_completion_decoder = msgspec.json.Decoder(CompletionBody)
_chat_decoder = msgspec.json.Decoder(ChatBody)
_embedding_decoder = msgspec.json.Decoder(EmbeddingBody)
_object_decoder = msgspec.json.Decoder(dict[str, Any])
_models_decoder = msgspec.json.Decoder(_ModelList)

# 408 Request Timeout and 409 Conflict are the server's transient states, not the prompt's fault.
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
# The route of each kind of answer, as a 404 for a missing one names it.
_ROUTES = {
    "completion": "/v1/completions",
    "chat": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}
# Wrong credentials: no request to this endpoint will succeed.
_UNUSABLE = frozenset({401, 403})
# Idle connections are closed before the server's keep-alive ends (uvicorn's, under vLLM: 5 s):
# a request sent on a connection the server is closing fails for nothing.
_KEEPALIVE_S = 4.0
# Connections to one endpoint at most (openai's client allowed as many).
_MAX_CONNECTIONS = 1000


def _error_body(raw: bytes) -> Any:
    """An error answer's body: the object inside vLLM's ``{"error": {...}}`` (or an older
    server's flat object), or None when it is not JSON."""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return body


def _server_message(body: Any, raw: bytes) -> str:
    """The server's own message, or the start of what it answered."""
    if isinstance(body, dict):
        msg = body.get("message")
        if isinstance(msg, str) and msg:
            return msg
    return raw[:500].decode(errors="replace")


def _error_object(body: object) -> bool:
    """Whether an error body is an OpenAI error object (``{"message", "type", ...}``, as vLLM
    answers), not a web framework's ``Not Found``."""
    return isinstance(body, dict) and ("type" in body or "code" in body) and "message" in body


def _with_nan(raw: bytes, decoder: msgspec.json.Decoder[T]) -> T | None:
    """A body that is no JSON only for its ``NaN`` or ``Infinity`` (as Python's json writes a
    float that is not finite: vLLM's embeddings of a model gone wrong), read as Python reads
    it, so that its vectors are judged as vectors (not finite: the endpoint's malformed
    answer) rather than taken for a garbled body and asked for again for ever. None: no
    such body."""
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        read: T = msgspec.convert(json.loads(raw), decoder.type)
    except (ValueError, msgspec.ValidationError):
        return None
    return read


def _status_error(
    endpoint: str, status: int, raw: bytes, *, generation: bool = True, route: str = ""
) -> EndpointError:
    """Our error for an error status. A 404 on a generation route names a model the server
    does not serve (vLLM's answer for an unknown model: an OpenAI error object): the job's
    trouble, not the endpoint's; a 404 without that object is a ``route`` the server does not
    have. A 404 on ``/v1/models`` (``generation`` False) means no OpenAI server at that URL."""
    body = _error_body(raw)
    message = _server_message(body, raw)
    if status == 500:
        return EndpointServerError(endpoint, message, status)
    if status > 500 or status in _RETRYABLE_4XX:
        return EndpointRetryable(endpoint, message, status)
    if status in _UNUSABLE or (status == 404 and not generation):
        return EndpointUnusable(endpoint, message, status)
    if status == 404 and not _error_object(body):
        return RouteMissing(endpoint, f"no {route or 'such'} route ({message})", status)
    if status == 404:
        return ModelNotServed(endpoint, message, status)
    return EndpointRejected(endpoint, message, status)


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``http_proxy``/``https_proxy``, unless
    ``no_proxy`` lists its host), read once per endpoint, as curl or httpx would use it."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy is None or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part: such credentials are never sent (vLLM takes
    a bearer key; the settings refuse endpoint URLs that carry them, and say so)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class EndpointClient:
    """Talks to one OpenAI-compatible server at ``url`` (base URL without ``/v1``)."""

    def __init__(self, url: str, api_key: str = "EMPTY", *, timeout_s: float = 600.0) -> None:
        self.url = url
        self.label = mask_url(url)
        self._timeout_s = timeout_s
        # Generation requests really sent (completion and chat), whatever their outcome.
        self.requests = 0
        self.unready = ""  # why the last ready() was False
        self._root = _without_credentials(url.rstrip("/"))
        self._headers = {
            "Authorization": f"Bearer {api_key or 'EMPTY'}",
            "Content-Type": "application/json",
        }
        self._proxy = _proxy_for(self._root)
        # Made at the first request: a session belongs to the event loop that runs it.
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def close(self) -> None:
        """Close its session for good: a call after this (a background task still running at
        a stop) fails as a connection does, and opens no session nobody would close."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise aiohttp.ClientConnectionError(f"the client of {self.label} is closed")
        if self._session is None or self._session.closed:
            # TLS through aiohttp's default context, built once at its import: the system's
            # CA certificates (SSL_CERT_FILE and SSL_CERT_DIR apply), verified.
            connector = aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, keepalive_timeout=_KEEPALIVE_S)
            # No timeout of its own: each call's deadline covers the whole answer.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    async def _call(
        self, path: str, timeout_s: float, body: bytes | None = None
    ) -> tuple[int, bytes]:
        """The status and body of a GET (``body`` None) or POST of ``path`` (from the server's
        root), all of it within ``timeout_s``. Raises TimeoutError or aiohttp.ClientError."""
        method = "GET" if body is None else "POST"
        async with asyncio.timeout(timeout_s):
            async with self._open().request(
                method, self._root + path, data=body, headers=self._headers, proxy=self._proxy
            ) as resp:
                return resp.status, await resp.read()

    async def _vllm_route(
        self, path: str, timeout_s: float, body: dict[str, str] | None = None
    ) -> bytes | None:
        """The body of a 200 answer from one of vLLM's own routes within ``timeout_s``; None
        for any other status, or when the server cannot be reached or answers too late."""
        try:
            status, raw = await self._call(path, timeout_s, None if body is None else _encode(body))
        except (aiohttp.ClientError, TimeoutError):
            return None
        return raw if status == 200 else None

    async def ready(self, timeout_s: float = 10.0) -> bool:
        """True once the server answers ``/health`` (vLLM: 200 when the model is loaded). A
        server without that route (404) counts as ready: its other routes will tell."""
        try:
            status, _ = await self._call("/health", timeout_s)
        except TimeoutError:
            self.unready = f"/health: no answer within {timeout_s:g} s"
            return False
        except aiohttp.ClientError as exc:
            self.unready = f"/health: connection failed: {type(exc).__name__}: {exc}"
            return False
        ok = 200 <= status < 300 or status == 404
        self.unready = "" if ok else f"/health: HTTP {status} (not ready: a model loading?)"
        return ok

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
        status, raw = await self._exchange("/v1/models", None, timeout_s)
        if not 200 <= status < 300:
            raise _status_error(self.label, status, raw, generation=False)
        try:
            return _models_decoder.decode(raw).data
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
        token_ids: bool = False,
    ) -> CompletionBody:
        """One ``/v1/completions`` request holding every prompt of ``prompts``.
        ``add_special_tokens`` False: the prompts carry their special tokens already (a chat
        template written out), so the server must not add its BOS again. ``token_ids``: each
        choice carries its prompt's token ids and its own, its prompt's usage in a list (vLLM's
        ``return_token_ids``, for a job with ``line_usage``)."""
        timeout = timeout_s or self._timeout_s
        body = {"model": model, "prompt": prompts, "max_tokens": params.max_tokens}
        body |= params.extra()
        if add_special_tokens is not None:
            body["add_special_tokens"] = add_special_tokens
        if token_ids:
            # (Asked only for a job that wants it: every answer then carries its prompt's token
            # ids, measured at 0.67x the throughput at batches of 256 in the overhead scenario.)
            body["return_token_ids"] = True
        return await self._answer("completion", body, _completion_decoder, timeout)

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
        return await self._answer("chat", body, _chat_decoder, timeout)

    async def respond(
        self,
        model: str,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
    ) -> ChatBody:
        """One ``/v1/responses`` request of one conversation (its ``input``), read as a chat
        answer's one choice (see :meth:`~worker.replies.ResponsesBody.as_chat`)."""
        timeout = timeout_s or self._timeout_s
        body: dict[str, Any] = {"model": model}
        if messages and messages[0].get("role") == "system":
            # A line's instructions travel as its leading system message: sent as
            # ``instructions`` again (the engine makes them that same message), so that the
            # answer echoes them as the line gave them.
            body["instructions"], messages = messages[0].get("content"), messages[1:]
        body |= {"input": messages, "max_output_tokens": params.max_tokens}
        body |= {k: v for k, v in params.extra().items() if k in ("temperature", "top_p")}
        whole = await self._answer("responses", body, _object_decoder, timeout)
        try:
            answer = msgspec.convert(whole, ResponsesBody)
        except msgspec.ValidationError as exc:
            raise EndpointRetryable(self.label, f"unreadable responses answer: {exc}") from None
        return answer.as_chat({k: v for k, v in whole.items() if k not in ANSWER_FIELDS})

    async def embed(
        self, model: str, texts: list[str], *, timeout_s: float | None = None
    ) -> EmbeddingBody:
        """One ``/v1/embeddings`` request holding every text of ``texts``, answered as
        floats."""
        timeout = timeout_s or self._timeout_s
        body = {"model": model, "input": texts, "encoding_format": "float"}
        return await self._answer("embeddings", body, _embedding_decoder, timeout)

    async def _exchange(self, path: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
        """One request whose failure to get any answer (too late, no connection, a connection
        cut) is this endpoint's passing trouble: :class:`EndpointRetryable`."""
        try:
            return await self._call(path, timeout_s, body)
        except TimeoutError:
            late = EndpointRetryable(self.label, f"no answer within {timeout_s:g} s")
            late.lost = True
            raise late from None
        except aiohttp.ClientError as exc:
            cut = EndpointRetryable(self.label, f"connection failed: {type(exc).__name__}: {exc}")
            # Refused (nothing listens) never reached the server; a cut one did.
            cut.lost = not isinstance(exc, aiohttp.ClientConnectorError)
            raise cut from None

    async def _answer(
        self, what: str, body: dict[str, Any], decoder: msgspec.json.Decoder[T], timeout_s: float
    ) -> T:
        """POST ``body`` to the route of ``what`` and decode the answer: the one place where
        error statuses and unreadable answers of a generation become swarm-queue's errors.
        ``timeout_s`` is a deadline for the whole answer, so a server that trickles bytes
        cannot hold the request for ever."""
        self.requests += 1
        route = _ROUTES[what]
        status, raw = await self._exchange(route, _encode(body), timeout_s)
        if not 200 <= status < 300:
            raise _status_error(self.label, status, raw, route=route)
        try:
            return decoder.decode(raw)
        except msgspec.DecodeError as exc:
            if (read := _with_nan(raw, decoder)) is not None:
                return read
            # A body cut short or garbled on its way: transient, like a dropped connection.
            raise EndpointRetryable(self.label, f"unreadable {what} answer: {exc}") from None
