"""Errors of the schemas package: one root, each names the thing that was wrong."""
from __future__ import annotations


class SchemasError(Exception):
    """Root of every error raised by the schemas package."""


class EventValidationError(SchemasError):
    """An event failed to decode or validate; names the event id, its type and the field."""

    def __init__(self, reason: str, *, event_id: str | None = None, event_type: str | None = None,
                 field: str | None = None) -> None:
        self.reason = reason
        self.event_id = event_id
        self.event_type = event_type
        self.field = field
        where = ", ".join(f"{k} {v!r}" for k, v in
                          (("event", event_id), ("type", event_type), ("field", field)) if v)
        super().__init__(f"{where}: {reason}" if where else reason)


class ClassAdError(SchemasError):
    """A ClassAd or expression could not be parsed; names the file and line when known."""

    def __init__(self, reason: str, *, path: str | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        where = f"{path}:{line}" if path and line else (path or (f"line {line}" if line else ""))
        super().__init__(f"{where}: {reason}" if where else reason)


class ConfigError(SchemasError):
    """A configuration knob or file is invalid; names the knob and its source file:line."""

    def __init__(self, reason: str, *, knob: str | None = None, source: str | None = None) -> None:
        self.reason = reason
        self.knob = knob
        self.source = source
        parts = [p for p in (knob, f"({source})" if source else None) if p]
        super().__init__(f"{' '.join(parts)}: {reason}" if parts else reason)
