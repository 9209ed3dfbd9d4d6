"""Validating each answer against a JSON Schema, with msgspec.

The schema (the common subset structured-output users write: objects with properties and
``required``, arrays with ``items``, ``string``/``integer``/``number``/``boolean``/``null``,
``enum``, nullable ``type`` lists) is turned once into a msgspec type; each answer is then
decoded against it, so a failure says where and why (``Expected `int`, got `str` - at
`$.age```). A keyword that would change what is valid but that msgspec cannot check is
refused up front rather than silently ignored.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Literal, Union

import msgspec
from msgspec.structs import replace

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.models import Result
from swarm_queue.common.vocab import FailureKind

__all__ = ["AnswerValidator", "schema_type", "validator_of"]

_counter = itertools.count()
# Keywords that only describe, or that the conversion below handles.
_KNOWN = {
    "type", "properties", "required", "items", "enum", "title", "description", "$schema",
    "additionalProperties", "default", "examples",
}  # fmt: skip
_SCALARS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}


def schema_type(schema: Any, where: str = "$") -> Any:
    """A msgspec-decodable type accepting exactly what ``schema`` accepts (in its subset)."""
    if not isinstance(schema, dict):
        raise ConfigError(f"schema at {where}: expected an object, got {type(schema).__name__}")
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ConfigError(
            f"schema at {where}: keyword(s) {', '.join(sorted(unknown))} not supported for "
            "validation (they would be ignored); use structured_outputs to constrain decoding"
        )
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"schema at {where}: enum must be a non-empty list")
        return Literal[tuple(values)]
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [schema_type({**schema, "type": k}, where) for k in kind]
        return Union[tuple(options)]  # noqa: UP007 - built at run time
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return list[schema_type(schema.get("items", {"type": "string"}), f"{where}[]")]  # type: ignore[misc]
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        missing = required - set(props)
        if missing:
            raise ConfigError(f"schema at {where}: required {sorted(missing)} not in properties")
        fields: list[Any] = []
        for name, sub in props.items():
            t = schema_type(sub, f"{where}.{name}")
            fields.append((name, t) if name in required else (name, t, msgspec.UNSET))
        fields.sort(key=len)  # required fields (no default) first
        forbid = schema.get("additionalProperties") is False
        return msgspec.defstruct(
            f"Answer{next(_counter)}",
            [(f[0], f[1] | msgspec.UnsetType, f[2]) if len(f) == 3 else f for f in fields],
            forbid_unknown_fields=forbid,
        )
    raise ConfigError(f"schema at {where}: unsupported type {kind!r}")


class AnswerValidator:
    """Checks answers against one schema; built once per job."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._decoder = msgspec.json.Decoder(schema_type(schema))

    def error(self, text: str) -> str | None:
        """None if ``text`` is valid JSON of the schema, else why not."""
        try:
            self._decoder.decode(text)
        except msgspec.ValidationError as exc:
            return f"does not match the schema: {exc}"
        except msgspec.DecodeError as exc:
            return f"not JSON: {exc}"
        return None

    def checked(self, r: Result) -> Result:
        """``r`` failed with kind ``schema`` if its text does not match; the text is kept."""
        if not r.ok:
            return r
        reason = self.error(r.text or "")
        return r if reason is None else replace(r, error=reason, error_kind=FailureKind.SCHEMA)


_schema_key = msgspec.json.Encoder(order="sorted")


def validator_of(schema: dict[str, Any] | None) -> AnswerValidator | None:
    """The validator of ``schema``, built once per distinct schema however many jobs (or
    generations of one job's name) ask for it; None for no schema."""
    return None if schema is None else _validator(_schema_key.encode(schema))


@functools.lru_cache(maxsize=256)
def _validator(key: bytes) -> AnswerValidator:
    return AnswerValidator(msgspec.json.decode(key))
