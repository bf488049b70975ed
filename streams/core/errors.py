"""Errors of the pure core: one root so callers can catch every core failure at once.

All of them live here, in a module setup.py leaves interpreted: they subclass builtins
(KeyError, ValueError), which mypyc's compiled classes cannot.
"""
from __future__ import annotations


class CoreError(Exception):
    """Root of every error raised by `streams.core`."""


class AdminCommandError(CoreError):
    """A condor_userprio edit that HTCondor would refuse; the message is what the CLI prints."""


class AccountantConfigError(CoreError, ValueError):
    """A knob value the accountant cannot use (wrong type or out of range)."""


class ConcurrencyLimitError(CoreError):
    """A concurrency-limit token is malformed; names the token and why."""

    def __init__(self, token: str, reason: str) -> None:
        self.token = token
        self.reason = reason
        super().__init__(f"invalid concurrency limit {token!r}: {reason}")


class UnknownGroupError(CoreError, KeyError):
    """A group name that GROUP_NAMES does not define."""


class StaleBuildError(CoreError, ImportError):
    """A compiled core module is older than its source (rebuild with `make build`)."""


class EventRejectedError(CoreError):
    """The ledger will not fold this event (too far ahead of its clock, an invalid knob value
    or admin edit, a fold that failed on it); runners dead-letter it with `reason` and go on."""

    def __init__(self, event_id: str, reason: str) -> None:
        self.event_id = event_id
        self.reason = reason
        super().__init__(f"event {event_id} rejected: {reason}")
