"""What a simulated vLLM server serves beside generation: ``/v1/models`` (with
``max_model_len``), ``/tokenize``, ``/health``, ``/metrics`` with vLLM's names, and swarm-sim's
own switches (``/sim/faults``, ``/sim/models``, ``/sim/pid``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.requests import TokenizeRequest
from swarm_queue.sim.text import count_tokens

if TYPE_CHECKING:
    from swarm_queue.sim.server import SimEndpoint

__all__ = ["info_routes", "metrics_text"]


def info_routes(sim: SimEndpoint) -> list[web.RouteDef]:
    """The routes of ``sim`` beside generation."""

    async def models(request: web.Request) -> web.StreamResponse:
        if (gone := await sim.alive(request)) is not None:
            return gone
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(sim.started),
                "owned_by": "vllm",
                "root": sim.model,
                "parent": None if name == sim.model else sim.model,
                "max_model_len": sim.config.max_model_len,
            }
            for name in sim.models
        ]
        return sim.ok_reply({"object": "list", "data": data})

    async def tokenize(request: web.Request) -> web.StreamResponse:
        """vLLM's ``/tokenize`` for a prompt: the count the context check uses."""
        if (gone := await sim.alive(request)) is not None:
            return gone
        try:
            req = msgspec.json.decode(await request.read(), type=TokenizeRequest)
        except msgspec.DecodeError as exc:
            return sim.error_reply(400, f"invalid request: {exc}", "BadRequestError")
        n = count_tokens((sim.bos_token if req.add_special_tokens else "") + req.prompt)
        limit = sim.config.max_model_len
        return sim.ok_reply({"count": n, "max_model_len": limit, "tokens": list(range(n))})

    async def health(request: web.Request) -> web.StreamResponse:
        if (gone := await sim.alive(request)) is not None:
            return gone
        return web.Response(status=200)

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(text=metrics_text(sim), content_type="text/plain")

    async def set_models(request: web.Request) -> web.StreamResponse:
        try:
            names = msgspec.json.decode(await request.read(), type=list[str])
        except msgspec.DecodeError as exc:
            return sim.error_reply(400, f"invalid models: {exc}", "BadRequestError")
        if not names:
            return sim.error_reply(400, "at least one model name", "BadRequestError")
        sim.models = names
        return sim.ok_reply(names)

    async def pid(request: web.Request) -> web.StreamResponse:
        """The simulator's process: which process a port belongs to (see sim/launch.py)."""
        return sim.ok_reply({"pid": os.getpid()})

    async def set_faults(request: web.Request) -> web.StreamResponse:
        try:
            faults = msgspec.json.decode(await request.read(), type=FaultConfig)
        except msgspec.DecodeError as exc:
            return sim.error_reply(400, f"invalid faults: {exc}", "BadRequestError")
        sim.set_faults(faults)
        return sim.ok_reply(msgspec.to_builtins(faults))

    return [
        web.get("/v1/models", models),
        web.post("/tokenize", tokenize),
        web.get("/health", health),
        web.get("/metrics", metrics),
        web.post("/sim/faults", set_faults),
        web.get("/sim/pid", pid),
        web.post("/sim/models", set_models),
    ]


def metrics_text(sim: SimEndpoint) -> str:
    """``/metrics`` as vLLM names its gauges and counters (and swarm-sim's own three)."""
    engine, label = sim.engine, f'{{model_name="{sim.model}"}}'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{label} {engine.num_running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{label} {engine.num_waiting}",
        "# HELP swarm_sim:peak_running The most sequences ever running at once (swarm-sim's "
        "own: what polling the running gauge can miss).",
        "# TYPE swarm_sim:peak_running gauge",
        f"swarm_sim:peak_running{label} {engine.peak_running}",
        "# HELP swarm_sim:http_requests_total Generation requests received (swarm-sim's own).",
        "# TYPE swarm_sim:http_requests_total counter",
        f"swarm_sim:http_requests_total{label} {sim.http_requests}",
        "# TYPE vllm:request_success_total counter",
        f"vllm:request_success_total{label} {engine.finished_seqs}",
        "# HELP swarm_sim:aborted_seqs_total Sequences aborted inside the engine (their "
        "client went away), their decoded tokens thrown away (swarm-sim's own).",
        "# TYPE swarm_sim:aborted_seqs_total counter",
        f"swarm_sim:aborted_seqs_total{label} {engine.aborted_seqs}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{label} {engine.generated_tokens}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{label} {sim.prompt_tokens_total}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{label} {sim.prefix.queries}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{label} {sim.prefix.hits}",
    ]
    for name, hist in (
        ("vllm:request_queue_time_seconds", engine.queue_time),
        ("vllm:e2e_request_latency_seconds", engine.e2e_latency),
    ):
        lines.append(f"# TYPE {name} histogram")
        lines += [
            f'{name}_bucket{{le="{le}",model_name="{sim.model}"}} {n}'
            for le, n in hist.cumulative()
        ]
        lines += [f"{name}_sum{label} {hist.sum}", f"{name}_count{label} {hist.count}"]
    return "\n".join(lines) + "\n"
