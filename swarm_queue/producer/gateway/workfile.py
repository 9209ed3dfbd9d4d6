"""A batch's work file (its collected lines, OpenAI's output line shape, in input order)
made into the batch's files: split line by line into the output file (answered requests)
and the error file (failed ones, those its cancel or window's end stopped written as OpenAI
writes them), or renamed whole when no request failed; each file's id a function of the
batch, so that finalizing again writes the same files."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import msgspec

from swarm_queue.common.vocab import FailureKind
from swarm_queue.producer.lines import fsync_dir

__all__ = ["file_id", "forget_work", "rename_whole", "split_lines"]


def file_id(batch_id: str, role: str) -> str:
    """The id of a batch's output (or error) file: a function of the batch, so that
    finalizing again writes the same file."""
    return "file-" + hashlib.blake2b(f"{batch_id}/{role}".encode(), digest_size=12).hexdigest()


class _Error(msgspec.Struct):
    type: str | None = None
    message: str = ""


class _Line(msgspec.Struct):
    """What splitting a work file reads of a line: its error, if any."""

    error: _Error | None = None


_line_error = msgspec.json.Decoder(_Line).decode


class _Ids(msgspec.Struct):
    id: str
    custom_id: str


class _StoppedError(msgspec.Struct):
    code: str
    message: str


class _StoppedLine(msgspec.Struct):
    """A request the batch's cancel or end stopped, in OpenAI's error file shape."""

    id: str
    custom_id: str
    response: None
    error: _StoppedError


_line_ids = msgspec.json.Decoder(_Ids).decode
_encode_line = msgspec.json.Encoder().encode


def _stopped_line(line: bytes, code: str, message: str) -> bytes:
    ids = _line_ids(line)
    stopped = _StoppedLine(ids.id, ids.custom_id, None, _StoppedError(code, message))
    return _encode_line(stopped) + b"\n"


def split_lines(
    work: Path, out: dict[str, Path], stopped: str
) -> tuple[dict[str, int], dict[str, int]]:
    """Each line of ``work`` into ``out["output"]`` (no error) or ``out["error"]``; the bytes
    and the lines of each (blocking: run it in a thread). A request cancelled before it was
    answered (by the batch's cancel or its window's end) is written as OpenAI writes it:
    ``"response": null`` and an error of code ``stopped`` (``batch_cancelled``,
    ``batch_expired``), which code written for OpenAI's batches looks for to send those
    requests again."""
    sizes = {role: 0 for role in out}
    lines_of = {role: 0 for role in out}
    with contextlib.ExitStack() as stack:
        handles = {role: stack.enter_context(open(path, "wb")) for role, path in out.items()}
        if work.exists():
            with open(work, "rb") as lines:
                for line in lines:
                    error = _line_error(line).error
                    role = "output" if error is None else "error"
                    if error is not None and error.type == FailureKind.CANCELLED:
                        line = _stopped_line(line, stopped, error.message)
                    handles[role].write(line)
                    sizes[role] += len(line)
                    lines_of[role] += 1
        for fh in handles.values():
            fh.flush()
            os.fsync(fh.fileno())
    return sizes, lines_of


def rename_whole(work: Path, out: dict[str, Path]) -> dict[str, int]:
    """``work`` (every line an answer, written and fsynced by the collector) renamed to
    ``out["output"]``; the bytes of each file. Run again after a crash that came after the
    rename, it finds the output file in place."""
    if work.exists():
        os.replace(work, out["output"])
        fsync_dir(str(out["output"]))
    out["error"].unlink(missing_ok=True)
    output = out["output"]
    return {"output": output.stat().st_size if output.exists() else 0, "error": 0}


def forget_work(work: Path) -> None:
    """The work file, its cursor and its lock, once the batch's files hold its lines."""
    work.unlink(missing_ok=True)
    for beside in ("cursor", "lock"):  # the collector's cursor and its lock file
        Path(f"{work}.{beside}").unlink(missing_ok=True)
