"""What vLLM refuses, with vLLM's own message: a refusal is a value the server turns into its
error reply (:meth:`sim.server.SimEndpoint.refuse`), so each rule reads on its own."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Refusal", "context", "embedding_context", "max_tokens", "model", "samples"]


class Refusal(NamedTuple):
    """An HTTP error as vLLM answers it: its status, message, type and the parameter named."""

    status: int
    message: str
    kind: str = "BadRequestError"
    param: str | None = None


def samples(n: int, temperature: float | None) -> Refusal | None:
    """``n`` samples a prompt: fewer than one, or more than one with greedy decoding
    (temperature 0: they would all be the same answer)."""
    if n < 1:
        return Refusal(400, f"n must be at least 1, got {n}.", param="n")
    if n > 1 and temperature == 0:
        return Refusal(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
    return None


def max_tokens(value: int) -> Refusal | None:
    """A completion's ``max_tokens`` below one."""
    if value < 1:
        return Refusal(400, f"max_tokens must be at least 1, got {value}.", param="max_tokens")
    return None


def model(name: str, served: list[str]) -> Refusal | None:
    """A model the server does not serve."""
    if name in served:
        return None
    return Refusal(404, f"The model `{name}` does not exist.", "NotFoundError", "model")


def context(prompt_tokens: int, new_tokens: int, limit: int) -> Refusal | None:
    """A prompt and the tokens asked for that do not fit the model's context."""
    if prompt_tokens + new_tokens <= limit:
        return None
    return Refusal(
        400,
        f"You passed {prompt_tokens} input tokens and requested {new_tokens} output tokens. "
        f"However, the model's context length is only {limit} tokens, resulting in a maximum "
        f"input length of {max(0, limit - new_tokens)} tokens. Please reduce the length of the "
        f"input prompt. (parameter=input_tokens, value={prompt_tokens})",
        param="input_tokens",
    )


def embedding_context(tokens: int, limit: int) -> Refusal | None:
    """An input to embed longer than the model's context."""
    if tokens <= limit:
        return None
    return Refusal(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{tokens} tokens in the input for embedding generation. Please reduce the length of "
        "the input.",
    )
