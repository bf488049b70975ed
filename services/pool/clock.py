"""A virtual clock and its event queue: the only source of time in the simulated pool.

Simulated daemons never read the wall clock; every timer (MATCH_TIMEOUT, retirement, a job's
exit, a negotiation interval) is a callback on this queue, run in (time, insertion order), so
two runs with the same seed produce the same events in the same order.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from services.pool.errors import ClockError

Callback = Callable[[], None]


@dataclass(eq=False, slots=True)
class Timer:
    """A scheduled callback; `cancel()` makes it a no-op (heap entries are dropped lazily)."""

    at: float
    callback: Callback
    cancelled: bool = field(default=False)

    def cancel(self) -> None:
        """Stop the callback from running; safe to call more than once."""
        self.cancelled = True


class VirtualClock:
    """Simulated time plus a heap of (time, seq, timer); seq breaks ties in scheduling order."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0

    def schedule(self, at: float, callback: Callback) -> Timer:
        """Run `callback` at virtual time `at` (>= now)."""
        if at < self.now:
            raise ClockError(f"cannot schedule at {at} before now {self.now}")
        timer = Timer(float(at), callback)
        self._seq += 1
        heapq.heappush(self._heap, (timer.at, self._seq, timer))
        return timer

    def call_later(self, delay: float, callback: Callback) -> Timer:
        """Run `callback` `delay` seconds from now."""
        return self.schedule(self.now + max(0.0, float(delay)), callback)

    def next_time(self) -> float | None:
        """When the next live timer fires, or None when the queue is empty."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def run_until(self, t: float) -> None:
        """Fire every timer due at or before `t` in order, then leave the clock at `t`."""
        if t < self.now:
            raise ClockError(f"cannot run back to {t} from {self.now}")
        while self._heap and self._heap[0][0] <= t:
            at, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self.now = at
            timer.callback()
        self.now = float(t)

    def __len__(self) -> int:
        return sum(1 for _, _, timer in self._heap if not timer.cancelled)
