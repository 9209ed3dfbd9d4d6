"""``swarm-collect --format openai``: results as OpenAI Batch API output lines, so tools that read
``/v1/batches`` output files read swarm-queue's too.

A success is ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"},
"error": null}`` with a ``text_completion`` (for a chat job, ``chat.completion``; for an
embeddings job, a ``list`` of one ``embedding``; for a responses job, a ``response``) body,
a choice per sample of a line asked with ``n``. A
failure has the shape vLLM's ``run-batch`` writes: ``"response": {"status_code", "request_id",
"body": null}`` and an error object ``{"object": "error", "message", "type", "param", "code"}``
whose ``type`` is swarm-queue's failure kind (``rejected``, ``cancelled``...) and ``code`` the
status. A ``schema`` failure was answered: its response keeps the body with the text, status
200, beside the error. Inputs without a ``custom_id`` get their prompt index, as a string.

Status of a failure: the server's own for a rejected prompt (400 if it gave none); 400 for a
prompt swarm-queue itself could not send (``bad_entry``, ``cancelled``); 500 for one the
servers or workers failed (``no_choice``, ``dead_letter``, ``missing``).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from swarm_queue.common.models import Result
from swarm_queue.common.request import Route
from swarm_queue.common.vocab import FailureKind

__all__ = ["BatchError", "BatchOutputLine", "BatchResponse", "openai_line"]


class BatchError(msgspec.Struct, frozen=True):
    """vLLM's error object, as run-batch writes it."""

    message: str
    type: str
    code: int
    param: str | None = None
    object: str = "error"


class BatchResponse(msgspec.Struct, frozen=True):
    status_code: int
    request_id: str
    body: dict[str, Any] | None


class BatchOutputLine(msgspec.Struct, frozen=True):
    id: str
    custom_id: str
    response: BatchResponse | None
    error: BatchError | None


_encoder = msgspec.json.Encoder()


def _embedding_body(r: Result) -> dict[str, Any]:
    tokens = r.usage.prompt_tokens if r.usage is not None else None
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": r.vector}],
        "model": r.model,
        # Unknown (a list counted by a server without /tokenize): null, never a 0 count.
        "usage": None if tokens is None else {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _response_body(job: str, r: Result, created: int) -> dict[str, Any]:
    """A ``/v1/responses`` line's answer as vLLM writes it: one message item of one
    ``output_text`` (none for an empty text), the response ``incomplete`` where it was cut at
    its ``max_output_tokens``, and the engine's echo of the request as it wrote it."""
    usage = None
    if r.usage is not None:
        usage = {
            "input_tokens": r.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": r.usage.cached_tokens or 0},
            "output_tokens": r.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": r.usage.reasoning_tokens or 0},
            "total_tokens": r.usage.prompt_tokens + r.usage.completion_tokens,
        }
    cut = r.finish_reason == "length"
    text: dict[str, Any] = {
        "type": "output_text",
        "text": r.text,
        "annotations": [],
        "logprobs": None,
    }
    echo = r.echo or {}
    if "usage" in echo:  # the engine's own words (vLLM's per-turn counts, cache writes...)
        usage = echo["usage"]
    return echo | {
        "id": f"resp_{job}_{r.index}",
        "object": "response",
        "created_at": created,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": r.model,
        "output": [
            {
                "id": f"msg_{job}_{r.index}",
                "type": "message",
                "role": "assistant",
                "status": "completed",  # (vLLM's, even where the response is incomplete)
                "content": [text] if r.text else [],
            }
        ],
        "usage": usage,
    }


def _body(job: str, r: Result, chat: bool, created: int) -> dict[str, Any]:
    usage = None
    if r.usage is not None:
        u = r.usage
        usage = {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            # The details as the engine gave them: null where it did not (as vLLM writes).
            "prompt_tokens_details": None
            if u.cached_tokens is None
            else {"cached_tokens": u.cached_tokens},
            "completion_tokens_details": None
            if u.reasoning_tokens is None
            else {"reasoning_tokens": u.reasoning_tokens},
        }
    # A line asked with ``n``: a choice per sample, each with its own finish reason.
    texts = r.samples if r.samples is not None else [r.text]
    ends = r.finishes if r.finishes is not None else [r.finish_reason] * len(texts)
    if chat:
        choices: list[dict[str, Any]] = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": end,
            }
            for i, (text, end) in enumerate(zip(texts, ends, strict=True))
        ]
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": end}
            for i, (text, end) in enumerate(zip(texts, ends, strict=True))
        ]
        kind, prefix = "text_completion", "cmpl"
    return {
        "id": f"{prefix}-{job}-{r.index}",
        "object": kind,
        "created": created,
        "model": r.model,
        "choices": choices,
        "system_fingerprint": r.fingerprint,
        "usage": usage,
    }


_CLIENT_SIDE = frozenset({FailureKind.BAD_ENTRY, FailureKind.CANCELLED})


def _status(r: Result) -> int:
    if r.ok or r.error_kind == FailureKind.SCHEMA:
        return 200
    if r.error_kind == FailureKind.REJECTED:
        return r.status or 400
    return 400 if r.error_kind in _CLIENT_SIDE else 500


def openai_line(
    job: str, r: Result, *, route: Route = Route.COMPLETIONS, created: int | None = None
) -> bytes:
    """One OpenAI Batch output line (newline included) for result ``r`` of ``job``, whose
    requests went to ``route``."""
    custom_id = r.custom_id if r.custom_id is not None else str(r.index)
    line_id = f"batch_req_{job}_{r.index}"
    status = _status(r)
    body = None
    when = int(time.time()) if created is None else created
    if status == 200 and route is Route.EMBEDDINGS:
        body = _embedding_body(r)
    elif status == 200 and route is Route.RESPONSES:
        body = _response_body(job, r, when)
    elif status == 200:  # answered (a schema failure too: its text is kept)
        body = _body(job, r, route is Route.CHAT, when)
    error = None
    if not r.ok:
        error = BatchError(message=r.error or "", type=r.error_kind or "error", code=status)
    response = BatchResponse(status, f"{job}-{r.index}", body)
    return _encoder.encode(BatchOutputLine(line_id, custom_id, response, error)) + b"\n"
