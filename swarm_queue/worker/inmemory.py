"""The smallest complete :class:`worker.backend.Backend`: a server in memory, no HTTP. What a
new backend starts from (docs/ARCHITECTURE.md, "A backend"), and the proof that the worker asks
no more of a server than the protocol (tests/test_backend.py runs jobs of every request kind
through it). It answers in ways a test can check: choices out of order, capitals."""

from __future__ import annotations

from typing import Any

from swarm_queue.common.models import SamplingParams
from swarm_queue.worker.replies import (
    ChatBody,
    ChatChoice,
    ChatMessage,
    Choice,
    CompletionBody,
    EmbeddingBody,
    EmbeddingDatum,
    Load,
    ModelInfo,
)

__all__ = ["InMemoryBackend"]


class InMemoryBackend:
    """A server of another kind, in memory: it answers each prompt in capitals (and embeds a
    text as its length and its count of capitals), and knows neither its load nor token
    counts (the optional parts of the protocol)."""

    url = label = "memory://shouting"

    def __init__(self) -> None:
        self.requests = 0
        self.unready = ""

    async def ready(self, timeout_s: float = 10.0) -> bool:
        return True

    async def models(self, timeout_s: float = 30.0) -> list[ModelInfo]:
        return [ModelInfo("shout")]

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
        self.requests += 1
        # Answered in reverse order: the worker maps choices by index, never by position.
        choices = [Choice(i, p.upper(), "stop") for i, p in enumerate(prompts)][::-1]
        return CompletionBody(choices=choices, model=model)

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
        self.requests += 1
        text = messages[-1]["content"].upper()
        return ChatBody(choices=[ChatChoice(0, ChatMessage(text), "stop")], model=model)

    async def respond(
        self,
        model: str,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
    ) -> ChatBody:
        return await self.chat(model, messages, params, timeout_s=timeout_s)

    async def embed(
        self, model: str, texts: list[str], *, timeout_s: float | None = None
    ) -> EmbeddingBody:
        self.requests += 1
        # A text's vector is its length and its count of capitals, answered in reverse order.
        data = [
            EmbeddingDatum(i, [float(len(t)), float(sum(c.isupper() for c in t))])
            for i, t in enumerate(texts)
        ][::-1]
        return EmbeddingBody(data=data, model=model)

    async def load(self, timeout_s: float = 5.0) -> Load | None:
        return None

    async def tokenize(self, prompt: str, model: str, timeout_s: float = 30.0) -> int | None:
        return None

    async def close(self) -> None:
        pass
