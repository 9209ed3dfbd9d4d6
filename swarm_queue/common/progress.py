"""Progress of long work on stderr, wherever stderr goes: a tqdm bar on a terminal (done,
failed, rate, ETA); in a batch job's log or a pipe, where a bar would be one endless line or
nothing, a plain line at the first count and then every ``every_s`` (30 s), and a last one."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

__all__ = ["EVERY_S", "Progress"]

# How often a line is written where stderr is no terminal.
EVERY_S = 30.0


class Progress:
    """``n`` of ``total`` ``unit`` of ``desc``, said by ``prog``; ``enabled`` False: silent."""

    def __init__(
        self,
        prog: str,
        desc: str,
        unit: str,
        *,
        enabled: bool = True,
        every_s: float = EVERY_S,
        after_s: float = 0.0,
        file: TextIO | None = None,
    ) -> None:
        """``after_s``: nothing is shown before that long (work that ends sooner says
        nothing)."""
        self.prog, self.desc, self.unit, self.every_s = prog, desc, unit, every_s
        self.after = time.monotonic() + after_s
        self.file = file or sys.stderr
        self.enabled = enabled
        self.tty = enabled and _isatty(self.file)
        self.bar = tqdm(
            desc=desc,
            unit=f" {unit}",
            file=self.file,
            disable=not self.tty,
            dynamic_ncols=True,
            delay=after_s,
        )
        self.n: int = 0
        self.total: int | None = None
        self.extra = ""
        self._start: tuple[float, int] | None = None
        self._said_at = -float("inf")
        self._said_n = -1

    def update(self, n: int, total: int | None, **figures: int) -> None:
        """Now ``n`` of ``total`` (None: not known yet), with ``figures`` beside (failed...)."""
        self.n, self.total = n, total
        self.extra = "".join(f", {k} {v:,}" for k, v in figures.items())
        if not self.enabled:
            return
        if self.tty:
            if self.bar.total != total:
                self.bar.total = total
            self.bar.n = n
            self.bar.set_postfix(figures, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if self._start is None:
            self._start = (now, n)
        if now >= self.after and now - self._said_at >= self.every_s:
            self._say(now)

    def close(self) -> None:
        """The last line (where no bar shows it), and the bar closed."""
        self.bar.close()
        said = self._said_n >= 0
        if self.enabled and not self.tty and said and self.n != self._said_n:
            self._say(time.monotonic())

    def _say(self, now: float) -> None:
        self._said_at, self._said_n = now, self.n
        of = f" of {self.total:,}" if self.total is not None else ""
        rate = eta = ""
        if self._start is not None and now > self._start[0] and self.n > self._start[1]:
            per_s = (self.n - self._start[1]) / (now - self._start[0])
            rate = f", {per_s:,.1f} {self.unit}/s"
            if self.total is not None and self.total > self.n:
                eta = f", eta {_duration((self.total - self.n) / per_s)}"
        print(
            f"{self.prog}: {self.desc}: {self.n:,}{of} {self.unit}{self.extra}{rate}{eta}",
            file=self.file,
            flush=True,
        )


def _isatty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    """``seconds`` as ``42 s``, ``7 min`` or ``3.2 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
