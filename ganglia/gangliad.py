"""The gangliad loop in event time: fold the collector view, evaluate the metric set at every
GANGLIAD_INTERVAL boundary the log's time passes.

Why event time: a replay of the same log must give the same series (DESIGN.md invariant 3).
The collector view is the ledger's own pool fold (`streams.core.collector`, through its public
`apply`/`current_ads`, behind the ledger's `Dedup`), so the ads measured are exactly the ones
the accounting saw. An
evaluation at boundary `b` sees every event with `ts < b`; a log that jumps over many
intervals (a quiet pool, a far-future event) is evaluated at the first and the last boundary
of the gap, not once per skipped interval.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from ganglia.metrics import Evaluation, Evaluator, GangliadConfig, MetricDef
from schemas.config import SettingsLike
from schemas.events import Envelope
from streams.core import collector
from streams.core.errors import EventRejectedError
from streams.core.ledger import Dedup, Ledger
from streams.core.reconcile import DRIFT_AD_TYPE, drift_ad

__all__ = ["Gangliad"]



class Gangliad:
    """Folds events into the collector view and yields an Evaluation per interval boundary."""

    def __init__(self, defs: list[MetricDef], cfg: GangliadConfig, settings: SettingsLike,
                 *, fast: bool = True, reconcile: bool = False) -> None:
        """`reconcile`: fold the whole ledger, not only the collector view, and evaluate the
        metrics over its reconciliation rows too (one "Reconciliation" ad per negotiator and
        submitter or group, `streams.core.reconcile.drift_ad`): drift from a real negotiator
        needs PoolLedger's own accounting, which the collector view does not hold."""
        self.cfg = cfg
        self.evaluator = Evaluator(defs, cfg, fast=fast)
        self.pool_cfg = collector.PoolConfig.from_settings(settings)
        self.state = collector.PoolState()
        self.dedup = Dedup()  # the ledger's: a redelivered event is folded once
        self.ledger: Ledger | None = None
        if reconcile:
            self.ledger = Ledger(settings)
            self.state, self.dedup = self.ledger.collector_view()  # the ledger folds them
        self.next_due: float | None = None
        self.last_ts: float | None = None
        self.configured_host = _host(settings.get("COLLECTOR_HOST"))
        self.known_host = ""

    def collector_host(self) -> str:
        """Where aggregates are published, the same at every evaluation (else their series
        split in Prometheus and Graphite): COLLECTOR_HOST when configured, as condor_gangliad
        publishes them under the collector it queries; else the machine of the pool's
        Collector ad, and after that ad expired or was invalidated the last one seen. Before
        a log's first Collector ad, "localhost" (set COLLECTOR_HOST to have one name from the
        first evaluation on)."""
        if self.configured_host:
            return self.configured_host
        for rec in collector.current_ads(self.state, "Collector"):
            machine = rec.ad.get("Machine")
            if isinstance(machine, str) and machine:
                self.known_host = machine
                return machine
        return self.known_host or "localhost"

    def resume(self, state: collector.PoolState, dedup: Dedup, last_ts: float) -> None:
        """Go on from a collector view folded up to event time `last_ts` (a snapshot's):
        the next boundary is the one a fold of those events would be waiting for."""
        self.state, self.dedup, self.last_ts = state, dedup, last_ts
        self.next_due = (math.floor(last_ts / self.cfg.interval) + 1) * self.cfg.interval

    def resume_ledger(self, ledger: Ledger, last_ts: float) -> None:
        """`resume` for a daemon with `reconcile`: go on folding `ledger` (a snapshot's)."""
        self.ledger = ledger
        state, dedup = ledger.collector_view()
        self.resume(state, dedup, last_ts)

    def evaluate(self, at: float) -> Evaluation:
        """The metric set over the current collector view, stamped `at`."""
        ads = [(rec.ad_type, rec.ad) for rec in collector.current_ads(self.state)]
        if self.ledger is not None:
            ads += [(DRIFT_AD_TYPE, drift_ad(row, at)) for row in self.ledger.reconciliation()]
        return self.evaluator.evaluate(ads, at, self.collector_host())

    def feed(self, env: Envelope) -> list[Evaluation]:
        """Fold one event; the evaluations of the boundaries its time passed (before it)."""
        out: list[Evaluation] = []
        led = self.ledger
        if led.already_seen(env) if led is not None else self.dedup.seen(env):
            return out
        ts = env.ts
        interval = self.cfg.interval
        if self.next_due is None:
            self.next_due = (math.floor(ts / interval) + 1) * interval
        elif ts >= self.next_due:
            last = math.floor(ts / interval) * interval
            first = self.next_due
            out.append(self.evaluate(first))
            if last > first:
                out.append(self.evaluate(last))
            self.next_due = last + interval
        if led is None:
            collector.apply(self.state, env, self.pool_cfg)
        else:
            try:
                led.apply(env)
            except EventRejectedError:
                pass  # not folded by the ledger (dead-lettered by the runners): nor here
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        return out

    def run(self, events: Iterable[Envelope]) -> Iterator[Evaluation]:
        """Every boundary evaluation of `events`, in order."""
        for env in events:
            yield from self.feed(env)

    def flush(self) -> Evaluation | None:
        """The view at the log's end (`--once`): stamped with the last event time."""
        if self.last_ts is None:
            return None
        return self.evaluate(self.last_ts)


def _host(value: Any) -> str:
    text = str(value or "").strip()
    return text.split(":", 1)[0] if text else ""
