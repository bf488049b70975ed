"""Delivering evaluations to the publishers, surviving their outages.

A publisher that is down (gmond, carbon, the exporter's port) gets ONE warning line per outage
and is retried with capped exponential backoff; nothing is dropped silently. History publishers
(Graphite, OpenMetrics files) keep every evaluation until delivered (bounded: the oldest are
dropped past `max_pending`, with a warning); live publishers (gmond, the exporter) keep only the
latest, because gmond and a scrape only ever show the current value. A publisher is not a sink
target (`streams.sink.Target`): the metrics sink (`ganglia.sink.MetricsTarget`) is the target,
and hands its evaluations to the publishers through `Delivery`.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from ganglia.errors import PublisherUnavailableError
from ganglia.metrics import Evaluation, Metric

__all__ = ["Publisher", "Delivery", "LIVE", "HISTORY"]

LIVE = "live"
HISTORY = "history"


class Publisher(Protocol):
    """Where evaluations go: gmond, the Prometheus exporter, an OpenMetrics file, carbon.
    `publish` returns how many values it sent, or raises PublisherUnavailableError."""

    name: str

    def publish(self, metrics: Sequence[Metric], at: float) -> int: ...

    def close(self) -> None: ...


@dataclass
class _Slot:
    publisher: Publisher
    kind: str
    pending: deque[Evaluation] = field(default_factory=deque)
    failures: int = 0
    retry_at: float = 0.0
    down: bool = False
    sent: int = 0


class Delivery:
    """Every configured publisher with its pending evaluations and backoff state."""

    def __init__(self, publishers: Sequence[tuple[Publisher, str]], *, max_pending: int = 100_000,
                 max_backoff: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 err: TextIO | None = None) -> None:
        self.slots = [_Slot(p, kind) for p, kind in publishers]
        self.max_pending = max_pending
        self.max_backoff = max_backoff
        self.clock = clock
        self.err = err or sys.stderr
        self.dropped = 0

    def _say(self, text: str) -> None:
        print(f"poolledger gangliad: {text}", file=self.err, flush=True)

    def offer(self, ev: Evaluation) -> None:
        """Queue an evaluation for every publisher (a live one keeps only the latest)."""
        for slot in self.slots:
            if slot.kind == LIVE:
                slot.pending.clear()
            elif len(slot.pending) >= self.max_pending:
                slot.pending.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    self._say(f"warning: {slot.publisher.name} is behind by {self.max_pending} "
                              "evaluations; dropping the oldest")
            slot.pending.append(ev)

    def flush(self, *, force: bool = False) -> bool:
        """Try every publisher whose backoff has passed (all when `force`); True when nothing is
        left pending."""
        now = self.clock()
        for slot in self.slots:
            if not slot.pending or (not force and now < slot.retry_at):
                continue
            try:
                while slot.pending:
                    ev = slot.pending[0]
                    slot.sent += slot.publisher.publish(ev.metrics, ev.at)
                    slot.pending.popleft()
            except PublisherUnavailableError as exc:
                slot.failures += 1
                delay = min(self.max_backoff, 2.0 ** (slot.failures - 1))
                slot.retry_at = now + delay
                if not slot.down:
                    self._say(f"warning: {exc}; retrying (every {self.max_backoff:.0f}s at most)")
                slot.down = True
                continue
            if slot.down:
                self._say(f"{slot.publisher.name} is reachable again")
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
        return [s.publisher.name for s in self.slots if s.pending]

    def close(self) -> None:
        for slot in self.slots:
            slot.publisher.close()
