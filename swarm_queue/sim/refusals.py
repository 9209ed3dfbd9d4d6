"""What vLLM refuses, with vLLM's own message: a refusal is a value the server turns into its
error reply (:meth:`sim.server.SimEndpoint.refuse`), so each rule reads on its own."""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "Refusal",
    "context",
    "listed",
    "max_tokens",
    "model",
    "room",
    "samples",
]


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


def context(
    prompt_tokens: int, new_tokens: int, limit: int, name: str = "max_tokens"
) -> Refusal | None:
    """More new tokens asked for (``name``) than the model's context holds, or a prompt over
    it on its own (vLLM 0.32 counts at most one token past it). A prompt that fits is
    answered, its new tokens cut to what the context has left (:func:`room`)."""
    if new_tokens > limit:
        return Refusal(
            400,
            f"{name}={new_tokens} cannot be greater than max_model_len={limit}. Please request "
            f"fewer output tokens. (parameter={name}, value={new_tokens})",
            param=name,
        )
    if prompt_tokens <= limit:
        return None
    return Refusal(
        400,
        f"This model's maximum context length is {limit} tokens. However, your prompt "
        f"contains at least {limit + 1} input tokens, which exceeds this limit even without "
        f"any output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={limit + 1})",
        param="input_tokens",
    )


def listed(prompt_tokens: list[int], new_tokens: int, limit: int) -> Refusal | None:
    """A list of prompts: its ``max_tokens``, then each prompt (one over the context fails
    the whole list, as in vLLM)."""
    if (no := max_tokens(new_tokens)) is not None:
        return no
    return next((no for n in prompt_tokens if (no := context(n, new_tokens, limit))), None)


def room(prompt_tokens: int, new_tokens: int, limit: int) -> int:
    """The new tokens a prompt that fits gets: those asked for, cut to what the context has
    left (vLLM answers, finishing by ``length``, rather than refusing)."""
    return max(0, min(new_tokens, limit - prompt_tokens))
