"""The users' existing hostfile format, and endpoint URL normalisation.

One endpoint per line, tab-separated: ``host<TAB>port<TAB>key=value...``. The port column is
optional (default 8000); blank lines and lines starting with ``#`` are ignored.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from swarm_queue.common.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "Endpoint",
    "endpoints_from_env",
    "normalize_url",
    "parse_endpoints",
    "parse_hostfile",
    "select_endpoints",
]

DEFAULT_PORT = 8000


class Endpoint(msgspec.Struct, frozen=True):
    """An inference server's base URL (no ``/v1``) and the hostfile tags it was listed with."""

    url: str
    tags: dict[str, str] = msgspec.field(default_factory=dict)


def normalize_url(raw: str) -> str:
    """``host:port`` or ``http://host:port[/v1]`` -> ``http://host:port`` (no trailing slash).
    Errors never print a password the URL may hold."""
    text = raw.strip()
    if not text:
        raise ConfigError("empty endpoint URL")
    if "://" not in text:
        text = f"http://{text}"
    shown = _masked(text)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"invalid endpoint URL {shown!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"invalid endpoint URL {shown!r}: expected http(s)://host:port")
    if not _is_host(parts.hostname):
        raise ConfigError(
            f"invalid endpoint URL {shown!r}: {parts.hostname!r} is no host name or address"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"endpoint URL {shown!r}: credentials in the URL are not sent (vLLM takes a bearer "
            "key): give the key in SWARM_API_KEY and drop user:password@ from the URL"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def _is_host(host: str) -> bool:
    """A DNS name (HPC node names may hold ``_``) or an IP address."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None


def _masked(url: str) -> str:
    """``url`` with a ``user:password@`` part hidden (before it can be parsed at all)."""
    scheme, sep, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if "@" not in authority:
        return url
    return f"{scheme}{sep}***@{rest[len(authority.rpartition('@')[0]) + 1 :]}"


def parse_endpoints(csv: str) -> list[Endpoint]:
    """Comma-separated base URLs, as in ``SWARM_ENDPOINTS``."""
    return [Endpoint(normalize_url(p)) for p in csv.split(",") if p.strip()]


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[Endpoint]:
    """Parse hostfile text; errors name ``source`` and the line number."""
    endpoints: list[Endpoint] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        cols = [c.strip() for c in line.split("\t")]
        host, rest = cols[0], [c for c in cols[1:] if c]
        port = DEFAULT_PORT
        if rest and "=" not in rest[0]:
            try:
                port = int(rest[0])
            except ValueError:
                raise ConfigError(f"{source}:{lineno}: invalid port {rest[0]!r}") from None
            if not 0 < port < 65536:
                raise ConfigError(f"{source}:{lineno}: port {port} out of range")
            rest = rest[1:]
        tags: dict[str, str] = {}
        for col in rest:
            key, sep, value = col.partition("=")
            if not sep or not key:
                raise ConfigError(f"{source}:{lineno}: expected key=value, got {col!r}")
            tags[key] = value
        if not host or any(ch.isspace() for ch in host):
            raise ConfigError(
                f"{source}:{lineno}: invalid host {host!r} (columns are tab-separated)"
            )
        endpoints.append(Endpoint(normalize_url(f"{host}:{port}"), tags))
    return endpoints


def endpoints_from_env(env: Mapping[str, str]) -> list[Endpoint]:
    """The endpoints ``SWARM_ENDPOINTS`` or ``SWARM_HOSTFILE`` names (with its filters
    ``SWARM_ENDPOINT_TAG`` and ``SWARM_ENDPOINT_HOST``); none if neither is set."""
    csv = env.get("SWARM_ENDPOINTS", "").strip()
    hostfile = env.get("SWARM_HOSTFILE", "").strip()
    if csv and hostfile:
        raise ConfigError("set SWARM_ENDPOINTS or SWARM_HOSTFILE, not both")
    filters = env.get("SWARM_ENDPOINT_TAG", "").strip() or env.get("SWARM_ENDPOINT_HOST", "")
    if filters.strip() and not hostfile:
        raise ConfigError("SWARM_ENDPOINT_TAG and SWARM_ENDPOINT_HOST filter SWARM_HOSTFILE")
    if csv:
        return parse_endpoints(csv)
    if hostfile:
        path = Path(hostfile)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read SWARM_HOSTFILE {hostfile}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"SWARM_HOSTFILE {hostfile}: not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from None
        return select_endpoints(
            parse_hostfile(text, source=hostfile),
            tag=env.get("SWARM_ENDPOINT_TAG", "").strip(),
            host=env.get("SWARM_ENDPOINT_HOST", "").strip(),
            source=hostfile,
        )
    return []


def select_endpoints(
    endpoints: list[Endpoint], *, tag: str = "", host: str = "", source: str = "hostfile"
) -> list[Endpoint]:
    """The hostfile endpoints with tag ``key=value`` and on ``host`` (short or full name);
    an empty filter keeps all. ConfigError when nothing is left."""
    if tag:
        key, sep, value = tag.partition("=")
        if not sep or not key:
            raise ConfigError(f"SWARM_ENDPOINT_TAG={tag!r}: expected key=value")
        endpoints = [e for e in endpoints if e.tags.get(key) == value]
    if host:
        short = host.split(".")[0]
        endpoints = [
            e for e in endpoints if (urlsplit(e.url).hostname or "").split(".")[0] == short
        ]
    if not endpoints:
        wanted = " and ".join(
            x for x in (f"tag {tag}" if tag else "", f"host {host}" if host else "") if x
        )
        raise ConfigError(f"{source}: no endpoint with {wanted}")
    return endpoints
