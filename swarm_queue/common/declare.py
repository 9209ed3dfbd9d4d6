"""Settings declared once: each field of a settings struct carries its type, default and
bounds, one line of doc and which process reads it (:func:`say`, beside its type); its
environment variable (``SWARM_`` and its name in capitals), the parsing of its text, its
checks and its row of docs/SETTINGS.md are derived from that (:func:`declared`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import msgspec.inspect as mi

from swarm_queue.common.errors import ConfigError

__all__ = ["Declared", "boolean", "declared", "say", "table"]


def say(
    doc: str,
    *,
    default: str | None = None,
    read_by: str = "workers",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> msgspec.Meta:
    """One setting's declaration beside its type: its doc line, its default as the docs say
    it (where its value alone does not), which process reads it, its bounds."""
    bounds: dict[str, Any] = {
        k: v for k, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None
    }
    return msgspec.Meta(description=doc, extra={"default": default, "read_by": read_by}, **bounds)


def boolean(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case), as environment switches are written."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list, its blanks dropped."""
    return tuple(x for x in (f.strip() for f in text.split(",")) if x)


class Declared(NamedTuple):
    """What a setting's declaration says, read once: its name and variable, how its text
    is parsed, its bounds, its doc."""

    name: str
    var: str
    parse_text: Callable[[str], Any]
    kind: str
    bounds: tuple[tuple[str, float], ...]
    default: Any
    doc: str
    default_said: str | None
    read_by: str

    def parse(self, raw: str) -> Any:
        try:
            return self.parse_text(raw)
        except ValueError:
            raise ConfigError(f"{self.var}={raw!r} is not a valid {self.kind}") from None

    def check(self, value: Any) -> None:
        for op, bound in self.bounds:
            if not _HOLDS[op](value, bound):
                raise ConfigError(f"{self.var} must be {op} {bound:g}, got {value}")


_HOLDS: dict[str, Callable[[Any, float], bool]] = {
    ">=": lambda v, b: v >= b,
    ">": lambda v, b: v > b,
    "<=": lambda v, b: v <= b,
}
_PARSE: dict[type, tuple[Callable[[str], Any], str]] = {
    mi.IntType: (int, "int"),
    mi.FloatType: (float, "float"),
    mi.BoolType: (boolean, "switch (on/off)"),
    mi.StrType: (str, "text"),
    mi.VarTupleType: (_names, "list"),
}


def declared(struct: type[msgspec.Struct]) -> tuple[Declared, ...]:
    """The settings ``struct`` declares (its fields with a :func:`say`), in order."""
    out = []
    for f in mi.type_info(struct).fields:  # type: ignore[attr-defined]
        if not isinstance(f.type, mi.Metadata):
            continue  # not a setting of its own (see the fields' comment)
        t, extra = f.type.type, f.type.extra or {}
        parse, kind = _PARSE[type(t)]
        bounds = tuple(
            (op, getattr(t, attr))
            for op, attr in ((">=", "ge"), (">", "gt"), ("<=", "le"))
            if getattr(t, attr, None) is not None
        )
        doc = (f.type.extra_json_schema or {}).get("description", "")
        out.append(
            Declared(f.name, "SWARM_" + f.name.upper(), parse, kind, bounds, f.default, doc,
                     extra.get("default"), extra.get("read_by", "workers"))
        )  # fmt: skip
    return tuple(out)


def table(settings: tuple[Declared, ...]) -> str:
    """The rows of docs/SETTINGS.md's table for ``settings``: variable, default, who reads
    it, what it does."""
    rows = []
    for s in settings:
        default = s.default_said or _said(s.default)
        rows.append(f"| `{s.var}` | {default} | {s.read_by} | {s.doc} |")
    return "\n".join(rows)


def _said(value: Any) -> str:
    """A default as the docs say it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("", ()):
        return ""
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
