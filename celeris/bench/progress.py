"""Progress of a bench run as plain lines on stderr: which suite, what it measures, the system
that ran last, item k of n, elapsed time and an estimate of the time left.

Plain lines rather than a redrawn bar: a bench takes minutes, and its output often goes to a log
file or through ``tee``, where carriage-return redraws become noise. At most one line per
``every`` seconds, plus the first and the last of each measurement.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

EVERY_S = 5.0


def clock(seconds: float) -> str:
    """12.3 s -> "0:12"; 3725 s -> "1:02:05"."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """``update(n, system)`` after each measured chunk; ``close()`` at the end. Disabled, it
    prints nothing (``--no-progress``)."""

    def __init__(self, suite: str, what: str, total: int, enabled: bool = True,
                 stream: TextIO | None = None, every: float = EVERY_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.suite, self.what, self.total, self.enabled = suite, what, total, enabled
        self.stream, self.every, self.now = stream, every, now
        self.done, self.system = 0, ""
        self.start = self.last = now()
        self._say(f"{what}: {total} items")

    def update(self, n: int = 1, system: str | None = None) -> None:
        self.done += n
        self.system = system or self.system
        t = self.now()
        if t - self.last >= self.every or self.done >= self.total:
            self.last = t
            self._say(self.line(t))

    def line(self, t: float) -> str:
        elapsed = t - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else None
        eta = "" if left is None or self.done >= self.total else f", about {clock(left)} left"
        last = f", last: {self.system}" if self.system else ""
        return (f"{self.what}: item {min(self.done, self.total)} of {self.total}{last}, "
                f"{clock(elapsed)} elapsed{eta}")

    def close(self) -> None:
        """Nothing to tear down; kept so that a suite reads like one using a bar."""

    def _say(self, text: str) -> None:
        say(self.suite, text, self.enabled, self.stream)


def say(suite: str, text: str, enabled: bool = True, stream: TextIO | None = None) -> None:
    """One line ``bench <suite>: <text>`` on stderr, flushed (stderr may be a pipe)."""
    if enabled:
        out = stream or sys.stderr
        print(f"bench {suite}: {text}" if suite else f"bench: {text}", file=out, flush=True)
