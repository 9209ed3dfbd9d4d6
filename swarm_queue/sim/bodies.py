"""The bodies of swarm-sim's answers, in vLLM's shape: a completion list, a chat completion,
an embeddings list. Pure functions of what was generated; the fault switches may still make
them lie (:func:`sim.faults.told`)."""

from __future__ import annotations

import hashlib
import time
import uuid
from array import array
from typing import Any

from swarm_queue.sim.text import token_ids

__all__ = ["chat_body", "completion_body", "embedding_body", "fingerprint"]

# One sample as the engine made it: its text, its tokens, its finish reason.
Sample = tuple[str, int, str]


def fingerprint(model: str) -> str:
    """The ``system_fingerprint`` of an engine serving ``model``, shaped as vLLM's (its name,
    its version, eight hex digits of its configuration's hash: here the model's name)."""
    return f"swarm-sim-0.32.0-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def _usage(prompt_tokens: int, completion_tokens: int, cached: int | None) -> dict[str, Any]:
    """vLLM's usage; the prompt tokens found cached only where the server says them."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def completion_body(
    model: str,
    outs: list[Sample],
    seen: list[str],
    n: int,
    prompt_tokens: int,
    ids: bool,
    cached: int | None = None,
) -> dict[str, Any]:
    """``/v1/completions``: choice ``i * n + j`` is prompt ``i``'s sample ``j`` (``seen``: each
    prompt as the model read it); with ``ids``, each choice's token ids as vLLM's
    ``return_token_ids`` gives them."""
    choices = [
        {
            "index": i,
            "text": text,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        | (
            {"prompt_token_ids": token_ids(seen[i // n]), "token_ids": token_ids(text, k)}
            if ids
            else {}
        )
        for i, (text, k, reason) in enumerate(outs)
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "system_fingerprint": fingerprint(model),
        "usage": _usage(prompt_tokens, sum(k for _, k, _ in outs), cached),
    }


def chat_body(
    model: str,
    messages: list[dict[str, Any]],
    reasons: list[str],
    ptoks: int,
    ctoks: int,
    cached: int | None = None,
) -> dict[str, Any]:
    """``/v1/chat/completions`` holding ``messages`` as its choices."""
    choices = [
        {
            "index": j,
            "message": message,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
        }
        for j, (message, reason) in enumerate(zip(messages, reasons, strict=True))
    ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "system_fingerprint": fingerprint(model),
        "usage": _usage(ptoks, ctoks, cached),
    }


def embedding_body(model: str, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
    """``/v1/embeddings``: each input's vector under its index, each value a float32 (vLLM's
    vectors are float32 tensors written out)."""
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": i, "object": "embedding", "embedding": array("f", v).tolist()}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
