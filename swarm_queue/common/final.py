"""A job's final output: what its reduce stage made of its ordered results (the text, the
stages of a tree reduce, the prompts it could not use), as ``swarm-collect --final`` writes it
and Redis keeps it (JSON)."""

from __future__ import annotations

import msgspec

from swarm_queue.common.models import timestamp_s

__all__ = ["FailedPrompt", "LevelInfo", "ReduceOutput", "decode_final", "encode_final"]

_json_encoder = msgspec.json.Encoder()


class FailedPrompt(msgspec.Struct, frozen=True, omit_defaults=True):
    """A prompt a reduce could not use: its index (in its stage), why, and its stage level
    (0: the job's own prompts)."""

    index: int
    error: str
    kind: str | None = None
    level: int = 0


class LevelInfo(msgspec.Struct, frozen=True):
    """One stage of a tree reduce: how many supervisor prompts it ran and how many failed."""

    level: int
    prompts: int
    failed: int = 0
    split_groups: int = 0
    truncated: int = 0


class ReduceOutput(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a job's reduce stage produced, written once, as JSON, to the job's ``final`` key.

    ``value`` is the aggregate (a string for ``concat`` and ``tree``, an object for the others);
    ``error`` is set, and ``value`` None, when the reduce itself could not finish. Every input
    it could not use is in ``failed``: nothing is dropped silently.
    """

    job: str
    kind: str
    value: object = None
    used: int = 0
    failed: list[FailedPrompt] = msgspec.field(default_factory=list)
    levels: list[LevelInfo] = msgspec.field(default_factory=list)
    error: str | None = None
    finished_s: float = 0.0

    @classmethod
    def failure(cls, job: str, kind: str, error: str) -> ReduceOutput:
        """The output of a reduce that could not finish (or was cancelled): ``error`` says why."""
        return cls(job=job, kind=kind, error=error, finished_s=timestamp_s())


_final_decoder = msgspec.json.Decoder(ReduceOutput)


def decode_final(data: bytes) -> ReduceOutput:
    return _final_decoder.decode(data)


def encode_final(output: ReduceOutput) -> bytes:
    """The JSON of a reduce output, as the ``final`` key holds it."""
    return _json_encoder.encode(output)
