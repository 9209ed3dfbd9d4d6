"""A batch's input file checked line by line before anything is queued, as OpenAI's Batch API
does while a batch is ``validating``: each line one ``POST`` request to the batch's endpoint,
with a ``custom_id`` no other line has, all for one model, each one the job can send (the same
rules ``swarm-enqueue`` applies). A failure names its line, with OpenAI's error code."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from swarm_queue.common.batchapi import BatchError
from swarm_queue.common.errors import InputError
from swarm_queue.common.models import JobSpec
from swarm_queue.producer.enqueue import prompt_of
from swarm_queue.producer.inputs import prompt_from_json

__all__ = ["MAX_ERRORS", "Checked", "check_input"]

# After this many bad lines the rest of the file is not read: enough to fix a file by.
MAX_ERRORS = 20

_decode = msgspec.json.Decoder().decode


class Checked(msgspec.Struct, frozen=True):
    """What checking a batch's input found: the job's spec (with the lines' model), how many
    requests it holds, and its errors (none: it may be queued)."""

    spec: JobSpec
    requests: int
    errors: list[BatchError]


def check_input(path: Path, endpoint: str, spec: JobSpec, max_line_bytes: int) -> Checked:
    """Check every line of the input at ``path`` for a batch of ``endpoint`` queued as
    ``spec`` (blocking: run it in a thread)."""
    checker = _Checker(endpoint, spec, max_line_bytes, path.name)
    errors: list[BatchError] = []
    requests = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            requests += 1
            error = checker.check(lineno, line)
            if error is not None:
                errors.append(error)
                if len(errors) >= MAX_ERRORS:
                    break
    if not requests:
        errors.append(BatchError(code="empty_file", message="The input file holds no requests."))
    return Checked(checker.spec, requests, errors)


class _Checker:
    """The rules one line at a time, with what the lines before it set: the custom_ids seen
    (as digests: a fixed size, whatever their length) and the batch's model."""

    def __init__(self, endpoint: str, spec: JobSpec, max_line_bytes: int, source: str) -> None:
        self.endpoint, self.spec, self.max_line_bytes, self.source = (
            endpoint, spec, max_line_bytes, source,
        )  # fmt: skip
        self.ids: set[bytes] = set()

    def check(self, lineno: int, line: bytes) -> BatchError | None:
        """Why line ``lineno`` cannot be queued (None: it can)."""

        def bad(code: str, message: str, param: str | None = None) -> BatchError:
            return BatchError(code=code, message=message, param=param, line=lineno)

        if len(line) > self.max_line_bytes:
            return bad("line_too_large", f"line is {len(line)} bytes, over {self.max_line_bytes}")
        try:
            obj = _decode(line)
        except msgspec.DecodeError:
            return bad("invalid_json_line", "This line is not parseable as valid JSON.")
        if not isinstance(obj, dict):
            return bad("invalid_json_line", "This line is not a JSON object.")
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return bad("missing_required_parameter", "custom_id must be a string", "custom_id")
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self.ids:
            return bad(
                "duplicate_custom_id",
                f"The custom_id {custom_id!r} is used by an earlier line; each must be unique.",
                "custom_id",
            )
        self.ids.add(digest)
        if obj.get("method", "POST") != "POST":
            return bad("invalid_request", "method must be POST", "method")
        if obj.get("url") != self.endpoint:
            return bad(
                "url_mismatch",
                f"The url {obj.get('url')!r} does not match the batch's endpoint {self.endpoint}.",
                "url",
            )
        try:
            parsed = prompt_from_json(obj)._replace(line=lineno)
        except ValueError as exc:
            return bad("invalid_request", str(exc), "body")
        asked = (parsed.fields or {}).get("model")
        if isinstance(asked, str) and self.spec.model is None:
            self.spec = msgspec.structs.replace(self.spec, model=asked)
        elif isinstance(asked, str) and asked != self.spec.model:
            return bad(
                "model_mismatch",
                f"The model {asked!r} differs from the batch's model {self.spec.model!r}: one "
                "model per batch.",
                "body.model",
            )
        try:
            prompt_of(parsed, self.source, self.spec)
        except InputError as exc:
            return bad("invalid_request", exc.reason, "body")
        return None
