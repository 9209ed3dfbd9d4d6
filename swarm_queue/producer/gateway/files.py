"""Where the Batch API's file bytes live: a directory (``SWARM_GATEWAY_DIR``) that every gateway
process of the fleet reaches, one folder a project. An upload is streamed to a part file,
synced and renamed into place, so a file is there whole or not at all, and no file is ever
held in memory; Redis keeps only its record."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from swarm_queue.common.errors import ConfigError

__all__ = ["FileStore", "default_dir"]


def default_dir() -> Path:
    """``~/.local/share/swarm-queue/gateway`` (or under ``$XDG_DATA_HOME``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "swarm-queue" / "gateway"


class FileStore:
    """The files of every project under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"SWARM_GATEWAY_DIR {root}: {exc.strerror}") from None

    def folder(self, project: str) -> Path:
        folder = self.root / project
        folder.mkdir(exist_ok=True, mode=0o700)
        return folder

    def path(self, project: str, file_id: str) -> Path:
        """Where the bytes of ``file_id`` (an id this gateway made: no path of its own) are."""
        return self.folder(project) / file_id

    async def receive(self, project: str, file_id: str, chunks: AsyncIterator[bytes]) -> int:
        """Write ``chunks`` as the file ``file_id``; returns its size."""
        final = self.path(project, file_id)
        part = final.with_name(final.name + ".part")
        size = 0
        try:
            with open(part, "wb") as fh:  # noqa: ASYNC230 - a local file, written chunk by chunk
                async for chunk in chunks:
                    fh.write(chunk)
                    size += len(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(part, final)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        return size

    def remove(self, project: str, file_id: str) -> None:
        self.path(project, file_id).unlink(missing_ok=True)
