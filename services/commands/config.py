"""`poolledger config show [KNOB ...]`: knob values and where they were set.

Prints like `condor_config_val -v`, so an HTCondor admin reads it at a glance:
`KNOB = value` then ` # at: <source>` (file:line, env POOLLEDGER_X, command line or
<Default>), plus ` # raw: ...` when macros were expanded. Unknown names print
`Not defined: NAME` and exit 1, as condor_config_val does.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from schemas.settings import Settings

__all__ = ["register", "show", "format_knob"]


def register(subparsers: Any) -> None:
    """Add `config show` to the main CLI's subparsers."""
    parser = subparsers.add_parser("config", help="show configuration knobs and their sources",
                                   description="Inspect PoolLedger's configuration (condor_config syntax).")
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION")
    show_p = sub.add_parser("show", help="print knobs like condor_config_val -v",
                            description="Print KNOB = value and where it was set; all knobs when none given.")
    show_p.add_argument("knobs", nargs="*", metavar="KNOB", help="knob names (case-insensitive)")
    show_p.set_defaults(func=show)
    parser.set_defaults(func=lambda args, settings: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def format_knob(settings: Settings, name: str) -> str:
    """The two (or three) lines condor_config_val -v prints for one knob."""
    shown = settings.display_name(name)
    value = settings.text(name)
    raw = settings.raw(name)
    knob = settings.knob(name)
    if knob is not None and knob.secret and value:
        value = raw = "<hidden>"
    lines = [f"{shown} = {value}".rstrip(), f" # at: {settings.source(name)}"]
    if raw != value:
        lines.append(f" # raw: {shown} = {raw}".rstrip())
    return "\n".join(lines)


def show(args: argparse.Namespace, settings: Settings, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Print the named knobs (all when none); 1 if any is not defined."""
    out = out or sys.stdout
    err = err or sys.stderr
    names = list(getattr(args, "knobs", None) or []) or sorted(settings, key=str.upper)
    status = 0
    for name in names:
        if name not in settings:
            print(f"Not defined: {name}", file=err)
            status = 1
            continue
        print(format_knob(settings, name), file=out)
    return status
