"""An answer's body as the ``openai`` SDK reads it: every field its type declares (the SDK's
own ``Completion``, ``ChatCompletion``, ``CreateEmbeddingResponse`` or ``Response``), ids and
times left out. What an output line's body is compared by with the engine's own answer: an
engine's extensions outside OpenAI's types (vLLM's ``kv_transfer_params``, a choice's
``stop_reason``...) are not part of it."""

from __future__ import annotations

from typing import Any

from openai import BaseModel
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

__all__ = ["sdk_view"]

_TYPES: dict[str, type[BaseModel]] = {
    "completions": Completion,
    "chat/completions": ChatCompletion,
    "embeddings": CreateEmbeddingResponse,
    "responses": Response,
}
# Made anew for each answer: never equal between two answers to one request.
_FRESH = frozenset(("id", "created", "created_at"))


def _fields(value: Any) -> Any:
    if isinstance(value, BaseModel):
        names = type(value).model_fields
        return {name: _fields(getattr(value, name)) for name in names if name not in _FRESH}
    if isinstance(value, list):
        return [_fields(v) for v in value]
    if isinstance(value, dict):
        return {k: _fields(v) for k, v in value.items()}
    return value


def sdk_view(route: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body``, an answer of ``/v1/{route}``, validated by the SDK's type and reduced to its
    declared fields (``ValidationError`` for a body the SDK would not read)."""
    view = _fields(_TYPES[route].model_validate(body))
    assert isinstance(view, dict)
    return view
