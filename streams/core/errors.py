"""Errors of the pure core: one root so callers can catch every core failure at once."""
from __future__ import annotations


class CoreError(Exception):
    """Root of every error raised by `streams.core`."""
