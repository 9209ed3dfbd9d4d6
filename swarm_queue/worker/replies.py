"""What an inference server answers, as the worker reads it: the parts of OpenAI's completion,
chat, responses and embeddings bodies swarm-queue uses, a model it serves, and its scheduler's
load. The types the :class:`worker.backend.Backend` protocol speaks, whatever server answers them
(vLLM's OpenAI server, :class:`worker.endpoint.EndpointClient`, decodes its JSON into them)."""

from __future__ import annotations

from typing import Any

import msgspec

from swarm_queue.common.models import Usage

__all__ = [
    "ANSWER_FIELDS",
    "ChatBody",
    "ChatChoice",
    "ChatMessage",
    "ChatToolCall",
    "Choice",
    "CompletionBody",
    "CompletionUsage",
    "EmbeddingBody",
    "EmbeddingDatum",
    "FunctionCall",
    "Load",
    "ModelInfo",
    "ResponsesBody",
]


class Choice(msgspec.Struct):
    index: int
    text: str = ""
    finish_reason: str | None = None
    # vLLM's answer to ``return_token_ids``: what a choice's own usage is counted from.
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class CompletionUsage(msgspec.Struct):
    """A request's usage; its details where the engine reports them (vLLM: cached tokens with
    ``--enable-prompt-tokens-details``, reasoning tokens with a reasoning parser)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptDetails | None = None
    completion_tokens_details: CompletionDetails | None = None

    def usage(self) -> Usage:
        """This usage as a result carries it."""
        cached = self.prompt_tokens_details
        reasoning = self.completion_tokens_details
        return Usage(
            self.prompt_tokens,
            self.completion_tokens,
            cached.cached_tokens if cached is not None else None,
            reasoning.reasoning_tokens if reasoning is not None else None,
        )


class CompletionBody(msgspec.Struct):
    """The parts of a ``/v1/completions`` response swarm-queue uses."""

    choices: list[Choice] = []
    usage: CompletionUsage | None = None
    model: str = ""
    system_fingerprint: str | None = None


class FunctionCall(msgspec.Struct, frozen=True):
    name: str = ""
    arguments: str = ""


class ChatToolCall(msgspec.Struct, frozen=True):
    id: str = ""
    function: FunctionCall = FunctionCall()


class ChatMessage(msgspec.Struct, frozen=True):
    content: str | None = None
    # What a message without content may hold instead (vLLM's reasoning parsers, tool calls).
    reasoning_content: str | None = None
    tool_calls: list[ChatToolCall] | None = None

    def without_content(self) -> str:
        """Why this message has no text, for the failure that records it."""
        if self.tool_calls:
            return "tool calls only"
        if self.reasoning_content:
            return "reasoning only"
        return "nothing"


class ChatChoice(msgspec.Struct):
    index: int = 0
    message: ChatMessage = ChatMessage()
    finish_reason: str | None = None


class ChatBody(msgspec.Struct):
    """The parts of a ``/v1/chat/completions`` response swarm-queue uses (``echo``: a
    responses answer's, read as this: see :meth:`ResponsesBody.as_chat`)."""

    choices: list[ChatChoice] = []
    usage: CompletionUsage | None = None
    model: str = ""
    system_fingerprint: str | None = None
    echo: dict[str, Any] | None = None


class ResponseContent(msgspec.Struct):
    type: str = ""
    text: str = ""


class ResponseItem(msgspec.Struct):
    type: str = ""
    content: list[ResponseContent] = []


class InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class ResponseUsage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    input_tokens_details: InputDetails | None = None
    output_tokens_details: OutputDetails | None = None


class Incomplete(msgspec.Struct):
    reason: str | None = None


class ResponsesBody(msgspec.Struct):
    """The parts of a ``/v1/responses`` response swarm-queue uses: its text is its message
    items' ``output_text`` parts."""

    output: list[ResponseItem] = []
    status: str | None = None
    incomplete_details: Incomplete | None = None
    usage: ResponseUsage | None = None
    model: str = ""

    def as_chat(self, echo: dict[str, Any] | None = None) -> ChatBody:
        """This answer as a chat answer of one choice, read as one (an answer without a
        message has no content, a message without text parts is "", as vLLM writes an empty
        answer; one cut at ``max_output_tokens`` finished by ``length``), carrying ``echo``."""
        messages = [item for item in self.output if item.type == "message"]
        texts = [
            part.text for item in messages for part in item.content if part.type == "output_text"
        ]
        why = self.incomplete_details.reason if self.incomplete_details else None
        finish = "stop" if self.status == "completed" else why or self.status
        if why == "max_output_tokens":
            finish = "length"
        usage = None
        if (u := self.usage) is not None:
            cached = u.input_tokens_details.cached_tokens if u.input_tokens_details else None
            thought = u.output_tokens_details.reasoning_tokens if u.output_tokens_details else None
            usage = CompletionUsage(
                u.input_tokens,
                u.output_tokens,
                PromptDetails(cached) if cached is not None else None,
                CompletionDetails(thought) if thought is not None else None,
            )
        message = ChatMessage("".join(texts) if messages else None)
        return ChatBody([ChatChoice(0, message, finish)], usage, self.model, echo=echo)


# A response's own fields: the rest of its body (its usage kept whole, in the engine's words)
# is its echo of the request.
ANSWER_FIELDS = frozenset(
    ("id", "object", "created_at", "status", "incomplete_details", "model", "output")
)


class EmbeddingDatum(msgspec.Struct):
    index: int
    # A null among the values is how a JSON writer that refuses NaN (msgspec's, say) writes
    # it: read, so that the vector is refused as the endpoint's failure (see check_vectors).
    embedding: list[float | None] = []


class EmbeddingBody(msgspec.Struct):
    """The parts of a ``/v1/embeddings`` response swarm-queue uses."""

    data: list[EmbeddingDatum] = []
    usage: CompletionUsage | None = None
    model: str = ""


class ModelInfo(msgspec.Struct):
    id: str
    max_model_len: int | None = None


class Load(msgspec.Struct, frozen=True):
    """A server's scheduler load: sequences decoding now, and sequences queued behind them
    (vLLM's gauges)."""

    running: float
    waiting: float
