"""Progress on stderr wherever it goes: a bar on a terminal, and in a log (a batch job's, a
pipe) a line at the first count, then every period, and a last one (seen: swarm-collect
--wait silent for a whole job whose stderr was a file)."""

from __future__ import annotations

import io

import pytest

from swarm_queue.common.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_at_first_then_every_period_and_a_last_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr("swarm_queue.common.progress.time.monotonic", clock)
    out = io.StringIO()
    bar = Progress("swarm-collect", "job j", "answered", every_s=30, file=out)
    bar.update(0, 1000, failed=0)
    for n in range(50, 1000, 50):  # every 5 s: a line only when 30 s have passed
        clock.now += 5
        bar.update(n, 1000, failed=n // 100)
    bar.update(1000, 1000, failed=9)
    bar.close()
    assert out.getvalue().splitlines() == [
        "swarm-collect: job j: 0 of 1,000 answered, failed 0",
        "swarm-collect: job j: 300 of 1,000 answered, failed 3, 10.0 answered/s, eta 70 s",
        "swarm-collect: job j: 600 of 1,000 answered, failed 6, 10.0 answered/s, eta 40 s",
        "swarm-collect: job j: 900 of 1,000 answered, failed 9, 10.0 answered/s, eta 10 s",
        "swarm-collect: job j: 1,000 of 1,000 answered, failed 9, 10.5 answered/s",
    ]


def test_a_terminal_gets_a_bar_and_a_silent_one_nothing() -> None:
    term = _Terminal()
    bar = Progress("swarm-collect", "job j", "answered", file=term)
    bar.update(250, 1000, failed=2)
    bar.close()
    assert "job j:  25%|" in term.getvalue() and "250/1000" in term.getvalue()
    assert "failed=2" in term.getvalue()
    quiet = io.StringIO()
    off = Progress("swarm-collect", "job j", "answered", enabled=False, file=quiet)
    off.update(5, 10)
    off.close()
    assert quiet.getvalue() == ""


def test_work_that_ends_before_its_delay_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("swarm_queue.common.progress.time.monotonic", clock)
    out = io.StringIO()
    quick = Progress("swarm-enqueue", "job j", "prompts read", after_s=5, file=out)
    quick.update(2, None)
    quick.close()
    assert out.getvalue() == ""
    slow = Progress("swarm-enqueue", "job j", "prompts read", after_s=5, file=out)
    slow.update(1000, None)
    clock.now += 6
    slow.update(9000, None)
    slow.update(9500, None)
    slow.close()
    assert out.getvalue().splitlines() == [
        "swarm-enqueue: job j: 9,000 prompts read, 1,333.3 prompts read/s",
        "swarm-enqueue: job j: 9,500 prompts read, 1,416.7 prompts read/s",
    ]
