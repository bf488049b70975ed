"""Errors raised by the negotiator; all derive from `NegotiatorError`."""
from __future__ import annotations


class NegotiatorError(Exception):
    """Root of every negotiator error."""


class InvalidInputError(NegotiatorError, ValueError):
    """The cycle snapshot or configuration cannot be negotiated (malformed ad, bad knob)."""
