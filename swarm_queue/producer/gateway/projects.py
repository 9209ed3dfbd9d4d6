"""Who may call the gateway, and as which project: the keys file (``SWARM_GATEWAY_KEYS``), one
``KEY PROJECT [PREFIX]`` a line (``#`` starts a comment). A project sees only its own files and
batches; its jobs are queued under its ``PREFIX`` (the gateway's own by default: a prefix a
Redis ACL user of the project's may be limited to). Keys are kept as digests and never said:
an error names the file's line, not its key.

With no keys file every caller is the project ``default``, and the gateway binds only to the
loopback address (see ``producer.gateway.main``)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from swarm_queue.common.errors import ConfigError, JobNameError
from swarm_queue.common.keys import Keys, validate_job_name

__all__ = ["DEFAULT_PROJECT", "Project", "Projects"]

DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class Project:
    name: str
    prefix: str


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Projects:
    """The projects by key (none: the one open project)."""

    def __init__(self, by_digest: dict[bytes, Project], default_prefix: str) -> None:
        self._by_digest = by_digest
        self.open = not by_digest
        self._default = Project(DEFAULT_PROJECT, default_prefix)

    @classmethod
    def from_file(cls, path: str, default_prefix: str) -> Projects:
        """The keys file at ``path`` ("": none); ConfigError naming the line of a bad one."""
        if not path:
            return cls({}, default_prefix)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"SWARM_GATEWAY_KEYS {path}: cannot read it ({exc})") from None
        by_digest: dict[bytes, Project] = {}
        for lineno, raw in enumerate(text.splitlines(), start=1):
            words = raw.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) not in (2, 3):
                raise ConfigError(f"{path}:{lineno}: expected KEY PROJECT [PREFIX]")
            key, name = words[0], words[1]
            prefix = words[2] if len(words) == 3 else default_prefix
            try:
                validate_job_name(name)
                Keys(prefix)
            except (JobNameError, ConfigError) as exc:
                raise ConfigError(f"{path}:{lineno}: {exc}") from None
            if len(key) < 16:
                raise ConfigError(f"{path}:{lineno}: a key must have at least 16 characters")
            digest = _digest(key)
            if digest in by_digest:
                raise ConfigError(f"{path}:{lineno}: this key is on an earlier line too")
            by_digest[digest] = Project(name, prefix)
        if not by_digest:
            raise ConfigError(f"SWARM_GATEWAY_KEYS {path}: no keys in it")
        return cls(by_digest, default_prefix)

    def project_of(self, authorization: str | None) -> Project | None:
        """The caller's project from its ``Authorization`` header (None: no such key)."""
        if self.open:
            return self._default
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = _digest(key.strip())
        for known, project in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return project
        return None
