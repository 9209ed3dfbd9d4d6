"""A batch's input file checked line by line before anything is queued, as OpenAI's Batch API
does while a batch is ``validating``: each line one ``POST`` request to the batch's endpoint,
with a ``custom_id`` no other line has, all for one model, each one the job can send (the same
rules ``swarm-enqueue`` applies). A failure names its line, with OpenAI's error code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from swarm_queue.common.batchapi import BatchError
from swarm_queue.common.errors import InputError
from swarm_queue.common.models import JobSpec
from swarm_queue.producer.enqueue import ParamsMemo, prompt_of
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
    ``spec`` (blocking: run it in a thread). Its memory stays bounded whatever the file's
    size: the custom_ids are remembered in a Bloom filter, and only those it takes for seen
    are looked for again, exactly, in a second pass."""
    seen = _Seen(os.path.getsize(path))
    checker = _Checker(endpoint, spec, max_line_bytes, path.name, seen)
    errors: list[BatchError] = []
    requests = 0
    for lineno, line in _lines(path):
        requests += 1
        error = checker.check(lineno, line)
        if error is not None:
            errors.append(error)
            if len(errors) >= MAX_ERRORS:
                break
    if not requests:
        errors.append(BatchError(code="empty_file", message="The input file holds no requests."))
    if seen.maybe:
        errors = sorted(errors + _duplicates(path, seen.maybe), key=lambda e: e.line or 0)
    return Checked(checker.spec, requests, errors[:MAX_ERRORS])


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines, with their numbers (from 1)."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip(b"\r\n")
            if line.strip():
                yield lineno, line


class _Seen:
    """The custom_ids seen so far, in a Bloom filter of ~12 bits an id (sized from the file:
    a batch line is 64 bytes or more): an id seen is never missed; one not seen is taken for
    seen rarely, and those (``maybe``) are checked exactly by :func:`_duplicates`."""

    PROBES = 6

    def __init__(self, file_bytes: int) -> None:
        bits = 1 << max(20, (12 * max(1, file_bytes // 64)).bit_length())
        self._mask = bits - 1
        self._bits = bytearray(bits // 8)
        self.maybe: set[str] = set()

    def add(self, custom_id: str) -> None:
        # Python's own string hash (64 bits, in C; stable within this process, which is all
        # a filter of one pass needs), its halves the two hashes of the probes.
        h = hash(custom_id) & 0xFFFFFFFFFFFFFFFF
        h1, h2 = h, (h >> 32 | h << 32) | 1
        bits, mask = self._bits, self._mask
        present = True
        for i in range(self.PROBES):
            at = (h1 + i * h2) & mask
            byte, bit = at >> 3, 1 << (at & 7)
            if not bits[byte] & bit:
                present = False
                bits[byte] |= bit
        if present:
            self.maybe.add(custom_id)


# With more custom_ids than this to look for again, the second pass decodes every line rather
# than only those that hold one of them.
_NEEDLES = 256


def _duplicates(path: Path, maybe: set[str]) -> list[BatchError]:
    """Every line whose custom_id (one of ``maybe``) an earlier line has: a second pass."""
    needles = [msgspec.json.encode(c) for c in maybe] if len(maybe) <= _NEEDLES else None
    first: dict[str, int] = {}
    out: list[BatchError] = []
    for lineno, line in _lines(path):
        if needles is not None and not any(n in line for n in needles):
            continue
        try:
            obj = _decode(line)
        except msgspec.DecodeError:
            continue  # said by the first pass
        custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
        if not isinstance(custom_id, str) or custom_id not in maybe:
            continue
        if custom_id not in first:
            first[custom_id] = lineno
            continue
        out.append(
            BatchError(
                code="duplicate_custom_id",
                message=f"The custom_id {custom_id!r} is used by line {first[custom_id]} too; "
                "each must be unique.",
                param="custom_id",
                line=lineno,
            )
        )
        if len(out) >= MAX_ERRORS:
            break
    return out


class _Checker:
    """The rules one line at a time, with what the lines before it set: the custom_ids seen
    (``seen``) and the batch's model."""

    def __init__(
        self, endpoint: str, spec: JobSpec, max_line_bytes: int, source: str, seen: _Seen
    ) -> None:
        self.endpoint, self.spec, self.max_line_bytes, self.source = (
            endpoint, spec, max_line_bytes, source,
        )  # fmt: skip
        self.seen = seen
        self.memo: ParamsMemo = {}

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
        self.seen.add(custom_id)  # a duplicate is said after the pass (see _duplicates)
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
            self.memo.clear()  # (kept for lines of one spec)
        elif isinstance(asked, str) and asked != self.spec.model:
            return bad(
                "model_mismatch",
                f"The model {asked!r} differs from the batch's model {self.spec.model!r}: one "
                "model per batch.",
                "body.model",
            )
        try:
            prompt_of(parsed, self.source, self.spec, self.memo)
        except InputError as exc:
            return bad("invalid_request", exc.reason, "body")
        return None
