"""Errors of the ganglia package: one root; each names the file:line, metric, knob or publisher."""
from __future__ import annotations


class GangliaError(Exception):
    """Root of every error raised by the ganglia package."""


class MetricConfigError(GangliaError):
    """A metric definition is malformed; the message names `file:line` and the metric."""


class PublisherUnavailableError(GangliaError):
    """A publisher's service (gmond, carbon-cache, the exporter's port) cannot be reached."""
