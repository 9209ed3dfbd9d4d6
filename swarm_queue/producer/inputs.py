"""Reading prompts from input files: plain text, JSON Lines, OpenAI Batch API request lines.

Accepted lines:

* ``.txt``: one prompt per line;
* JSON Lines: a JSON string (the prompt), an object with ``"prompt"`` (and optional
  ``"custom_id"``), or an OpenAI Batch request ``{"custom_id", "method", "url", "body"}`` whose
  ``body.prompt`` or ``body.messages`` holds the prompt. A single user message is a plain prompt
  (fit for list batching); a longer conversation (a system prompt, earlier turns) is kept whole
  for a ``--chat`` job. The body's own request fields (``model``, ``max_tokens``,
  ``temperature``, ``top_p``, ``stop``, ``seed``, ``n``...) are kept for that prompt
  (:data:`LINE_FIELDS`); fields swarm-queue cannot honour are refused, never ignored.

Blank lines are skipped. Every other line must yield one non-empty prompt, or the reader raises
:class:`~common.errors.InputError` naming the file and line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, Literal, NamedTuple

import msgspec

from swarm_queue.common.chat import Message
from swarm_queue.common.errors import ConfigError, InputError

__all__ = [
    "CHAT_ROLES",
    "DEFAULT_MAX_PROMPT_BYTES",
    "LINE_FIELDS",
    "Format",
    "Parsed",
    "detect_format",
    "is_parquet",
    "iter_prompts",
    "parquet_prompts",
    "prompt_from_json",
]

CHAT_ROLES = ("system", "developer", "user", "assistant")

Format = Literal["auto", "txt", "jsonl", "parquet"]
DEFAULT_MAX_PROMPT_BYTES = 1 << 20

_decode_json = msgspec.json.Decoder().decode


# An OpenAI batch body's request fields honoured per line, as SamplingParams fields (the chat
# API's max_completion_tokens is max_tokens); ``model`` is the line's model.
LINE_FIELDS = {
    "model": "model",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    "response_format": "response_format",
    "n": "n",
}
# A /v1/responses body's request fields honoured per line (its ``input`` and ``instructions``
# are the conversation).
RESPONSES_FIELDS = {
    "model": "model",
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
}
# Fields accepted with no effect on the answer (OpenAI's end-user tag) or only at their default.
_HARMLESS = {"user": None, "stream": False, "encoding_format": "float"}

Route = Literal["completions", "chat", "embeddings", "responses"]

# The URLs an OpenAI batch line may name, and the route each is.
_URLS: dict[str, Route] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}


class Parsed(NamedTuple):
    """One prompt read from the input, with the line it came from."""

    line: int
    prompt: str
    custom_id: str | None
    # A whole conversation (only for chat jobs); None for a single prompt.
    messages: tuple[Message, ...] | None = None
    # An OpenAI batch line's own request fields (see LINE_FIELDS), by SamplingParams name.
    fields: dict[str, Any] | None = None
    # The API an OpenAI batch line names (its url, or the shape of its body); None otherwise.
    route: Route | None = None


def detect_format(name: str, first_line: bytes | None) -> Literal["txt", "jsonl"]:
    """By extension; otherwise (stdin, unknown extension) by whether the first line is JSON."""
    lower = name.lower()
    if lower.endswith(".txt"):
        return "txt"
    if lower.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if first_line is not None and first_line.lstrip()[:1] in (b'"', b"{"):
        try:
            _decode_json(first_line)
            return "jsonl"
        except msgspec.DecodeError:
            pass
    return "txt"


def _request_fields(body: dict[str, Any], route: Route) -> dict[str, Any]:
    """The body's per-line request fields, by SamplingParams name; ValueError for a field
    that cannot be honoured."""
    fields: dict[str, Any] = {}
    names = RESPONSES_FIELDS if route == "responses" else LINE_FIELDS
    for key, value in body.items():
        if key in ("prompt", "messages", "input", "instructions"):
            continue
        if key in _HARMLESS:
            if key != "user" and value not in (None, _HARMLESS[key]):
                raise ValueError(
                    f"OpenAI batch line: body.{key}={value!r} is not supported "
                    "(a batch's answers are not streamed)"
                )
            continue
        if key not in names:
            raise ValueError(
                f"OpenAI batch line: body.{key} is not supported (supported: "
                f"{', '.join(sorted(names))})"
            )
        if key == "stop" and isinstance(value, str):
            value = [value]
        if value is not None:
            fields[names[key]] = value
    return fields


def _route(obj: dict[str, Any], body: dict[str, Any]) -> Route:
    url = obj.get("url")
    if url is None:
        return "chat" if "messages" in body else "embeddings" if "input" in body else "completions"
    if url not in _URLS:
        raise ValueError(f"OpenAI batch line: url {url!r} (expected one of {', '.join(_URLS)})")
    return _URLS[url]


def prompt_from_json(obj: Any) -> Parsed:
    """The prompt of one JSON line (its ``line`` field left 0 for the caller to set)."""
    if isinstance(obj, str):
        return Parsed(0, obj, None)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON string or object, got {type(obj).__name__}")
    custom_id = obj.get("custom_id")
    if custom_id is not None and not isinstance(custom_id, str):
        raise ValueError("custom_id must be a string")
    messages = None
    fields: dict[str, Any] | None = None
    route: Route | None = None
    prompt: Any
    if "body" in obj:
        body = obj["body"]
        if not isinstance(body, dict):
            raise ValueError("OpenAI batch line: body must be an object")
        route = _route(obj, body)
        fields = _request_fields(body, route) or None
        if route == "responses":
            prompt, messages = _response_input(body)
        elif route == "embeddings":
            prompt = body.get("input")
            if isinstance(prompt, list):
                raise ValueError("OpenAI batch line: body.input must be one string, not a list")
            if prompt is None:
                raise ValueError("OpenAI batch line: an embeddings body has no 'input'")
        elif "prompt" in body:
            prompt = body["prompt"]
            if isinstance(prompt, list):
                raise ValueError("OpenAI batch line: body.prompt must be one string, not a list")
        elif "messages" in body:
            prompt, messages = _conversation(body["messages"])
        else:
            raise ValueError("OpenAI batch line: body has neither 'prompt' nor 'messages'")
    elif "prompt" in obj:
        prompt = obj["prompt"]
    else:
        raise ValueError("JSON object has no 'prompt' (or OpenAI batch 'body')")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    return Parsed(0, prompt, custom_id, messages, fields, route)


def _response_input(body: dict[str, Any]) -> tuple[str, tuple[Message, ...] | None]:
    """The prompt of a /v1/responses body: its ``input`` (a text, or messages whose content is
    a text or ``input_text`` parts) after its ``instructions`` (a system message, as the
    engine puts them)."""
    raw, instructions = body.get("input"), body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("OpenAI batch line: body.instructions must be a string")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise ValueError("OpenAI batch line: body.input must be a string or a list of messages")
    messages: list[Any] = [{"role": "system", "content": instructions}] if instructions else []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type", "message") != "message":
            raise ValueError(f"body.input[{i}]: only message items are supported")
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):  # content parts: text ones only
            if not all(isinstance(c, dict) and c.get("type") == "input_text" for c in content):
                raise ValueError(f"body.input[{i}].content: only input_text parts are supported")
            item = {
                "role": item.get("role"),
                "content": "".join(str(c.get("text", "")) for c in content),
            }
        messages.append(item)
    return _conversation(messages, "body.input")


def _conversation(raw: Any, name: str = "body.messages") -> tuple[str, tuple[Message, ...] | None]:
    """The prompt of ``body.messages`` (or a responses line's ``input``: ``name``), and the
    whole conversation unless it is a single user message (which is an ordinary prompt, fit
    for list batching too)."""
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{name} must be a non-empty list")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"{name}[{i}] must be an object")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise ValueError(f"{name}[{i}].role {role!r}: expected one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(
                f"{name}[{i}].content must be a string (content parts are not supported)"
            )
        messages.append(Message(role, content))
    users = [m.content for m in messages if m.role == "user"]
    if not users:
        raise ValueError(f"{name} has no user message")
    if len(messages) == 1:
        return users[0], None
    return users[-1], tuple(messages)


def is_parquet(source: str, fmt: Format) -> bool:
    """Whether the input is a Parquet file (``--format parquet``, or auto and ``.parquet``)."""
    return fmt == "parquet" or (fmt == "auto" and source.endswith(".parquet"))


# Rows read from a Parquet input at a time: its memory stays bounded whatever its size.
_PARQUET_BATCH = 10_000


def parquet_prompts(path: str, column: str, id_column: str | None = None) -> Iterator[Parsed]:
    """The prompts of the Parquet file ``path``'s ``column`` (``id_column``: their custom
    ids, each given and none twice, as a batch file's), read a batch of rows at a time; an
    error names the row (1-based, as ``line``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "a Parquet input needs pyarrow: pip install 'swarm-queue[parquet]'"
        ) from None
    try:
        file = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path} as Parquet: {exc}") from None
    names = file.schema_arrow.names
    wanted = [column, id_column] if id_column else [column]
    for name in wanted:
        if name not in names:
            raise ConfigError(
                f"{path} has no column {name!r} (it has {', '.join(map(repr, names))}): "
                "name the prompt column with --column"
            )
    row = 0
    seen: dict[bytes, int] = {}  # 12-byte digests of the ids met, and their rows
    for batch in file.iter_batches(batch_size=_PARQUET_BATCH, columns=wanted):
        prompts = batch.column(0).to_pylist()
        ids = batch.column(1).to_pylist() if id_column else [None] * len(prompts)
        for prompt, custom in zip(prompts, ids, strict=True):
            row += 1
            if not isinstance(prompt, str):
                raise InputError(path, row, f"column {column!r} holds a "
                                 f"{type(prompt).__name__}, not text")  # fmt: skip
            if id_column is not None:
                if custom is None:
                    raise InputError(path, row, f"column {id_column!r} is null: each prompt "
                                     "needs its custom id")  # fmt: skip
                custom = str(custom)
                key = hashlib.blake2b(custom.encode(), digest_size=12).digest()
                if (first := seen.setdefault(key, row)) != row:
                    raise InputError(path, row, f"custom id {custom!r} repeats row {first}'s "
                                     f"(column {id_column!r}): each must be unique")  # fmt: skip
            yield Parsed(row, prompt, custom)


def iter_prompts(
    lines: Iterable[bytes],
    source: str,
    fmt: Format = "auto",
    *,
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES,
) -> Iterator[Parsed]:
    """Yield every prompt of ``lines`` in order; ``source`` names the input in errors."""
    if fmt == "parquet":
        raise ConfigError("a Parquet input is read from its file (parquet_prompts), not lines")
    resolved: Literal["txt", "jsonl"] | None = None if fmt == "auto" else fmt
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        if resolved is None:
            resolved = detect_format(source, line)
        if len(line) > max_prompt_bytes:
            raise InputError(
                source, lineno, f"line is {len(line)} bytes, over the limit of {max_prompt_bytes}"
            )
        if resolved == "txt":
            try:
                parsed = Parsed(lineno, line.decode("utf-8"), None)
            except UnicodeDecodeError as exc:
                raise InputError(source, lineno, f"not valid UTF-8 ({exc.reason})") from None
        else:
            try:
                parsed = prompt_from_json(_decode_json(line))._replace(line=lineno)
            except msgspec.DecodeError as exc:
                raise InputError(source, lineno, f"invalid JSON: {exc}") from None
            except ValueError as exc:
                raise InputError(source, lineno, str(exc)) from None
        if not parsed.prompt.strip():
            raise InputError(source, lineno, "empty prompt")
        yield parsed
