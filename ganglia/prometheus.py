"""Prometheus publishers: a live exposition endpoint (prometheus_client) holding the latest
evaluation, and OpenMetrics files of a replay for `promtool tsdb create-blocks-from
openmetrics`, so the pool's past becomes Prometheus history.

Each metric belongs to its Prometheus family (ganglia/families.py: snake_case, base units,
`_total` counters typed as counters, one HELP per family); the families are prometheus_client's
GaugeMetricFamily and CounterMetricFamily, written by its own exposition code. Label names are
the union over a family (each ad type has a fixed set, so this is the set), missing ones empty.
Strings are not numbers and are not exported.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric as PromMetric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_text
from prometheus_client.registry import Collector

from ganglia.errors import PublisherUnavailableError
from ganglia.families import Family
from ganglia.metrics import Metric
from streams.log.files import atomic_file

__all__ = ["PrometheusExporter", "OpenMetricsWriter", "families"]

#: one series: its label values (by name) -> {timestamp or None: value}
_Series = dict[tuple[tuple[str, str], ...], dict[float | None, float]]


def _add(grouped: dict[str, tuple[Family, _Series]], metrics: Iterable[Metric], at: float | None) -> int:
    """File the numeric metrics under their families (the last value of a series at a time
    wins); how many."""
    n = 0
    for m in metrics:
        if m.type == "string":
            continue
        found = grouped.get(m.family.name)
        if found is None:
            found = grouped[m.family.name] = (m.family, {})
        found[1].setdefault(m.labels, {})[at] = float(m.value) * m.family.factor
        n += 1
    return n


def families(grouped: dict[str, tuple[Family, _Series]]) -> list[PromMetric]:
    """prometheus_client families (sorted by name, each series' samples in time order; a
    None time is "now")."""
    out: list[PromMetric] = []
    for name, (family, series) in sorted(grouped.items()):
        keys = sorted({k for labels in series for k, _ in labels})
        cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        prom = cls(name, family.help, labels=keys, unit=family.unit)
        for labels, values in sorted(series.items()):
            given = dict(labels)
            row = [given.get(k, "") for k in keys]
            for at in sorted(values, key=lambda t: -1.0 if t is None else t):
                prom.add_metric(row, values[at], timestamp=at)
        out.append(prom)
    return out


class _Snapshot(Collector):
    """The latest evaluation (a custom collector: series come and go per interval)."""

    def __init__(self) -> None:
        self.metrics: Sequence[Metric] = ()
        self.lock = threading.Lock()

    def collect(self) -> Iterator[PromMetric]:
        with self.lock:
            metrics = self.metrics
        grouped: dict[str, tuple[Family, _Series]] = {}
        _add(grouped, metrics, None)
        yield from families(grouped)


class PrometheusExporter:
    """An HTTP exposition endpoint on `address:port` serving the last published evaluation."""

    name = "prometheus"

    def __init__(self, address: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.snapshot = _Snapshot()
        self.registry.register(self.snapshot)
        try:
            self.server, self.thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise PublisherUnavailableError(f"Prometheus exporter on {address}:{port}: {exc.strerror}") from None
        self.port = self.server.server_port
        self.address = address

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        with self.snapshot.lock:
            self.snapshot.metrics = list(metrics)
        return sum(1 for m in metrics if m.type != "string")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Fixed(Collector):
    """Families made beforehand, for prometheus_client's OpenMetrics writer."""

    def __init__(self, made: list[PromMetric]) -> None:
        self.made = made

    def collect(self) -> Iterator[PromMetric]:
        yield from self.made


class OpenMetricsWriter:
    """Collects every evaluation with its event time; `close` writes one OpenMetrics file
    (families contiguous, samples in time order, `# EOF`) that promtool turns into blocks."""

    name = "openmetrics"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._grouped: dict[str, tuple[Family, _Series]] = {}

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        return _add(self._grouped, metrics, round(at, 3))

    def close(self) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(families(self._grouped)))
        with atomic_file(self.path) as f:
            f.write(openmetrics_text(registry))
