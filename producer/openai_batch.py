"""``swarm-collect --format openai``: results as OpenAI Batch API output lines, so tools that read
``/v1/batches`` output files read swarm-queue's too.

A success is ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"},
"error": null}`` with a ``text_completion`` (or, for a chat job, ``chat.completion``) body; a
failure is ``{"id", "custom_id", "response": null, "error": {"code", "message"}}``, its code
being swarm-queue's failure kind (``rejected``, ``endpoint``, ``cancelled``...). Inputs without
a ``custom_id`` get their prompt index, as a string, in its place.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from common.models import Result

__all__ = ["BatchError", "BatchOutputLine", "BatchResponse", "openai_line"]


class BatchError(msgspec.Struct, frozen=True):
    code: str
    message: str


class BatchResponse(msgspec.Struct, frozen=True):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchOutputLine(msgspec.Struct, frozen=True):
    id: str
    custom_id: str
    response: BatchResponse | None
    error: BatchError | None


_encoder = msgspec.json.Encoder()


def _body(job: str, r: Result, chat: bool, created: int) -> dict[str, Any]:
    usage = None
    if r.usage is not None:
        usage = {
            "prompt_tokens": r.usage.prompt_tokens,
            "completion_tokens": r.usage.completion_tokens,
            "total_tokens": r.usage.prompt_tokens + r.usage.completion_tokens,
        }
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": r.text},
            "logprobs": None,
            "finish_reason": r.finish_reason,
        }
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
        kind, prefix = "text_completion", "cmpl"
    return {
        "id": f"{prefix}-{job}-{r.index}",
        "object": kind,
        "created": created,
        "model": r.model,
        "choices": [choice],
        "usage": usage,
    }


def openai_line(job: str, r: Result, *, chat: bool = False, created: int | None = None) -> bytes:
    """One OpenAI Batch output line (newline included) for result ``r`` of ``job``."""
    custom_id = r.custom_id if r.custom_id is not None else str(r.index)
    line_id = f"batch_req_{job}_{r.index}"
    if r.ok:
        body = _body(job, r, chat, int(time.time()) if created is None else created)
        line = BatchOutputLine(
            line_id, custom_id, BatchResponse(200, f"{job}-{r.index}", body), None
        )
    else:
        line = BatchOutputLine(
            line_id, custom_id, None, BatchError(r.error_kind or "error", r.error or "")
        )
    return _encoder.encode(line) + b"\n"
