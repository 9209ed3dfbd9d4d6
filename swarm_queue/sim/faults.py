"""swarm-sim's fault switches: how one endpoint misbehaves, as servers were seen to (set on
the command line, or with ``POST /sim/faults`` at run time)."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["FaultConfig", "told"]


class FaultConfig(msgspec.Struct, kw_only=True):
    """Failure behaviour of one endpoint; ``None`` times mean never."""

    error_rate: float = 0.0
    reset_rate: float = 0.0
    die_after_s: float | None = None
    stall_after_s: float | None = None
    # The model calls tools it was not offered, as a real one may (vLLM's tool parsers pass
    # on whatever name it writes): every CALL directive is answered, offered or not.
    calls_unoffered: bool = False
    # A server that lies in its answers: every choice's (and vector's) index shifted by this
    # much; this many choices (or vectors) left out of each answer; vectors of this many
    # dimensions; vectors holding NaN.
    shift_index: int = 0
    drop_choices: int = 0
    embed_dims: int | None = None
    nan_vectors: bool = False
    # Asked for n > 1 samples a prompt, this many fewer for each (right with n = 1).
    short_samples: int = 0
    # A request holding this text anywhere in its prompts fails whole with HTTP 500, as vLLM
    # fails a list when its tokenizer or chat template raises on one odd input.
    fail_on: str | None = None
    # A request holding this text is never answered (an engine stuck on one input): the
    # client's timeout ends it.
    hang_on: str | None = None


# A value no embedding holds, written as NaN (see told).
_NAN_MARK = 7.0e300
_json = msgspec.json.Encoder()


def told(faults: FaultConfig, payload: dict[str, Any], key: str, n: int = 1) -> bytes:
    """A generation answer's body (its list under ``key``: ``choices`` or ``data``, of ``n``
    samples a prompt), as a lying server sends it when ``faults`` say so."""
    f = faults
    if not (f.shift_index or f.drop_choices or f.nan_vectors or f.short_samples):
        return _json.encode(payload)
    items = payload[key]
    if f.drop_choices:
        items = items[: max(0, len(items) - f.drop_choices)]
    if f.short_samples and n > 1:
        items = [c for c in items if c["index"] % n < n - f.short_samples]
    for item in items:
        item["index"] += f.shift_index
        if f.nan_vectors and "embedding" in item:
            item["embedding"][0] = _NAN_MARK
    payload[key] = items
    if not f.nan_vectors:
        return _json.encode(payload)
    # NaN as vLLM's Python json writes it (a literal NaN, no JSON): msgspec would write null.
    return _json.encode(payload).replace(_json.encode(_NAN_MARK), b"NaN")
