"""A batch's input checked line by line before anything is queued, as OpenAI's Batch API
does while a batch is ``validating``: each line one ``POST`` request to the batch's endpoint,
with a ``custom_id`` no other line has, all for one model, each one the job can send (the same
rules ``swarm-enqueue`` applies). A failure names its line, with OpenAI's error code.

The check splits into parts that run at once in separate processes (the fleet is idle while
a batch validates, so its input's check is the batch's critical path): the rules over byte
ranges of the file (:func:`check_rules`), the custom_ids over the whole file
(:func:`check_ids`), and :func:`combine` puts them together as one sequential pass would have
found them."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from pathlib import Path

import msgspec

from swarm_queue.common.batchapi import BatchError
from swarm_queue.common.errors import InputError
from swarm_queue.common.models import JobSpec
from swarm_queue.producer.enqueue import ParamsMemo, prompt_of
from swarm_queue.producer.inputs import prompt_from_json

__all__ = [
    "MAX_ERRORS",
    "Checked",
    "Rules",
    "check_ids",
    "check_input",
    "check_rules",
    "combine",
    "needs_again",
    "split_points",
]

# After this many bad lines the rest of the file is not read: enough to fix a file by.
MAX_ERRORS = 20

_decode = msgspec.json.Decoder().decode


class Checked(msgspec.Struct, frozen=True):
    """What checking a batch's input found: the job's spec (with the lines' model), how many
    requests it holds, and its errors (none: it may be queued)."""

    spec: JobSpec
    requests: int
    errors: list[BatchError]


class Rules(msgspec.Struct, frozen=True):
    """What the rules found over one byte range of the input: the spec after its lines (its
    model set by the range's first line that names one, if the spec had none), how many
    requests the range holds, and its errors (at most :data:`MAX_ERRORS`: the range's first)."""

    spec: JobSpec
    requests: int
    errors: list[BatchError]


def check_input(path: Path, endpoint: str, spec: JobSpec, max_line_bytes: int) -> Checked:
    """Check every line of the input at ``path`` for a batch of ``endpoint`` queued as
    ``spec``, in this process (blocking: run it in a thread or a helper)."""
    rules = check_rules(path, 0, path.stat().st_size, endpoint, spec, max_line_bytes)
    return combine([rules], check_ids(path))


def split_points(path: Path, at: list[float]) -> list[int]:
    """Byte offsets cutting the file at ``path`` into ranges at about the fractions ``at`` of
    its size (ascending), each range starting at a line's start: ``[0, ..., size]``."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as fh:
        for fraction in at:
            fh.seek(max(cuts[-1], int(size * fraction)))
            fh.readline()  # to the next line's start
            cuts.append(min(size, max(cuts[-1], fh.tell())))
    cuts.append(size)
    return cuts


def check_rules(
    path: Path, start: int, end: int, endpoint: str, spec: JobSpec, max_line_bytes: int
) -> Rules:
    """The rules over the lines starting in ``[start, end)`` of ``path`` (``start`` a line's
    start), numbered as in the whole file; each line's custom_id is left to
    :func:`check_ids`."""
    checker = _Checker(endpoint, spec, max_line_bytes, path.name)
    errors: list[BatchError] = []
    requests = 0
    for lineno, line in _lines(path, start, end):
        requests += 1
        error = checker.check(lineno, line)
        if error is not None:
            errors.append(error)
            if len(errors) >= MAX_ERRORS:
                break
    return Rules(checker.spec, requests, errors)


def check_ids(path: Path) -> list[BatchError]:
    """Every line whose custom_id an earlier line has (the first :data:`MAX_ERRORS`), in
    memory bounded but for 8 bytes a line: the ids' hashes in one pass, then the lines whose
    hash came twice looked at again, exactly."""
    seen = _Seen()
    for _, line in _lines(path):
        custom_id = _id_of(line)
        if custom_id is not None:
            seen.add(custom_id)
    doubled = seen.doubled()
    return _duplicates(path, doubled) if doubled else []


def combine(parts: list[Rules], duplicates: list[BatchError]) -> Checked:
    """The check of the whole file from its ranges' rules (in file order) and its duplicate
    custom_ids. A range checked before the batch's model was known adopted the model of its
    own first line that names one; a range that adopted another model than the ranges before
    it must be checked again with theirs (:func:`needs_again` says which)."""
    errors = sorted(
        [e for part in parts for e in part.errors] + duplicates, key=lambda e: e.line or 0
    )
    requests = sum(part.requests for part in parts)
    if not requests:
        errors.append(BatchError(code="empty_file", message="The input file holds no requests."))
    spec = parts[0].spec
    for part in parts[1:]:
        if spec.model is None:
            spec = part.spec
    return Checked(spec, requests, errors[:MAX_ERRORS])


def needs_again(parts: list[Rules]) -> int | None:
    """The first range (after the first) whose lines named another model than the ranges
    before it had set: it was checked without knowing theirs, so it must be checked again
    with their spec (None: every range's check stands)."""
    model = parts[0].spec.model
    for k, part in enumerate(parts[1:], start=1):
        if model is None:
            model = part.spec.model
        elif part.spec.model is not None and part.spec.model != model:
            return k
    return None


def _lines(path: Path, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines starting in ``[start, end)``, with their numbers in the whole file
    (from 1; the lines before ``start`` are counted first, in C)."""
    with open(path, "rb") as fh:
        lineno = 1 + _newlines(fh, start)
        offset = start
        for raw in fh:
            if end is not None and offset >= end:
                return
            offset += len(raw)
            line = raw.rstrip(b"\r\n")
            if line.strip():
                yield lineno, line
            lineno += 1


def _newlines(fh: object, upto: int) -> int:
    """How many newlines the file's first ``upto`` bytes hold; leaves ``fh`` at ``upto``."""
    count = 0
    left = upto
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))  # type: ignore[attr-defined]
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


class _Seen:
    """The custom_ids seen so far, as 64-bit hashes (8 bytes an id, in arrays by their top
    bits): :meth:`doubled` finds the hashes seen twice at the end, an array at a time, in C.
    An id seen before always has a doubled hash; two ids that only share a hash are rare (at
    32 bits, one pair in 100,000 ids was usual, and its second pass cost a third of the
    check), and :func:`_duplicates` tells them apart exactly. (A Bloom filter probed in
    Python took 40% of the check's time.)"""

    ARRAYS = 64

    def __init__(self) -> None:
        self._hashes = [array("Q") for _ in range(self.ARRAYS)]

    def add(self, custom_id: str) -> None:
        h = _hash(custom_id)
        self._hashes[h >> 58].append(h)

    def doubled(self) -> set[int]:
        """The hashes added more than once."""
        out: set[int] = set()
        for hashes in self._hashes:
            if len(set(hashes)) == len(hashes):
                continue  # no hash twice here: the usual case, found in C
            once: set[int] = set()
            for h in hashes:
                if h in once:
                    out.add(h)
                once.add(h)
        return out


def _hash(custom_id: str) -> int:
    """Python's own string hash, as 64 bits unsigned: in C and kept by the string, but salted
    per process, so both passes over one file's ids run in one process."""
    return hash(custom_id) & 0xFFFF_FFFF_FFFF_FFFF


class _Id(msgspec.Struct):
    """A line's custom_id, all a second pass decodes of it."""

    custom_id: object = None


_decode_id = msgspec.json.Decoder(_Id).decode


def _id_of(line: bytes) -> str | None:
    """The line's custom_id (None: it has none, or is not a JSON object: the rules say so)."""
    try:
        custom_id = _decode_id(line).custom_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return custom_id if isinstance(custom_id, str) and custom_id else None


def _duplicates(path: Path, doubled: set[int]) -> list[BatchError]:
    """Every line whose custom_id (of a hash in ``doubled``) an earlier line has: a second
    pass, exact."""
    first: dict[str, int] = {}
    out: list[BatchError] = []
    for lineno, line in _lines(path):
        custom_id = _id_of(line)
        if custom_id is None or _hash(custom_id) not in doubled:
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
    """The rules one line at a time, with what the lines before it set: the batch's model."""

    def __init__(self, endpoint: str, spec: JobSpec, max_line_bytes: int, source: str) -> None:
        self.endpoint, self.spec, self.max_line_bytes, self.source = (
            endpoint, spec, max_line_bytes, source,
        )  # fmt: skip
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
        # (a custom_id another line has is said by check_ids)
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
