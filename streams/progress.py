"""The long commands' progress line: a bar, the rate so far and the time left at that rate.

One helper for `run` (services.mainloop), the folds of a log (`replay` with what-if knobs)
and the sinks' catch-ups (`history update|rebuild`), light enough for any command to import.
"""
from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress", "rate_and_eta"]


def rate_and_eta(elapsed: float, frac: float, done: int) -> str:
    """` 1,234 ev/s ETA 0:12:34` for a progress line: the rate so far and the time left at
    that rate (nothing until a second has passed and some work is done)."""
    if elapsed < 1.0 or frac <= 0.0:
        return ""
    left = int(elapsed * (1.0 - frac) / frac)
    return f" {done / elapsed:,.0f} ev/s ETA {left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}"


class Progress:
    """A one-line progress bar on a terminal stream (wall clock only paces the redraws). A
    stream that is not a terminal (a log file, a pipe) gets nothing: `\\r` redraws would
    litter it, and the run's summary says the same at the end. `after` seconds pass before
    the first redraw, so a command that is quick after all draws nothing."""

    def __init__(self, stream: TextIO | None, width: int = 30, after: float = 0.0) -> None:
        self.stream = stream if stream is not None and stream.isatty() else None
        self.width = width
        self._last = 0.0
        self._started = time.monotonic()
        self._after = after
        self._shown = False

    def update(self, frac: float, hours: float | None, events: int, force: bool = False) -> None:
        """Redraw: `frac` done, `hours` of event time covered (None: not shown), `events`
        handled so far (the rate's numerator)."""
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and (now - self._last < 0.1 or now - self._started < self._after):
            return
        self._last = now
        frac = min(1.0, max(0.0, frac))
        done = int(round(frac * self.width))
        bar = "#" * done + " " * (self.width - done)
        covered = "" if hours is None else f" t={hours:.1f}h"
        self.stream.write(f"\r[{bar}] {frac * 100:3.0f}%{covered} events={events}"
                          + rate_and_eta(now - self._started, frac, events) + "   ")
        self.stream.flush()
        self._shown = True

    @property
    def shown(self) -> bool:
        """Whether a line was drawn (a command quick after all draws none)."""
        return self._shown

    def close(self) -> None:
        if self.stream is not None and self._shown:
            self.stream.write("\n")
            self.stream.flush()
