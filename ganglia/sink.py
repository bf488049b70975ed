"""The metrics sink: condor_gangliad as a Target of the sink runner (streams/sink.py).

Why its checkpoint is its own (`positions`): the metric values are a function of the whole
collector view, which this target folds in memory from the start of the log. A consumer-group
offset would let a restarted process resume mid-log with an empty view, so the target reports
its own position instead (the start, after a restart), and the runner reads from there.

A batch is acknowledged once it is folded and every evaluation it produced was handed to the
publishers; only then does the position move (the sink contract: tests/contract). When a
publisher is down the batch is refused as a whole (TargetUnavailableError) and the position
stays: the runner backs off and offers the same batch again, whose events this target has
already folded and skips, so only the publishing is retried. A replay thus reaches carbon and
the OpenMetrics file completely, in order; gmond and the exporter only ever get the latest view.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ganglia.gangliad import Gangliad
from ganglia.metrics import Evaluation
from ganglia.publish import Delivery
from schemas.events import Envelope
from streams.log.topics import EVENTS
from streams.sink import Positions, Rejection, SinkItem, TargetUnavailableError

__all__ = ["MetricsTarget"]


class MetricsTarget:
    """Folds the events topic into the collector view and publishes at every boundary."""

    name = "gangliad"

    def __init__(self, daemon: Gangliad, delivery: Delivery,
                 on_evaluation: Callable[[Evaluation], None] | None = None, *,
                 topic: str = EVENTS) -> None:
        self.topics: tuple[str, ...] = (topic,)
        self.daemon = daemon
        self.delivery = delivery
        self.on_evaluation = on_evaluation
        self._folded: Positions = {}  # how far the view was folded (a re-sent event is skipped)
        self._pos: Positions = {}  # acknowledged: every evaluation up to here was published

    def feed(self, env: Envelope) -> None:
        """Fold one event; queue the evaluations of the boundaries it passed."""
        for ev in self.daemon.feed(env):
            self._offer(ev)

    def _offer(self, ev: Evaluation) -> None:
        if self.on_evaluation is not None:
            self.on_evaluation(ev)
        self.delivery.offer(ev)

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        for item in items:
            if item.offset < self._folded.get(item.topic, {}).get(item.partition, 0):
                continue  # folded by an earlier attempt at this batch
            self.feed(item.event)
            self._folded.setdefault(item.topic, {})[item.partition] = item.offset + 1
        if not self.delivery.flush(force=True):
            raise TargetUnavailableError(f"not delivered to {', '.join(self.delivery.undelivered())}")
        self._pos = {t: dict(p) for t, p in upto.items()}
        return []

    def resume(self, positions: Positions) -> None:
        """The daemon's view was restored up to `positions` (a snapshot): read on from there."""
        self._folded = {t: dict(p) for t, p in positions.items()}
        self._pos = {t: dict(p) for t, p in positions.items()}

    def positions(self) -> Positions | None:
        return {t: dict(p) for t, p in self._pos.items()}

    def finish(self) -> Evaluation | None:
        """The view at the log's end, published everywhere (the end of a `--once` run and of
        the first catch-up when following)."""
        final = self.daemon.flush()
        if final is not None:
            self._offer(final)
        return final

    def close(self) -> None:
        self.delivery.close()
