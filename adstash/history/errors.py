"""Errors of the history package: one root; each message names the file, query or option."""
from __future__ import annotations


class HistoryError(Exception):
    """Root of every error raised by the history database package."""


class HistoryVersionError(HistoryError):
    """The database was written by another schema version (rebuild it from the log)."""


class HistoryQueryError(HistoryError):
    """A constraint or SQL statement from the user could not be parsed or run."""
