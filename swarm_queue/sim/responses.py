"""``/v1/responses`` as vLLM serves it (OpenAI's Responses API, without tools or a stored
conversation): its ``input`` (a text, or messages) after its ``instructions`` is answered as
the chat route answers that conversation, and written as a ``response`` object."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from swarm_queue.sim.refusals import context
from swarm_queue.sim.requests import ChatRequest

if TYPE_CHECKING:
    from swarm_queue.sim.server import SimEndpoint

__all__ = ["ResponsesRequest", "responses_routes"]


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None


_decoder = msgspec.json.Decoder(ResponsesRequest)
_json = msgspec.json.Encoder()


def _text(content: Any) -> Any:
    """A message's content: a text, or its ``input_text`` parts joined."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content


def as_chat(req: ResponsesRequest) -> ChatRequest:
    """The chat request the engine answers for ``req`` (the instructions a system message)."""
    said = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    messages += [{"role": m.get("role"), "content": _text(m.get("content"))} for m in said]
    return msgspec.convert(
        {
            "model": req.model,
            "messages": messages,
            "max_tokens": req.max_output_tokens,
            "temperature": req.temperature,
        },
        ChatRequest,
    )


def _echo(req: ResponsesRequest, prompt_tokens: int, limit: int) -> dict[str, Any]:
    """The request as vLLM 0.32's ``ResponsesResponse.from_request`` echoes it: the sampling
    as the engine ran it (defaults filled; the output limit cut to what the context leaves),
    the rest as asked or at its default (no tools: ``tool_choice`` "none")."""
    room = limit - prompt_tokens
    asked = req.max_output_tokens
    return {
        "instructions": req.instructions,
        "metadata": req.metadata,
        "parallel_tool_calls": True,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "tool_choice": "none",
        "tools": [],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "background": False,
        "max_output_tokens": room if asked is None else min(asked, room),
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "user": req.user,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def response_body(answer: dict[str, Any], req: ResponsesRequest, limit: int) -> dict[str, Any]:
    """The chat route's ``answer`` to ``req`` as a ``response`` object (``limit``: the
    model's context length)."""
    choice = answer["choices"][0]
    usage = answer["usage"]
    cut = choice["finish_reason"] == "length"
    text = choice["message"]["content"]
    # (vLLM's message has no text part for an empty text)
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": answer["model"],
        "output": [
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",  # (vLLM's, even in an incomplete response)
                "content": content if text else [],
                "phase": None,
            }
        ],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            # (vLLM's responses say the prompt tokens found cached, whatever its flags)
            "input_tokens_details": {
                "cached_tokens": cached,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        },
    } | _echo(req, usage["prompt_tokens"], limit)


def responses_routes(endpoint: SimEndpoint) -> list[web.RouteDef]:
    """The route, on a generating endpoint."""

    async def respond(req: ResponsesRequest) -> web.Response:
        asked, limit = req.max_output_tokens or 0, endpoint.config.max_model_len
        if (no := context(0, asked, limit, "max_output_tokens")) is not None:
            return endpoint.refuse(no)  # (in its own name: the chat route's is max_tokens)
        answer = await endpoint.chat_answer(as_chat(req), details=True)
        if answer.status != 200 or answer.body is None:
            return answer  # a refusal, in the chat route's words (vLLM's are the same)
        try:
            said = msgspec.json.decode(answer.body)  # type: ignore[arg-type]
            body = response_body(said, req, limit)
        except (msgspec.DecodeError, KeyError, IndexError, TypeError):
            return answer  # an answer the fault switches garbled, garbled as it is
        return web.Response(body=_json.encode(body), content_type="application/json")

    async def route(request: web.Request) -> web.StreamResponse:
        return await endpoint.serve(request, _decoder, respond)

    return [] if endpoint.runner == "pooling" else [web.post("/v1/responses", route)]
