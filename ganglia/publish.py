"""Delivering evaluations to the publishers, surviving their outages.

A target that is down (gmond, carbon, the exporter's port) gets ONE warning line per outage and
is retried with capped exponential backoff; nothing is dropped silently. History targets
(Graphite, OpenMetrics files) keep every evaluation until delivered (bounded: the oldest are
dropped past `max_pending`, with a warning); live targets (gmond, the exporter) keep only the
latest, because gmond and a scrape only ever show the current value.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from ganglia.errors import TargetUnavailableError
from ganglia.metrics import Evaluation, Metric

__all__ = ["Target", "Delivery", "LIVE", "HISTORY"]

LIVE = "live"
HISTORY = "history"


class Target(Protocol):
    """A publisher: gmond, the Prometheus exporter, an OpenMetrics file, carbon."""

    name: str

    def publish(self, metrics: Sequence[Metric], at: float) -> int: ...

    def close(self) -> None: ...


@dataclass
class _Slot:
    target: Target
    kind: str
    pending: deque[Evaluation] = field(default_factory=deque)
    failures: int = 0
    retry_at: float = 0.0
    down: bool = False
    sent: int = 0


class Delivery:
    """Every configured target with its pending evaluations and backoff state."""

    def __init__(self, targets: Sequence[tuple[Target, str]], *, max_pending: int = 100_000,
                 max_backoff: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 err: TextIO | None = None) -> None:
        self.slots = [_Slot(t, kind) for t, kind in targets]
        self.max_pending = max_pending
        self.max_backoff = max_backoff
        self.clock = clock
        self.err = err or sys.stderr
        self.dropped = 0

    def _say(self, text: str) -> None:
        print(f"poolledger gangliad: {text}", file=self.err, flush=True)

    def offer(self, ev: Evaluation) -> None:
        """Queue an evaluation for every target (a live target keeps only the latest)."""
        for slot in self.slots:
            if slot.kind == LIVE:
                slot.pending.clear()
            elif len(slot.pending) >= self.max_pending:
                slot.pending.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    self._say(f"warning: {slot.target.name} is behind by {self.max_pending} "
                              "evaluations; dropping the oldest")
            slot.pending.append(ev)

    def flush(self, *, force: bool = False) -> bool:
        """Try every target whose backoff has passed (all when `force`); True when nothing is
        left pending."""
        now = self.clock()
        for slot in self.slots:
            if not slot.pending or (not force and now < slot.retry_at):
                continue
            try:
                while slot.pending:
                    ev = slot.pending[0]
                    slot.sent += slot.target.publish(ev.metrics, ev.at)
                    slot.pending.popleft()
            except TargetUnavailableError as exc:
                slot.failures += 1
                delay = min(self.max_backoff, 2.0 ** (slot.failures - 1))
                slot.retry_at = now + delay
                if not slot.down:
                    self._say(f"warning: {exc}; retrying (every {self.max_backoff:.0f}s at most)")
                slot.down = True
                continue
            if slot.down:
                self._say(f"{slot.target.name} is reachable again")
            slot.down, slot.failures, slot.retry_at = False, 0, 0.0
        return all(not s.pending for s in self.slots)

    def drain(self, attempts: int = 4, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Flush with a few backed-off retries (the end of `--once`); True when all delivered."""
        for attempt in range(attempts):
            if self.flush(force=True):
                return True
            if attempt + 1 < attempts:
                sleep(min(self.max_backoff, 2.0 ** attempt))
        return False

    def undelivered(self) -> list[str]:
        return [s.target.name for s in self.slots if s.pending]

    def close(self) -> None:
        for slot in self.slots:
            slot.target.close()
