"""swarm-sim's fault switches: how one endpoint misbehaves, as servers were seen to (set on
the command line, or with ``POST /sim/faults`` at run time)."""

from __future__ import annotations

import msgspec

__all__ = ["FaultConfig"]


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
