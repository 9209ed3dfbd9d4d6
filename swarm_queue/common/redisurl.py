"""A Redis URL as a user writes it: checked, and never printed with its secret."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from swarm_queue.common.errors import ConfigError

__all__ = ["mask_url", "validate_redis_url"]


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, in the user part or in a ``password=``
    query parameter: the only form a URL is ever printed in. A URL that cannot be parsed is
    not printed at all."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{field.partition('=')[0]}=***"
        if field.partition("=")[0].lower() in _SECRET_PARAMS
        else field
        for field in parts.query.split("&")
    )
    masked = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its form
        masked = masked.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return masked


# Query parameters whose values are secrets (redis-py takes the password as one).
_SECRET_PARAMS = frozenset({"password", "pass", "pwd", "api_key", "token"})


def validate_redis_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {mask_url(url)}: {exc}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)!r}: expected redis://, rediss:// or unix://"
        )
    return url
