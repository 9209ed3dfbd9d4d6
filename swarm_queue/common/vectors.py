"""An embedding as Redis keeps it in a result: float32, little-endian, 4 bytes a dimension
(a quarter of its msgpack floats, and the same bytes on every machine)."""

from __future__ import annotations

import sys
from array import array

__all__ = ["pack_vector", "unpack_vector"]


def pack_vector(values: list[float]) -> bytes:
    """``values`` as float32 little-endian bytes."""
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_vector(data: bytes) -> list[float]:
    """The floats of :func:`pack_vector`'s bytes."""
    values = array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()
