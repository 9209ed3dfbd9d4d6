"""The OpenAI Batch API's objects as ``swarm-gateway`` keeps and serves them: files, batches,
their errors, OpenAI's error body, and the rules on their fields (which endpoints a batch may
name, its completion window, the shape of an id).

The shapes are OpenAI's (``openai.types.Batch``, ``openai.types.FileObject``), so the official
SDK reads them; Redis holds them as msgpack, each stored record decoded with its new fields
defaulted. A batch's ``status`` is written by the one gateway process driving it; a cancel
asked for meanwhile is kept beside it (see ``common.store.batches``), never written over it.
"""

from __future__ import annotations

import re
import secrets
import time
from enum import StrEnum
from typing import Any

import msgspec

from swarm_queue.common.errors import ConfigError

__all__ = [
    "ENDPOINTS",
    "EXPIRY_S",
    "BatchError",
    "BatchErrors",
    "BatchObject",
    "BatchStatus",
    "BatchUsage",
    "ExpiresAfter",
    "FileObject",
    "InputTokensDetails",
    "OutputTokensDetails",
    "RequestCounts",
    "api_error",
    "decode_batch",
    "decode_file",
    "encode",
    "epoch_s",
    "expiry_s",
    "json_body",
    "new_id",
    "valid_id",
    "window_s",
]

# The endpoints a batch may name, as OpenAI spells them.
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses")


class BatchStatus(StrEnum):
    """A batch's life, as OpenAI names it."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def over(self) -> bool:
        """Whether the batch is over: its files (if any) are final."""
        return self in _OVER


_OVER = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class RequestCounts(msgspec.Struct, frozen=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(msgspec.Struct, frozen=True):
    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, frozen=True):
    reasoning_tokens: int = 0


class BatchUsage(msgspec.Struct, frozen=True):
    """The tokens a batch's answered requests used, as its engines counted them; of them,
    those the engines found cached and those spent reasoning (0 where not reported)."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int = 0


class BatchError(msgspec.Struct, frozen=True):
    """One reason a batch's input failed validation, naming its line (from 1)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, frozen=True):
    data: list[BatchError]
    object: str = "list"


class FileObject(msgspec.Struct, frozen=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class ExpiresAfter(msgspec.Struct, frozen=True):
    """When a file goes: ``seconds`` after its creation (OpenAI's only anchor)."""

    anchor: str
    seconds: int


class BatchObject(msgspec.Struct, frozen=True):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    object: str = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    usage: BatchUsage | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    # When its output and error files go, once written (None: kept until deleted).
    output_expires_after: ExpiresAfter | None = None
    # swarm-queue's own: why its requests wait while it runs (no live worker serves its
    # project's prefix, or its model), said live by the gateway; None when nothing is missing.
    waiting: str | None = None


_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(BatchObject)
_file_decoder = msgspec.msgpack.Decoder(FileObject)


def epoch_s() -> int:
    """Now, as the API's timestamps say it: whole seconds since the epoch."""
    return int(time.time())


def encode(obj: BatchObject | FileObject) -> bytes:
    """msgpack bytes for Redis."""
    return _msgpack.encode(obj)


def decode_batch(data: bytes) -> BatchObject:
    return _batch_decoder.decode(data)


def decode_file(data: bytes) -> FileObject:
    return _file_decoder.decode(data)


def json_body(obj: Any) -> bytes:
    """A response body: any of these objects (or a list page of them) as JSON."""
    return _json.encode(obj)


def api_error(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> bytes:
    """OpenAI's error body (``{"error": {...}}``), which the SDK raises as its own errors."""
    error = {"message": message, "type": type, "param": param, "code": code}
    return _json.encode({"error": error})


# Ids as OpenAI spells them (``file-...``, ``batch_...``); a batch's id is its job's name.
_ID_PREFIX = {"file": "file-", "batch": "batch_"}
_ID_RE = re.compile(r"(file-|batch_)[0-9a-f]{24}")


def new_id(kind: str) -> str:
    """A fresh id of ``kind`` (``file`` or ``batch``): unguessable, and a valid job name."""
    return _ID_PREFIX[kind] + secrets.token_hex(12)


def valid_id(kind: str, value: str) -> bool:
    """Whether ``value`` is an id of ``kind`` as :func:`new_id` makes them (anything else is
    no object here: a 404, and never a Redis key)."""
    m = _ID_RE.fullmatch(value) if isinstance(value, str) else None
    return m is not None and m.group(1) == _ID_PREFIX[kind]


# The expiries OpenAI allows a file: an hour to 30 days after its creation.
EXPIRY_S = (3600, 2_592_000)


def expiry_s(anchor: object, seconds: object) -> int:
    """Seconds of an ``expires_after`` (``output_expires_after``) policy, checked as OpenAI
    checks it; ConfigError naming what is wrong."""
    if anchor != "created_at":
        raise ConfigError(f"expires_after anchor {anchor!r}: the only anchor is 'created_at'")
    lo, hi = EXPIRY_S
    # (a number, or its digits as a form field carries it; never True)
    digits = isinstance(seconds, int | str) and str(seconds).isdigit()
    value = int(seconds) if digits else -1  # type: ignore[call-overload]
    if not lo <= value <= hi:
        raise ConfigError(
            f"expires_after seconds {seconds!r}: from {lo} (1 hour) to {hi} (30 days)"
        )
    return value


_WINDOW_RE = re.compile(r"([1-9][0-9]{0,4})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_s(window: str) -> int:
    """Seconds of a completion window (OpenAI's ``24h``; ``30m``, ``7d``, ``90s`` and the like
    too: a fleet's jobs may be longer, or wanted sooner); ConfigError for anything else."""
    m = _WINDOW_RE.fullmatch(window) if isinstance(window, str) else None
    if m is None:
        raise ConfigError(
            f"completion_window {window!r}: a duration such as '24h' (also 's', 'm' or 'd')"
        )
    return int(m.group(1)) * _UNIT_S[m.group(2)]
