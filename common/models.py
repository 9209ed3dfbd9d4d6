"""Every message swarm-queue puts on the wire, as msgspec Structs.

Redis holds msgpack (compact, fast); the collector writes JSON Lines. Encoders and decoders are
built once here and reused. New fields must get defaults so that old records still decode.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "JobSpec",
    "OutputLine",
    "PromptItem",
    "Result",
    "SamplingParams",
    "Usage",
    "decode_item",
    "decode_result",
    "decode_spec",
    "encode",
    "encode_json_line",
]


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """Sampling settings sent with every request of a job."""

    max_tokens: int = 256
    temperature: float | None = None


class JobSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a job is: written once by the first ``swarm-enqueue``, read by every worker.

    ``model`` None means "whatever model the endpoint serves" (read from ``/v1/models``).
    """

    job: str
    params: SamplingParams = SamplingParams()
    model: str | None = None
    created_s: float = 0.0
    source: str = ""

    def same_settings(self, other: JobSpec) -> bool:
        """True when ``other`` asks for the same model and sampling (creation details aside)."""
        return self.model == other.model and self.params == other.params


class PromptItem(msgspec.Struct, frozen=True, array_like=True):
    """One queued prompt: the body of a stream entry (field ``d``)."""

    index: int
    prompt: str
    custom_id: str | None = None


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one prompt, present only when the endpoint reported them exactly."""

    prompt_tokens: int
    completion_tokens: int


class Result(msgspec.Struct, frozen=True, omit_defaults=True):
    """The outcome of one prompt, success or failure, stored under its index."""

    index: int
    text: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    endpoint: str = ""
    attempts: int = 0
    error: str | None = None
    # Machine-readable error class ("rejected", "no_choice", ...): what swarm-retry filters on.
    error_kind: str | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class OutputLine(msgspec.Struct, frozen=True):
    """One line of ``swarm-collect`` output; ``custom_id`` appears only when the input had one."""

    index: int
    custom_id: str | msgspec.UnsetType = msgspec.UNSET
    text: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    endpoint: str = ""
    attempts: int = 0
    error: str | None = None

    @classmethod
    def of(cls, r: Result) -> OutputLine:
        return cls(
            index=r.index,
            custom_id=r.custom_id if r.custom_id is not None else msgspec.UNSET,
            text=r.text,
            finish_reason=r.finish_reason,
            usage=r.usage,
            endpoint=r.endpoint,
            attempts=r.attempts,
            error=r.error,
        )


_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_spec_decoder = msgspec.msgpack.Decoder(JobSpec)
_item_decoder = msgspec.msgpack.Decoder(PromptItem)
_result_decoder = msgspec.msgpack.Decoder(Result)


def encode(obj: msgspec.Struct) -> bytes:
    """msgpack bytes for Redis."""
    return _msgpack_encoder.encode(obj)


def decode_spec(data: bytes) -> JobSpec:
    return _spec_decoder.decode(data)


def decode_item(data: bytes) -> PromptItem:
    return _item_decoder.decode(data)


def decode_result(data: bytes) -> Result:
    return _result_decoder.decode(data)


def encode_json_line(line: OutputLine) -> bytes:
    """One JSON line, newline included."""
    return _json_encoder.encode(line) + b"\n"
