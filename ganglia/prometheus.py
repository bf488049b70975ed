"""Prometheus publishers: a live exposition endpoint (prometheus_client) holding the latest
evaluation, and OpenMetrics files of a replay for `promtool tsdb create-blocks-from
openmetrics`, so the pool's past becomes Prometheus history.

Names: `htcondor_` + the metric's PrometheusName (else its Name) with every character outside
[A-Za-z0-9_] replaced by '_' ("Jobs in Pool" -> htcondor_Jobs_in_Pool). Labels: machine,
daemon, schedd, submitter, group and match where the metric has them; label names are the
union over a family, missing ones empty. Strings are not numbers and are not exported.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric as PromMetric
from prometheus_client.registry import Collector

from ganglia.errors import PublisherUnavailableError
from streams.log.files import atomic_file
from ganglia.metrics import Metric

__all__ = ["series_name", "PrometheusExporter", "OpenMetricsWriter"]

PREFIX = "htcondor_"


def series_name(metric: Metric) -> str:
    """The Prometheus family name of a metric."""
    body = re.sub(r"[^A-Za-z0-9_]+", "_", metric.series).strip("_")
    return PREFIX + (body or "unnamed")


def _families(metrics: Sequence[Metric]) -> dict[str, tuple[Metric, list[str], dict[tuple[str, ...], float]]]:
    """Family -> (first metric, label names, label values -> value); last one wins on a clash."""
    grouped: dict[str, list[Metric]] = {}
    for m in metrics:
        if m.type == "string":
            continue
        grouped.setdefault(series_name(m), []).append(m)
    out = {}
    for name, members in grouped.items():
        keys = sorted({k for m in members for k, _ in m.labels})
        samples: dict[tuple[str, ...], float] = {}
        for m in members:
            labels = dict(m.labels)
            samples[tuple(labels.get(k, "") for k in keys)] = float(m.value)
        out[name] = (members[0], keys, samples)
    return out


class _Snapshot(Collector):
    """The latest evaluation as gauges (a custom collector: series come and go per interval)."""

    def __init__(self) -> None:
        self.metrics: Sequence[Metric] = ()
        self.lock = threading.Lock()

    def collect(self) -> Iterator[PromMetric]:
        with self.lock:
            metrics = self.metrics
        for name, (first, keys, samples) in sorted(_families(metrics).items()):
            family = GaugeMetricFamily(name, first.desc or first.title or first.name, labels=keys)
            for values, value in samples.items():
                family.add_metric(list(values), value)
            yield family


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


class OpenMetricsWriter:
    """Collects every evaluation with its event time; `close` writes one OpenMetrics file
    (families contiguous, samples in time order, `# EOF`) that promtool turns into blocks."""

    name = "openmetrics"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._families: dict[str, tuple[Metric, dict[tuple[tuple[str, str], ...], dict[float, float]]]] = {}

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        n = 0
        for m in metrics:
            if m.type == "string":
                continue
            name = series_name(m)
            found = self._families.get(name)
            if found is None:
                found = self._families[name] = (m, {})
            found[1].setdefault(m.labels, {})[round(at, 3)] = float(m.value)
            n += 1
        return n

    def close(self) -> None:
        lines: list[str] = []
        for name in sorted(self._families):
            first, series = self._families[name]
            keys = sorted({k for labels in series for k, _ in labels})
            help_text = (first.desc or first.title or first.name).replace("\\", "\\\\").replace("\n", " ")
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for labels, points in sorted(series.items()):
                values = dict(labels)
                text = ",".join(f'{k}="{_escape(values.get(k, ""))}"' for k in keys)
                head = f"{name}{{{text}}}" if text else name
                for at in sorted(points):
                    lines.append(f"{head} {_number(points[at])} {at:.3f}")
        lines.append("# EOF")
        with atomic_file(self.path) as f:
            f.write(("\n".join(lines) + "\n").encode())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    return repr(float(value))
