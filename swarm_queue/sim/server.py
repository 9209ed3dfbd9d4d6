"""``swarm-sim``: an OpenAI-compatible stand-in for vLLM, one simulated engine per port.

Faithful where swarm-queue depends on it: ``/v1/completions`` with a string or a list of prompts
(choices carry ``index``; ``usage`` is the request's total), ``/v1/chat/completions``,
``/v1/embeddings`` with a string or a list of inputs (a deterministic vector per text, see
:func:`sim.text.embedding_for`; one over-long input fails the whole list, as in vLLM),
``/v1/models`` with ``max_model_len``, ``/health``, ``/metrics`` with vLLM's gauge names
(:mod:`sim.info`), ``/v1/responses`` (:mod:`sim.responses`), and vLLM's 400 for a prompt over
the context, which fails the WHOLE list request (a prompt that fits gets the new tokens the
context has left; each refusal with vLLM's message: :mod:`sim.refusals`).

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

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from swarm_queue.sim import refusals as refused
from swarm_queue.sim.bodies import chat_body, completion_body, embedding_body
from swarm_queue.sim.engine import EngineConfig, EngineStopped, SimEngine
from swarm_queue.sim.faults import FaultConfig, told
from swarm_queue.sim.info import info_routes
from swarm_queue.sim.prefix import PrefixCache
from swarm_queue.sim.refusals import Refusal
from swarm_queue.sim.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    abort,
    chat_decoder,
    completion_decoder,
    cut,
    embedding_decoder,
    sample,
    templated,
)
from swarm_queue.sim.responses import responses_routes
from swarm_queue.sim.text import count_tokens, embedding_for
from swarm_queue.sim.tools import call_message, choice_error, schema_answer, tool_call

__all__ = ["SimEndpoint", "SimFleet"]

_json = msgspec.json.Encoder()


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
        prompt_tokens_details: bool = False,
    ) -> None:
        self.host, self.port = host, port
        # vLLM's --runner: a generating server has no /v1/embeddings, a pooling one no
        # generation routes (a web framework's 404 for them); "auto" serves every route.
        self.runner = runner
        # vLLM's --tool-call-parser and --enable-auto-tool-choice (None: with the parser):
        # without a parser every tool choice but "none" is refused, without the second "auto"
        # (the default), as vLLM refuses them.
        self.tool_parser = tool_parser
        # vLLM's --enable-prompt-tokens-details: chat and completion usage say the prompt
        # tokens found in the prefix cache (a completion list's: its last prompt's, as vLLM).
        self.prompt_tokens_details = prompt_tokens_details
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
        self.prefix = PrefixCache(config.prefix_cache_blocks)
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
        app.router.add_routes([*info_routes(self), *responses_routes(self)])
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

    def error_reply(
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

    def ok_reply(self, payload: Any) -> web.Response:
        return web.Response(body=_json.encode(payload), content_type="application/json")

    def _answer(self, payload: dict[str, Any], key: str, n: int = 1) -> web.Response:
        """A generation answer (its ``key``: ``choices`` or ``data``) of ``n`` samples a
        prompt, as the fault switches have it told (see :func:`sim.faults.told`)."""
        body = told(self.faults, payload, key, n)
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
            abort(request)
            raise EngineStopped()
        if self._stalled_now():
            await self._stall()
        if self.faults.reset_rate and self.rng.random() < self.faults.reset_rate:
            abort(request)
            raise EngineStopped()
        if self.faults.error_rate and self.rng.random() < self.faults.error_rate:
            return self.error_reply(500, "simulated internal server error", "InternalServerError")
        return None

    def refuse(self, refusal: Refusal) -> web.Response:
        """``refusal`` as this server writes its errors."""
        return self.error_reply(*refusal)

    async def serve(
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
                return self.error_reply(400, f"invalid request: {exc}", "BadRequestError")
            self.received.append(msgspec.json.decode(raw))
            if self.faults.fail_on and self.faults.fail_on.encode() in raw:
                why = (
                    f"EngineCore encountered an issue: tokenizer failed on {self.faults.fail_on!r}"
                )
                return self.error_reply(500, why, "InternalServerError")
            if self.faults.hang_on and self.faults.hang_on.encode() in raw:
                await asyncio.Event().wait()  # until the client hangs up
            if (no := refused.model(req.model, self.models)) is not None:
                return self.refuse(no)
            if req.stream:
                return self.refuse(Refusal(400, "swarm-sim does not stream", param="stream"))
            return await respond(req)
        except (EngineStopped, ConnectionResetError):  # we died, or the client hung up
            abort(request)
            return web.Response(status=503)

    async def _generate(
        self, lengths: list[int], prompt_tokens: int, prefills: Sequence[int] = ()
    ) -> None:
        """Decode ``lengths``, each sequence after prefilling its ``prefills`` (uncached prompt
        tokens: see :mod:`sim.engine`)."""
        await self.engine.generate(lengths, prefills)
        if self.dead:
            raise EngineStopped()
        self.requests_total += 1
        self.prompt_tokens_total += prompt_tokens

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, completion_decoder, self._complete)

    async def _complete(self, req: CompletionRequest) -> web.Response:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        if not prompts:
            return self.error_reply(400, "prompt must not be empty", "BadRequestError", "prompt")
        bos = self.bos_token if req.add_special_tokens else ""
        seen = [bos + p for p in prompts]  # what the model reads
        ptoks = [count_tokens(p) for p in seen]
        limit = self.config.max_model_len
        if (no := refused.listed(ptoks, max_tokens, limit)) is not None:
            return self.refuse(no)
        ignore_eos = req.ignore_eos or self.config.ignore_eos
        if (no := refused.samples(req.n, req.temperature)) is not None:
            return self.refuse(no)
        left = {p: refused.room(n, max_tokens, limit) for p, n in zip(seen, ptoks, strict=True)}
        outs = [sample(p, left[p], j, req, ignore_eos) for p in seen for j in range(req.n)]
        # A prompt's samples share its prefill: the first computes it, the others read it.
        prefills = [self.prefix.lookup(p) if j == 0 else 1 for p in seen for j in range(req.n)]
        await self._generate([n for _, n, _ in outs], sum(ptoks), prefills)
        cached = ptoks[-1] - prefills[-req.n] if self.prompt_tokens_details else None
        ids = bool(req.return_token_ids)
        body = completion_body(req.model, outs, seen, req.n, sum(ptoks), ids, cached)
        return self._answer(body, "choices", req.n)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, embedding_decoder, self._embed)

    async def _embed(self, req: EmbeddingRequest) -> web.Response:
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts:
            return self.error_reply(400, "input must not be empty", "BadRequestError", "input")
        if req.encoding_format != "float":
            return self.error_reply(
                400, "swarm-sim answers encoding_format float only", "BadRequestError"
            )
        ptoks = [count_tokens(self.bos_token + t) for t in texts]  # its tokenizer's BOS added
        limit = self.config.max_model_len
        for n in ptoks:  # one over-long input fails the whole list, as in vLLM
            if (no := refused.context(n, 0, limit)) is not None:
                return self.refuse(no)
        await self._generate([1] * len(texts), sum(ptoks), ptoks)  # a prefill, uncached
        dims = () if self.faults.embed_dims is None else (self.faults.embed_dims,)
        vectors = [embedding_for(t, *dims) for t in texts]
        return self._answer(embedding_body(req.model, vectors, sum(ptoks)), "data")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, chat_decoder, self.chat_answer)

    async def chat_answer(self, req: ChatRequest, *, details: bool = False) -> web.Response:
        """The answer to ``req``; ``details``: its usage says the prompt tokens found cached
        whatever the endpoint's --enable-prompt-tokens-details (the responses route's does)."""
        why = choice_error(
            req.tools, req.tool_choice, self.tool_parser is not None, self.auto_tool_choice
        )
        if why is not None:
            return self.error_reply(400, why, "BadRequestError")
        prompt = templated(req, self.bos_token, self.chat_template_bos)
        ptoks = count_tokens(prompt)
        limit = self.config.max_model_len
        max_tokens = req.max_completion_tokens or req.max_tokens or max(1, limit - ptoks)
        if (no := refused.context(ptoks, max_tokens, limit)) is not None:
            return self.refuse(no)
        max_tokens = refused.room(ptoks, max_tokens, limit)
        ignore_eos = req.ignore_eos or self.config.ignore_eos
        if (no := refused.samples(req.n, req.temperature)) is not None:
            return self.refuse(no)
        prefill = [self.prefix.lookup(prompt)] + [1] * (req.n - 1)
        schema = ((req.response_format or {}).get("json_schema") or {}).get("schema")
        call = tool_call(
            [(m.role, m.content) for m in req.messages],
            req.tools,
            req.tool_choice,
            constrained=isinstance(schema, dict),
            offered_only=not self.faults.calls_unoffered,
        )
        cached = ptoks - prefill[0] if details or self.prompt_tokens_details else None
        if call is not None:
            return await self._tool_call(req, call, ptoks, prefill, cached)
        if isinstance(schema, dict):
            text = _json.encode(schema_answer(schema, prompt)).decode()
            outs = [cut(text, max_tokens)] * req.n
        else:
            outs = [sample(prompt, max_tokens, j, req, ignore_eos) for j in range(req.n)]
        await self._generate([n for _, n, _ in outs], ptoks, prefill)
        # (no ``tool_calls`` key where there are none: vLLM 0.32's message drops an empty one)
        messages = [{"role": "assistant", "content": t.lstrip()} for t, _, _ in outs]
        reasons = [reason for _, _, reason in outs]
        ctoks = sum(n for _, n, _ in outs)
        return self._chat_answer(req, messages, reasons, (ptoks, ctoks, cached))

    def _chat_answer(
        self,
        req: ChatRequest,
        messages: list[dict[str, Any]],
        reasons: list[str],
        tokens: tuple[int, int, int | None],
    ) -> web.Response:
        """A chat completion holding ``messages`` as its choices, in vLLM's shape (``tokens``:
        prompt, completion, cached or None)."""
        body = chat_body(req.model, messages, reasons, *tokens)
        return self._answer(body, "choices", req.n)

    async def _tool_call(
        self,
        req: ChatRequest,
        call: tuple[str, str],
        ptoks: int,
        prefill: list[int],
        cached: int | None,
    ) -> web.Response:
        """The answer asking for tool ``call`` (see :func:`sim.tools.call_message`)."""
        ctoks = count_tokens(call[1]) + 4
        await self._generate([ctoks], ptoks, prefill[:1])
        turn = sum(1 for m in req.messages if m.role == "assistant")
        message, reason = call_message(*call, turn, req.tool_choice)
        return self._chat_answer(req, [message], [reason], (ptoks, ctoks, cached))

    async def alive(self, request: web.Request) -> web.Response | None:
        """For the routes beside generation: a dead endpoint drops the connection, a stalled
        one hangs; None while it lives."""
        try:
            if self.dead:
                raise EngineStopped()
            if self._stalled_now():
                await self._stall()
        except EngineStopped:
            abort(request)
            return web.Response(status=503)
        return None

    def set_faults(self, faults: FaultConfig) -> None:
        """Switch to ``faults``; their delays (to die, to stall) count from now."""
        self.faults = faults
        self.started = time.monotonic()
        self._schedule_death()


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
