"""Graphite publisher: carbon's plaintext protocol (`path value timestamp`) with the event time
of each evaluation, so replaying a log backfills the history a live run would have written.

Paths: `<prefix>.<machine>.<metric>`, the machine's dots and every character outside
[A-Za-z0-9_-] turned into '_' so each stays one path node (carbon splits on '.'). Strings
are not numbers and are not sent.
"""
from __future__ import annotations

import re
import socket
from collections.abc import Sequence

from ganglia.errors import PublisherUnavailableError
from ganglia.metrics import Metric

__all__ = ["GraphitePublisher", "graphite_path"]


def _node(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_") or "_"


def graphite_path(metric: Metric, prefix: str) -> str:
    """The carbon path of a metric."""
    parts = [p for p in prefix.split(".") if p]
    return ".".join([*parts, _node(metric.machine), _node(metric.name)])


class GraphitePublisher:
    """A plaintext connection to carbon-cache, opened on first use and again after a failure."""

    name = "graphite"

    def __init__(self, host: str, port: int, prefix: str = "htcondor", timeout: float = 10.0) -> None:
        self.host, self.port, self.prefix, self.timeout = host, port, prefix, timeout
        self._sock: socket.socket | None = None

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        stamp = int(at)
        lines = [f"{graphite_path(m, self.prefix)} {float(m.value)!r} {stamp}\n"
                 for m in metrics if m.type != "string"]
        if not lines:
            return 0
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self._sock.sendall("".join(lines).encode())
        except OSError as exc:
            self.close()
            raise PublisherUnavailableError(f"carbon at {self.host}:{self.port}: {exc}") from None
        return len(lines)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
