"""Errors of the simulated pool: one root, each says which input or object was wrong."""
from __future__ import annotations


class PoolError(Exception):
    """Root of every error raised by `services.pool`."""


class ClockError(PoolError):
    """A timer was scheduled in the virtual past; simulated time never runs backwards."""


class PoolConfigError(PoolError):
    """A condor_config knob of a simulated daemon is invalid (names the knob)."""

    def __init__(self, reason: str, *, knob: str | None = None) -> None:
        self.reason = reason
        self.knob = knob
        super().__init__(f"{knob}: {reason}" if knob else reason)


class SlotConfigError(PoolConfigError):
    """The slot layout (NUM_SLOTS, SLOT_TYPE_<N>, ...) cannot be built, as a startd would refuse."""


class MatchError(PoolError):
    """A match names a schedd, machine or slot this pool does not have."""


class ScenarioError(PoolError):
    """A scenario file is invalid; names the file and the offending key path."""

    def __init__(self, reason: str, *, path: str, key: str | None = None) -> None:
        self.reason = reason
        self.path = path
        self.key = key
        super().__init__(f"{path}: {key}: {reason}" if key else f"{path}: {reason}")
