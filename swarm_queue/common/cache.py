"""The response cache shared by every job of one Redis: which prompts it may answer, the key
of an answer, and what is kept of one.

An answer is kept under the key of its request (:mod:`common.request`): a digest of the route
(completions or chat), the model, the text sent (the template filled in) or the messages, every
sampling field (the seed among them), and whether the server adds its special tokens. A request
is cached only when it is deterministic, temperature 0 or a seed, unless its job asks for
sampled ones too.
Only complete answers are kept: never a failure, never an empty text (a ``length`` answer is,
since ``max_tokens`` is part of its key). Each answer records the endpoint and the time (Redis's)
it came from, so the answers of an endpoint that answered wrongly for a while can be purged
(``swarm-jobs --clear-cache --endpoint URL --since T``). Model weights changed under the same
name are not seen: clear the cache then.
"""

from __future__ import annotations

import msgspec

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import JobSpec, PromptItem, Result, SamplingParams, Usage
from swarm_queue.common.request import render, request_key

__all__ = [
    "CachedAnswer",
    "answer_key",
    "cacheable",
    "check_cache_spec",
    "decode_answer",
    "deterministic",
    "encode_answer",
]


class CachedAnswer(msgspec.Struct, frozen=True, omit_defaults=True, array_like=True):
    """One answer as the cache keeps it: what a later prompt's result is made of."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str = ""
    endpoint: str = ""
    # When it was kept, by Redis's clock (0: kept before times were recorded).
    cached_s: float = 0.0

    @classmethod
    def of(cls, r: Result, cached_s: float) -> CachedAnswer:
        return cls(r.text or "", r.finish_reason, r.usage, r.model, r.endpoint, cached_s)

    def result(self, item: PromptItem) -> Result:
        """The result of ``item`` answered from this."""
        return Result(
            index=item.index,
            text=self.text,
            finish_reason=self.finish_reason,
            usage=self.usage,
            endpoint=self.endpoint,
            custom_id=item.custom_id,
            model=self.model,
            cached=True,
        )


_answer_encoder = msgspec.msgpack.Encoder()
_answer_decoder = msgspec.msgpack.Decoder(CachedAnswer)


def deterministic(params: SamplingParams) -> bool:
    """True when the same request gets the same answer: greedy, or a fixed seed."""
    return params.temperature == 0 or params.seed is not None


def check_cache_spec(spec: JobSpec) -> str | None:
    """Refuse a cached job without a model (ConfigError); a warning when its own sampling
    settings are not deterministic, so only prompts with settings of their own could be
    cached; None when all is well."""
    if not spec.cache:
        return None
    if spec.model is None:
        raise ConfigError(
            "the cache needs a model (--model NAME, or model=): an answer depends on the "
            "model, and without one each endpoint answers with whatever model it serves"
        )
    if spec.cache_sampled or deterministic(spec.params):
        return None
    return (
        "--cache keeps deterministic answers only (temperature 0, or a seed): this job's "
        "requests are sampled, so none is kept but those of prompts with settings of their own "
        "(give --temperature 0 or --seed N, or --cache-sampled to keep sampled answers too)"
    )


def answer_key(spec: JobSpec, item: PromptItem) -> str | None:
    """The cache key of ``item``'s answer (its request's key, see :mod:`common.request`), or
    None when it is not to be cached: its job does not use the cache, names no model, the
    request is sampled without ``cache_sampled``, or it asks for several samples."""
    if not spec.cache or spec.model is None:
        return None
    request = render(spec, item)
    if not (spec.cache_sampled or deterministic(request.params)) or (request.params.n or 1) > 1:
        return None  # (an answer kept is one text: never a request's several samples)
    return request_key(request)


def cacheable(r: Result) -> bool:
    """Whether ``r`` may be kept: an endpoint's complete answer (not a failure, not one from
    the cache itself, not an empty text)."""
    return r.ok and not r.cached and bool(r.text)


def encode_answer(r: Result, cached_s: float) -> bytes:
    return _answer_encoder.encode(CachedAnswer.of(r, cached_s))


def decode_answer(blob: bytes) -> CachedAnswer:
    """Raises msgspec.DecodeError on a value that is not an answer."""
    return _answer_decoder.decode(blob)
