"""``swarm-sim``: an OpenAI-compatible stand-in for vLLM, one simulated engine per port.

Faithful where swarm-queue depends on it: ``/v1/completions`` with a string or a list of prompts
(choices carry ``index``; ``usage`` is the request's total), ``/v1/chat/completions``,
``/v1/embeddings`` with a string or a list of inputs (a deterministic vector per text, see
:func:`sim.text.embedding_for`; one over-long input fails the whole list, as in vLLM),
``/v1/models`` with ``max_model_len``, ``/health``, ``/metrics`` with vLLM's gauge names, and
vLLM's 400 for a prompt that does not fit the context, which fails the WHOLE list request.

As strict as vLLM 0.32.0 (the version ``bench/interop_vllm.py`` checks) where swarm-queue was
seen to rely on leniency: ``n`` > 1 with temperature 0 refused (``n must be 1 when using greedy
sampling``); tools with ``tool_choice`` ``auto`` (the default) refused unless started with
``--enable-auto-tool-choice --tool-call-parser NAME``, ``required`` and a named tool unless
started with ``--tool-call-parser``, ``none`` on any server; a ``response_format`` beside
``auto`` tools holding the answer to its schema; a guided answer cut off at ``max_tokens``
(see :mod:`sim.tools`).

For agents: tool calls (a user message's ``CALL name({...})`` directive answered, when the
tool is offered, with a ``tool_calls`` message: see :mod:`sim.tools`), a JSON schema's object
when ``response_format`` asks for one, and vLLM's automatic prefix caching (a prompt's cached
leading blocks prefill for free; ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` on ``/metrics``: see :mod:`sim.prefix`).

Fault switches (command line, or ``POST /sim/faults`` at run time): a rate of HTTP 500s, a rate
of connection resets, an endpoint that dies (stops listening, drops connections) or stalls
(accepts requests, never answers) after N seconds; and (at run time) answers that lie: choice
indices shifted, choices left out, vectors of another dimension or holding NaN, tools called
that were not offered.

Each port serves one model name (``--model a,b`` names them per port), plus LoRA-style
adapters (``--model base+adapter``), all listed by ``/v1/models``; any other name gets vLLM's
404. ``POST /sim/models`` with a JSON list of names changes them at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from swarm_queue.sim.engine import EngineConfig, EngineStopped, SimEngine
from swarm_queue.sim.prefix import PrefixCache
from swarm_queue.sim.text import count_tokens, embedding_for, sample_for, token_ids
from swarm_queue.sim.tools import call_id, choice_error, schema_answer, tool_call

__all__ = ["FaultConfig", "SimEndpoint", "SimFleet", "main"]

_json = msgspec.json.Encoder()


# A value no embedding holds, written as NaN (see SimEndpoint._answer).
_NAN_MARK = 7.0e300


class FaultConfig(msgspec.Struct, kw_only=True):
    """Failure behaviour of one endpoint; ``None`` times mean never."""

    error_rate: float = 0.0
    reset_rate: float = 0.0
    die_after_s: float | None = None
    stall_after_s: float | None = None
    # The model calls tools it was not offered, as a real one may (vLLM's tool parsers pass
    # on whatever name it writes): every CALL directive is answered, offered or not.
    calls_unoffered: bool = False
    # A server that lies in its answers: every choice's (and vector's) index shifted by this
    # much; this many choices (or vectors) left out of each answer; vectors of this many
    # dimensions; vectors holding NaN.
    shift_index: int = 0
    drop_choices: int = 0
    embed_dims: int | None = None
    nan_vectors: bool = False
    # Asked for n > 1 samples a prompt, this many fewer for each (right with n = 1).
    short_samples: int = 0
    # A request holding this text anywhere in its prompts fails whole with HTTP 500, as vLLM
    # fails a list when its tokenizer or chat template raises on one odd input.
    fail_on: str | None = None
    # A request holding this text is never answered (an engine stuck on one input): the
    # client's timeout ends it.
    hang_on: str | None = None


class _CompletionRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | list[str]
    max_tokens: int | None = 16
    temperature: float | None = None
    stream: bool = False
    # vLLM's default on /v1/completions: the tokenizer adds its special tokens (the BOS).
    add_special_tokens: bool = True
    ignore_eos: bool = False  # vLLM's: generate exactly max_tokens
    n: int = 1  # samples per prompt: choice i * n + j is prompt i's sample j, as in vLLM
    # vLLM's: each choice carries its prompt's token ids and its own (exact usage per prompt).
    return_token_ids: bool | None = None


class _TokenizeRequest(msgspec.Struct, kw_only=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True


class _Message(msgspec.Struct):
    role: str
    content: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class _ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[_Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False
    # vLLM's default on chat: the chat template carries the special tokens it needs.
    add_special_tokens: bool = False
    ignore_eos: bool = False
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


class _EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    stream: bool = False  # never set: what the shared route checks


_completion_decoder = msgspec.json.Decoder(_CompletionRequest)
_embedding_decoder = msgspec.json.Decoder(_EmbeddingRequest)
_chat_decoder = msgspec.json.Decoder(_ChatRequest)


class SimEndpoint:
    """One simulated vLLM server: an engine, its fault switches and its HTTP app."""

    def __init__(
        self,
        port: int,
        config: EngineConfig,
        faults: FaultConfig | None = None,
        *,
        host: str = "127.0.0.1",
        model: str = "swarm-sim",
        error_format: str = "nested",
        seed: int = 0,
        bos_token: str = "",
        chat_template_bos: bool = False,
        tool_parser: str | None = None,
        auto_tool_choice: bool | None = None,
        runner: str = "auto",
    ) -> None:
        self.host, self.port = host, port
        # vLLM's --runner: a generating server has no /v1/embeddings, a pooling one no
        # generation routes (a web framework's 404 for them); "auto" serves every route.
        self.runner = runner
        # vLLM's --tool-call-parser and --enable-auto-tool-choice (None: with the parser):
        # without a parser every tool choice but "none" is refused, without the second "auto"
        # (the default), as vLLM refuses them.
        self.tool_parser = tool_parser
        self.auto_tool_choice = (
            tool_parser is not None if auto_tool_choice is None else auto_tool_choice
        )
        # The tokenizer's BOS ("" : none, the default) and whether the model's chat template
        # starts with it: the model's answer depends on every token it sees, BOS included.
        self.bos_token = bos_token
        self.chat_template_bos = chat_template_bos
        # The JSON bodies of the last generation requests, for tests to check what was sent.
        self.received: deque[dict[str, Any]] = deque(maxlen=2000)
        # The base model first, then adapters, as vLLM lists them.
        self.models: list[str] = model.split("+")
        self.config = config
        self.faults = faults or FaultConfig()
        self.error_format = error_format
        self.engine = SimEngine(config)
        self.rng = random.Random(seed + port)
        self.started = time.monotonic()
        self.dead = False
        self.requests_total = 0
        self.http_requests = 0  # generation requests received, answered or not
        self.prompt_tokens_total = 0
        self.prefix = PrefixCache()
        self._runner: web.AppRunner | None = None
        self._die_task: asyncio.Task[None] | None = None
        self._stalled: list[asyncio.Future[None]] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2**31)  # vLLM (uvicorn) sets no body limit
        if self.runner != "pooling":
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/v1/chat/completions", self._chat)
        if self.runner != "generate":
            app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/sim/faults", self._set_faults)
        app.router.add_get("/sim/pid", self._pid)
        app.router.add_post("/sim/models", self._set_models)
        return app

    @property
    def model(self) -> str:
        """The base model: what answers name, and the gauges' label."""
        return self.models[0]

    async def start(self) -> None:
        self.engine.start()
        # handler_cancellation: a client that hangs up cancels its request, as in vLLM.
        self._runner = web.AppRunner(
            self.app(), access_log=None, shutdown_timeout=0.5, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.started = time.monotonic()
        self._schedule_death()

    async def stop(self) -> None:
        if self._die_task is not None:
            self._die_task.cancel()
        await self._die()

    def _schedule_death(self) -> None:
        if self._die_task is not None:
            self._die_task.cancel()
            self._die_task = None
        if self.faults.die_after_s is not None and not self.dead:
            delay = max(0.0, self.faults.die_after_s - (time.monotonic() - self.started))
            self._die_task = asyncio.get_running_loop().create_task(self._die_later(delay))

    async def _die_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._die()

    async def _die(self) -> None:
        """Like a node that vanished: in-flight requests drop, new connections are refused."""
        self.dead = True
        await self.engine.stop()
        for fut in self._stalled:
            if not fut.done():
                fut.set_exception(EngineStopped())
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # -- helpers --------------------------------------------------------------------------

    def _error(
        self, status: int, message: str, err_type: str, param: str | None = None
    ) -> web.Response:
        body: dict[str, Any] = {
            "message": message,
            "type": err_type,
            "param": param,
            "code": status,
        }
        payload = {"error": body} if self.error_format == "nested" else {"object": "error", **body}
        return web.Response(
            status=status, body=_json.encode(payload), content_type="application/json"
        )

    def _ok(self, payload: Any) -> web.Response:
        return web.Response(body=_json.encode(payload), content_type="application/json")

    def _answer(self, payload: dict[str, Any], key: str, n: int = 1) -> web.Response:
        """A generation answer (its ``key``: ``choices`` or ``data``) of ``n`` samples a
        prompt, as a lying server would send it when the fault switches say so (see
        :class:`FaultConfig`)."""
        f = self.faults
        if not (f.shift_index or f.drop_choices or f.nan_vectors or f.short_samples):
            return self._ok(payload)
        items = payload[key]
        if f.drop_choices:
            items = items[: max(0, len(items) - f.drop_choices)]
        if f.short_samples and n > 1:
            items = [c for c in items if c["index"] % n < n - f.short_samples]
        for item in items:
            item["index"] += f.shift_index
            if f.nan_vectors and "embedding" in item:
                item["embedding"][0] = _NAN_MARK
        payload[key] = items
        if not f.nan_vectors:
            return self._ok(payload)
        # NaN as vLLM's Python json writes it (a literal NaN, no JSON): msgspec would write null.
        body = _json.encode(payload).replace(_json.encode(_NAN_MARK), b"NaN")
        return web.Response(body=body, content_type="application/json")

    def _stalled_now(self) -> bool:
        after = self.faults.stall_after_s
        return after is not None and time.monotonic() - self.started >= after

    async def _stall(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stalled.append(fut)
        await fut

    async def _faults_gate(self, request: web.Request) -> web.Response | None:
        """Applies the fault switches; returns an error response, or None to go on."""
        if self.dead:
            _abort(request)
            raise EngineStopped()
        if self._stalled_now():
            await self._stall()
        if self.faults.reset_rate and self.rng.random() < self.faults.reset_rate:
            _abort(request)
            raise EngineStopped()
        if self.faults.error_rate and self.rng.random() < self.faults.error_rate:
            return self._error(500, "simulated internal server error", "InternalServerError")
        return None

    def _n_error(self, req: _CompletionRequest | _ChatRequest) -> web.Response | None:
        """vLLM's refusal of ``n`` samples: fewer than one, or more than one with greedy
        decoding (temperature 0: they would all be the same answer)."""
        if req.n < 1:
            return self._error(400, f"n must be at least 1, got {req.n}.", "BadRequestError", "n")
        if req.n > 1 and req.temperature == 0:
            why = f"n must be 1 when using greedy sampling, got {req.n}."
            return self._error(400, why, "BadRequestError", "n")
        return None

    def _check_model(self, model: str) -> web.Response | None:
        if model not in self.models:
            return self._error(
                404, f"The model `{model}` does not exist.", "NotFoundError", "model"
            )
        return None

    def _context_error(self, prompt_tokens: int, max_tokens: int) -> web.Response | None:
        limit = self.config.max_model_len
        if prompt_tokens + max_tokens <= limit:
            return None
        max_input = max(0, limit - max_tokens)
        return self._error(
            400,
            f"You passed {prompt_tokens} input tokens and requested {max_tokens} output tokens. "
            f"However, the model's context length is only {limit} tokens, resulting in a maximum "
            f"input length of {max_input} tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            "BadRequestError",
            "input_tokens",
        )

    # -- routes ---------------------------------------------------------------------------

    async def _serve(
        self,
        request: web.Request,
        decoder: msgspec.json.Decoder[Any],
        respond: Callable[[Any], Awaitable[web.Response]],
    ) -> web.StreamResponse:
        """What both generation routes share: fault switches, decoding, model and stream checks,
        and dropping the connection when the endpoint dies mid-request."""
        self.http_requests += 1
        try:
            gate = await self._faults_gate(request)
            if gate is not None:
                return gate
            raw = await request.read()
            try:
                req = decoder.decode(raw)
            except msgspec.DecodeError as exc:
                return self._error(400, f"invalid request: {exc}", "BadRequestError")
            self.received.append(msgspec.json.decode(raw))
            if self.faults.fail_on and self.faults.fail_on.encode() in raw:
                why = (
                    f"EngineCore encountered an issue: tokenizer failed on {self.faults.fail_on!r}"
                )
                return self._error(500, why, "InternalServerError")
            if self.faults.hang_on and self.faults.hang_on.encode() in raw:
                await asyncio.Event().wait()  # until the client hangs up
            if (err := self._check_model(req.model)) is not None:
                return err
            if req.stream:
                return self._error(400, "swarm-sim does not stream", "BadRequestError", "stream")
            return await respond(req)
        except (EngineStopped, ConnectionResetError):  # we died, or the client hung up
            _abort(request)
            return web.Response(status=503)

    async def _generate(self, lengths: list[int], prompt_tokens: int, prefill: int = 0) -> None:
        """Decode ``lengths`` after prefilling ``prefill`` uncached prompt tokens."""
        cost = self.config.prefill_ms_per_token
        if prefill and cost and not self.config.instant:
            await asyncio.sleep(prefill * cost / 1000.0 / self.config.speed)
        await self.engine.generate(lengths)
        if self.dead:
            raise EngineStopped()
        self.requests_total += 1
        self.prompt_tokens_total += prompt_tokens

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, _completion_decoder, self._complete)

    async def _complete(self, req: _CompletionRequest) -> web.Response:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        if not prompts:
            return self._error(400, "prompt must not be empty", "BadRequestError", "prompt")
        if max_tokens < 1:
            return self._error(
                400,
                f"max_tokens must be at least 1, got {max_tokens}.",
                "BadRequestError",
                "max_tokens",
            )
        bos = self.bos_token if req.add_special_tokens else ""
        seen = [bos + p for p in prompts]  # what the model reads
        ptoks = [count_tokens(p) for p in seen]
        for n in ptoks:  # one over-long prompt fails the whole list, as in vLLM
            if (err := self._context_error(n, max_tokens)) is not None:
                return err
        ignore_eos = req.ignore_eos or self.config.ignore_eos
        if (err := self._n_error(req)) is not None:
            return err
        outs = [_sample(p, max_tokens, j, req, ignore_eos) for p in seen for j in range(req.n)]
        prefill = sum(self.prefix.lookup(p) for p in seen)
        await self._generate([n for _, n, _ in outs], sum(ptoks), prefill)
        ctoks = sum(n for _, n, _ in outs)
        return self._answer(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [
                    {
                        "index": i,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                    | (
                        {
                            "prompt_token_ids": token_ids(seen[i // req.n]),
                            "token_ids": token_ids(text, n),
                        }
                        if req.return_token_ids
                        else {}
                    )
                    for i, (text, n, reason) in enumerate(outs)
                ],
                "usage": {
                    "prompt_tokens": sum(ptoks),
                    "completion_tokens": ctoks,
                    "total_tokens": sum(ptoks) + ctoks,
                },
            },
            "choices",
            req.n,
        )

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, _embedding_decoder, self._embed)

    async def _embed(self, req: _EmbeddingRequest) -> web.Response:
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts:
            return self._error(400, "input must not be empty", "BadRequestError", "input")
        if req.encoding_format != "float":
            return self._error(
                400, "swarm-sim answers encoding_format float only", "BadRequestError"
            )
        ptoks = [count_tokens(self.bos_token + t) for t in texts]  # its tokenizer's BOS added
        limit = self.config.max_model_len
        for n in ptoks:  # one over-long input fails the whole list, as in vLLM
            if n > limit:
                return self._error(
                    400,
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {n} tokens in the input for embedding generation. Please "
                    "reduce the length of the input.",
                    "BadRequestError",
                )
        await self._generate([1] * len(texts), sum(ptoks))  # a prefill, one step
        dims = () if self.faults.embed_dims is None else (self.faults.embed_dims,)
        return self._answer(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": req.model,
                "data": [
                    {"index": i, "object": "embedding", "embedding": embedding_for(t, *dims)}
                    for i, t in enumerate(texts)
                ],
                "usage": {"prompt_tokens": sum(ptoks), "total_tokens": sum(ptoks)},
            },
            "data",
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, _chat_decoder, self._chat_complete)

    async def _chat_complete(self, req: _ChatRequest) -> web.Response:
        why = choice_error(
            req.tools, req.tool_choice, self.tool_parser is not None, self.auto_tool_choice
        )
        if why is not None:
            return self._error(400, why, "BadRequestError")
        # A stand-in chat template: what the model sees is a pure function of the messages.
        prompt = self.bos_token if self.chat_template_bos else ""
        prompt += "".join(f"<|{m.role}|>\n{_said(m)}\n" for m in req.messages)
        prompt += "<|assistant|>\n"
        if req.add_special_tokens:
            prompt = self.bos_token + prompt
        ptoks = count_tokens(prompt)
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.config.max_model_len - ptoks)
        if (err := self._context_error(ptoks, max_tokens)) is not None:
            return err
        ignore_eos = req.ignore_eos or self.config.ignore_eos
        if (err := self._n_error(req)) is not None:
            return err
        prefill = self.prefix.lookup(prompt)
        schema = ((req.response_format or {}).get("json_schema") or {}).get("schema")
        call = tool_call(
            [(m.role, m.content) for m in req.messages],
            req.tools,
            req.tool_choice,
            constrained=isinstance(schema, dict),
            offered_only=not self.faults.calls_unoffered,
        )
        if call is not None:
            return await self._tool_call(req, call, ptoks, prefill)
        if isinstance(schema, dict):
            text = _json.encode(schema_answer(schema, prompt)).decode()
            outs = [_cut(text, max_tokens)] * req.n
        else:
            outs = [_sample(prompt, max_tokens, j, req, ignore_eos) for j in range(req.n)]
        await self._generate([n for _, n, _ in outs], ptoks, prefill)
        messages = [
            {"role": "assistant", "content": t.lstrip(), "tool_calls": []} for t, _, _ in outs
        ]
        reasons = [reason for _, _, reason in outs]
        return self._chat_answer(req, messages, reasons, ptoks, sum(n for _, n, _ in outs))

    def _chat_answer(
        self,
        req: _ChatRequest,
        messages: list[dict[str, Any]],
        reasons: list[str],
        ptoks: int,
        ctoks: int,
    ) -> web.Response:
        """A chat completion holding ``messages`` as its choices, in vLLM's shape."""
        return self._answer(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [
                    {
                        "index": j,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                    for j, (message, reason) in enumerate(zip(messages, reasons, strict=True))
                ],
                "usage": {
                    "prompt_tokens": ptoks,
                    "completion_tokens": ctoks,
                    "total_tokens": ptoks + ctoks,
                },
            },
            "choices",
            req.n,
        )

    async def _tool_call(
        self, req: _ChatRequest, call: tuple[str, str], ptoks: int, prefill: int
    ) -> web.Response:
        """The answer asking for tool ``call``: a ``tool_calls`` message, as vLLM's parsers
        give it."""
        name, arguments = call
        ctoks = count_tokens(arguments) + 4
        await self._generate([ctoks], ptoks, prefill)
        turn = sum(1 for m in req.messages if m.role == "assistant")
        call_json = {
            "id": call_id(name, arguments, turn),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if req.tool_choice is None or req.tool_choice == "auto":  # the parser found a call
            message = {"role": "assistant", "content": None, "tool_calls": [call_json]}
            return self._chat_answer(req, [message], ["tool_calls"], ptoks, ctoks)
        # A call forced by guided decoding: vLLM 0.32 writes it with content "" and finish
        # "tool_calls" when required, "stop" when a tool was named (OpenAI's rule).
        message = {"role": "assistant", "content": "", "tool_calls": [call_json]}
        reason = "tool_calls" if req.tool_choice == "required" else "stop"
        return self._chat_answer(req, [message], [reason], ptoks, ctoks)

    async def _alive(self, request: web.Request) -> web.Response | None:
        """For /health and /v1/models: a dead endpoint drops the connection, a stalled one hangs."""
        try:
            if self.dead:
                raise EngineStopped()
            if self._stalled_now():
                await self._stall()
        except EngineStopped:
            _abort(request)
            return web.Response(status=503)
        return None

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if (gone := await self._alive(request)) is not None:
            return gone
        return self._ok(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.started),
                        "owned_by": "vllm",
                        "root": self.model,
                        "parent": None if name == self.model else self.model,
                        "max_model_len": self.config.max_model_len,
                    }
                    for name in self.models
                ],
            }
        )

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``/tokenize`` for a prompt: the count the context check uses."""
        if (gone := await self._alive(request)) is not None:
            return gone
        try:
            req = msgspec.json.decode(await request.read(), type=_TokenizeRequest)
        except msgspec.DecodeError as exc:
            return self._error(400, f"invalid request: {exc}", "BadRequestError")
        n = count_tokens((self.bos_token if req.add_special_tokens else "") + req.prompt)
        return self._ok(
            {"count": n, "max_model_len": self.config.max_model_len, "tokens": list(range(n))}
        )

    async def _health(self, request: web.Request) -> web.StreamResponse:
        if (gone := await self._alive(request)) is not None:
            return gone
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        label = f'{{model_name="{self.model}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {self.engine.num_running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {self.engine.num_waiting}",
            "# HELP swarm_sim:http_requests_total Generation requests received (swarm-sim's own).",
            "# TYPE swarm_sim:http_requests_total counter",
            f"swarm_sim:http_requests_total{label} {self.http_requests}",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{label} {self.engine.finished_seqs}",
            "# HELP swarm_sim:aborted_seqs_total Sequences aborted inside the engine (their "
            "client went away), their decoded tokens thrown away (swarm-sim's own).",
            "# TYPE swarm_sim:aborted_seqs_total counter",
            f"swarm_sim:aborted_seqs_total{label} {self.engine.aborted_seqs}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {self.engine.generated_tokens}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {self.prompt_tokens_total}",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{label} {self.prefix.queries}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{label} {self.prefix.hits}",
        ]
        for name, hist in (
            ("vllm:request_queue_time_seconds", self.engine.queue_time),
            ("vllm:e2e_request_latency_seconds", self.engine.e2e_latency),
        ):
            lines.append(f"# TYPE {name} histogram")
            lines += [
                f'{name}_bucket{{le="{le}",model_name="{self.model}"}} {n}'
                for le, n in hist.cumulative()
            ]
            lines += [f"{name}_sum{label} {hist.sum}", f"{name}_count{label} {hist.count}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _set_models(self, request: web.Request) -> web.StreamResponse:
        try:
            models = msgspec.json.decode(await request.read(), type=list[str])
        except msgspec.DecodeError as exc:
            return self._error(400, f"invalid models: {exc}", "BadRequestError")
        if not models:
            return self._error(400, "at least one model name", "BadRequestError")
        self.models = models
        return self._ok(models)

    async def _pid(self, request: web.Request) -> web.StreamResponse:
        """The simulator's process: which process a port belongs to (see sim/launch.py)."""
        return self._ok({"pid": os.getpid()})

    async def _set_faults(self, request: web.Request) -> web.StreamResponse:
        try:
            self.faults = msgspec.json.decode(await request.read(), type=FaultConfig)
        except msgspec.DecodeError as exc:
            return self._error(400, f"invalid faults: {exc}", "BadRequestError")
        self.started = time.monotonic()  # die/stall delays count from now
        self._schedule_death()
        return self._ok(msgspec.to_builtins(self.faults))


def _said(m: _Message) -> str:
    """What a message contributes to the stand-in chat template: its text, its tool calls."""
    calls = _json.encode(m.tool_calls).decode() if m.tool_calls else ""
    return (m.content or "") + calls


def _sample(
    prompt: str,
    max_tokens: int,
    j: int,
    req: _CompletionRequest | _ChatRequest,
    ignore_eos: bool,
) -> tuple[str, int, str]:
    """Sample ``j`` of ``prompt``: greedy decoding (temperature 0, one sample) gives one
    answer, as an engine does; sampling spreads them (see :func:`sim.text.sample_for`)."""
    greedy = req.temperature is not None and req.temperature == 0
    return sample_for(prompt, max_tokens, 0 if greedy else j, ignore_eos=ignore_eos)


def _cut(text: str, max_tokens: int) -> tuple[str, int, str]:
    """``text`` as an engine writes it under ``max_tokens``: whole, or cut off there
    (``finish_reason`` "length", a guided answer's JSON left unclosed)."""
    n = count_tokens(text)
    if n <= max_tokens:
        return text, n, "stop"
    return text[: 4 * max_tokens], max_tokens, "length"  # 4 characters a token, as counted


def _abort(request: web.Request) -> None:
    """Drop the connection without an answer, as a crashed or reset server does."""
    if request.transport is not None:
        request.transport.abort()


class SimFleet:
    """Several :class:`SimEndpoint` in one event loop; an async context manager for tests."""

    def __init__(self, endpoints: Sequence[SimEndpoint]) -> None:
        self.endpoints = list(endpoints)

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints]

    async def __aenter__(self) -> SimFleet:
        for e in self.endpoints:
            await e.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for e in self.endpoints:
            await e.stop()


def _float_list(text: str, n: int, name: str) -> list[float | None]:
    """``"1,,0.5"`` -> per-port values; one value applies to every port; empty means None."""
    parts = text.split(",")
    if len(parts) == 1:
        parts = parts * n
    if len(parts) != n:
        raise SystemExit(f"swarm-sim: --{name} has {len(parts)} values for {n} ports")
    try:
        return [float(p) if p.strip() else None for p in parts]
    except ValueError:
        raise SystemExit(f"swarm-sim: --{name} must be numbers, got {text!r}") from None


def build_fleet(argv: Sequence[str] | None = None) -> SimFleet:
    about = re.sub(r"``([^`]+)``", r"\1", __doc__.split("\n\n")[0])  # without its markup
    p = argparse.ArgumentParser(prog="swarm-sim", description=about)
    p.add_argument("--ports", required=True, help="comma-separated ports, one engine each")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--model",
        default="swarm-sim",
        help="served model name, or one per port (a,b,c); base+adapter serves both names",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--speed", default="1.0", help="per-port speed factors, e.g. 1,1,1,0.5")
    p.add_argument("--step-ms", type=float, default=10.0, help="decode step base cost (ms)")
    p.add_argument("--step-per-seq-ms", type=float, default=0.05, help="added cost per running seq")
    p.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=0.0,
        help="prefill cost of each prompt token not in the engine's prefix cache (default 0)",
    )
    p.add_argument("--instant", action="store_true", help="answer at once (overhead benchmarks)")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="answer every request as if it set vLLM's ignore_eos: exactly max_tokens tokens",
    )
    p.add_argument("--error-rate", default="0", help="fraction of requests answered with HTTP 500")
    p.add_argument("--reset-rate", default="0", help="fraction of connections reset")
    p.add_argument(
        "--fail-on",
        default=None,
        metavar="TEXT",
        help="fail with HTTP 500 every request whose prompts hold TEXT (a poison input, as a "
        "tokenizer error is on vLLM)",
    )
    p.add_argument(
        "--hang-on",
        default=None,
        metavar="TEXT",
        help="never answer a request whose prompts hold TEXT (an engine stuck on one input)",
    )
    p.add_argument("--die-after", default="", help="seconds until a port dies (per port)")
    p.add_argument("--stall-after", default="", help="seconds until a port stalls (per port)")
    p.add_argument(
        "--error-format",
        choices=["nested", "flat"],
        default="nested",
        help="vLLM's current {'error': {...}} body, or the older flat one",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--bos-token",
        default="",
        help="the tokenizer's BOS text (default none); /v1/completions adds it unless the "
        "request sends add_special_tokens false, as vLLM does",
    )
    p.add_argument(
        "--chat-template-bos",
        action="store_true",
        help="the model's chat template starts with the BOS (as {{ bos_token }} templates do)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="as vLLM's: let the model decide to call tools (tool_choice auto); needs "
        "--tool-call-parser",
    )
    p.add_argument("--tool-call-parser", default=None, help="as vLLM's (any name: hermes...)")
    p.add_argument(
        "--runner",
        choices=["auto", "generate", "pooling"],
        default="auto",
        help="as vLLM's: generate has no /v1/embeddings, pooling no generation routes "
        "(default: every route)",
    )
    a = p.parse_args(argv)
    if a.enable_auto_tool_choice and a.tool_call_parser is None:
        raise SystemExit(
            "swarm-sim: --enable-auto-tool-choice needs --tool-call-parser, as in vLLM"
        )
    try:
        ports = [int(x) for x in a.ports.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"swarm-sim: --ports must be integers, got {a.ports!r}") from None
    n = len(ports)
    speeds = _float_list(a.speed, n, "speed")
    errors = _float_list(a.error_rate, n, "error-rate")
    resets = _float_list(a.reset_rate, n, "reset-rate")
    dies = _float_list(a.die_after, n, "die-after")
    stalls = _float_list(a.stall_after, n, "stall-after")
    models = a.model.split(",")
    if len(models) == 1:
        models *= n
    if len(models) != n or not all(m.strip() for m in models):
        raise SystemExit(f"swarm-sim: --model has {len(models)} names for {n} ports")
    endpoints = []
    for i, port in enumerate(ports):
        config = EngineConfig(
            max_num_seqs=a.max_num_seqs,
            max_model_len=a.max_model_len,
            speed=speeds[i] or 1.0,
            step_base_ms=a.step_ms,
            step_per_seq_ms=a.step_per_seq_ms,
            prefill_ms_per_token=a.prefill_ms_per_token,
            instant=a.instant,
            ignore_eos=a.ignore_eos,
        )
        faults = FaultConfig(
            error_rate=errors[i] or 0.0,
            reset_rate=resets[i] or 0.0,
            die_after_s=dies[i],
            stall_after_s=stalls[i],
            fail_on=a.fail_on,
            hang_on=a.hang_on,
        )
        endpoints.append(
            SimEndpoint(
                port,
                config,
                faults,
                host=a.host,
                model=models[i].strip(),
                error_format=a.error_format,
                seed=a.seed,
                bos_token=a.bos_token,
                chat_template_bos=a.chat_template_bos,
                tool_parser=a.tool_call_parser,
                auto_tool_choice=a.enable_auto_tool_choice,
                runner=a.runner,
            )
        )
    return SimFleet(endpoints)


async def _serve(fleet: SimFleet) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with fleet:
        print(f"swarm-sim: serving {', '.join(fleet.urls)}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    fleet = build_fleet(argv)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_serve(fleet))
        except OSError as exc:
            print(f"swarm-sim: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
