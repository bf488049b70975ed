"""CLI subcommands; each module exposes `register(subparsers)`. Shared edge helpers live here."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def home_dir(settings: Any) -> Path:
    """The data directory (POOLLEDGER_HOME), created on first use."""
    path = Path(str(settings.get("POOLLEDGER_HOME") or "~/.poolledger")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def broker_url(settings: Any) -> str | None:
    """The configured Kafka URL, or None for the embedded log."""
    value = settings.get("POOLLEDGER_BROKER")
    return str(value) if value else None
