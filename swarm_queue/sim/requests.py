"""What swarm-sim is asked: vLLM's request bodies as it reads them (a field it does not know is
ignored, as vLLM ignores it), and what an answer is made of: a message as the stand-in chat
template reads it, a prompt's sample, an answer cut at ``max_tokens``, a dropped connection."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from swarm_queue.sim.text import count_tokens, sample_for

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "Message",
    "TokenizeRequest",
    "abort",
    "chat_decoder",
    "completion_decoder",
    "cut",
    "embedding_decoder",
    "said",
    "sample",
    "templated",
]

_json = msgspec.json.Encoder()


class CompletionRequest(msgspec.Struct, kw_only=True):
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


class TokenizeRequest(msgspec.Struct, kw_only=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True


class Message(msgspec.Struct):
    role: str
    content: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[Message]
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


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    stream: bool = False  # never set: what the shared route checks


completion_decoder = msgspec.json.Decoder(CompletionRequest)
embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)
chat_decoder = msgspec.json.Decoder(ChatRequest)


def said(m: Message) -> str:
    """What a message contributes to the stand-in chat template: its text, its tool calls."""
    calls = _json.encode(m.tool_calls).decode() if m.tool_calls else ""
    return (m.content or "") + calls


def templated(req: ChatRequest, bos: str, template_bos: bool) -> str:
    """What the model sees of ``req`` (a stand-in chat template, a pure function of the
    messages): the template's BOS where it starts with one, the tokenizer's where asked."""
    prompt = bos if template_bos else ""
    prompt += "".join(f"<|{m.role}|>\n{said(m)}\n" for m in req.messages)
    prompt += "<|assistant|>\n"
    return bos + prompt if req.add_special_tokens else prompt


def sample(
    prompt: str,
    max_tokens: int,
    j: int,
    req: CompletionRequest | ChatRequest,
    ignore_eos: bool,
) -> tuple[str, int, str]:
    """Sample ``j`` of ``prompt``: greedy decoding (temperature 0, one sample) gives one
    answer, as an engine does; sampling spreads them (see :func:`sim.text.sample_for`)."""
    greedy = req.temperature is not None and req.temperature == 0
    return sample_for(prompt, max_tokens, 0 if greedy else j, ignore_eos=ignore_eos)


def cut(text: str, max_tokens: int) -> tuple[str, int, str]:
    """``text`` as an engine writes it under ``max_tokens``: whole, or cut off there
    (``finish_reason`` "length", a guided answer's JSON left unclosed)."""
    n = count_tokens(text)
    if n <= max_tokens:
        return text, n, "stop"
    return text[: 4 * max_tokens], max_tokens, "length"  # 4 characters a token, as counted


def abort(request: web.Request) -> None:
    """Drop the connection without an answer, as a crashed or reset server does."""
    if request.transport is not None:
        request.transport.abort()
