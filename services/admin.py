"""The admin edge: who issues a priority edit or a knob change, whether they may, and its time.

Authorization follows HTCondor's ADMINISTRATOR level (`ALLOW_ADMINISTRATOR`,
`DENY_ADMINISTRATOR`). The identity is `user@UID_DOMAIN/host` with `user` from the process's
real uid (the password database, never `$USER`, the environment or a flag) and `host` this
machine's fully qualified name, as HTCondor's FS authentication names a local user.

List entries take HTCondor's forms (its security manual, "authorization"): `user@domain/host`;
`user@domain` alone means any host; a bare `host` any user on that host; `*` is a wildcard in
any part (`*@example.org/*`, `admin@*/*.example.org`). Host names compare case-insensitively,
users case-sensitively. A DENY entry wins over an ALLOW one. With ALLOW_ADMINISTRATOR empty
(the default) root and the owner of the data directory may edit, on this host: whoever can
write the embedded log's files anyway, so the README's flows work for the user running them.
ALLOW/DENY_ADMINISTRATOR count only from condor_config files: a `--set` or a
`POOLLEDGER_ALLOW_ADMINISTRATOR` in the caller's environment must not grant itself the right.
On Kafka the broker enforces the same boundary with SASL principals and ACLs
(`compose/kafka.py`); this check refuses early with one clear line.

The edit's event time (DESIGN.md "Trust"): on a live log (its last event within
POOLLEDGER_LIVE_WINDOW of the wall clock) an edit carries the time it was issued; on a log of
the past (a finished simulation, an imported history) or one ahead of this clock it is placed
at the log's last event time, so it never moves the ledger's clock and is never "far future".
"""
from __future__ import annotations

import os
import pwd
import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from schemas.config import SettingsLike
from streams.replay import LastTime

__all__ = ["PermissionDeniedError", "Identity", "current_identity", "authorize", "EditTime",
           "edit_time", "LastTime"]

_PROTECTED = ("ALLOW_ADMINISTRATOR", "DENY_ADMINISTRATOR")


class PermissionDeniedError(Exception):
    """The caller may not append this admin event; the message is the one line to print."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated local caller, HTCondor style."""

    user: str
    domain: str
    host: str

    def __str__(self) -> str:
        return f"{self.user}@{self.domain}/{self.host}"


def current_identity(settings: SettingsLike) -> Identity:
    """This process's identity: its real uid's login name, UID_DOMAIN, this host."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (containers): name it by number
        user = f"uid{uid}"
    host = socket.getfqdn() or socket.gethostname()
    return Identity(user, str(settings.get("UID_DOMAIN") or host), host)


def _glob(pattern: str, text: str, fold: bool) -> bool:
    """HTCondor's wildcard: `*` matches any run of characters; nothing else is special."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, text, re.IGNORECASE if fold else 0) is not None


def matches_entry(entry: str, who: Identity) -> bool:
    """Whether one ALLOW/DENY list entry names `who` (forms in the module docstring)."""
    if "/" in entry:
        principal, host = entry.split("/", 1)
    elif "@" in entry:
        principal, host = entry, "*"
    else:
        principal, host = "*", entry
    if principal != "*" and "@" not in principal:
        principal += "@*"
    user, _, domain = principal.partition("@") if principal != "*" else ("*", "", "*")
    return (_glob(user, who.user, fold=False) and _glob(domain, who.domain, fold=True)
            and _glob(host, who.host, fold=True))


def _owner(path: Path) -> str | None:
    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (OSError, KeyError):
        return None


def authorize(settings: Any, home: Path, what: str) -> Identity:
    """The caller's identity if it holds ADMINISTRATOR; else PermissionDeniedError naming who,
    what was refused and the knob to change."""
    who = current_identity(settings)
    for knob in _PROTECTED:
        source = settings.source(knob)
        if source.startswith("env ") or source.startswith("command line"):
            raise PermissionDeniedError(
                f"permission denied: {knob} set by {source}; it counts only in a "
                "condor_config file")
    denied = settings.get("DENY_ADMINISTRATOR") or ()
    if any(matches_entry(e, who) for e in denied):
        raise PermissionDeniedError(f"permission denied: {who} may not {what} "
                                    f"(DENY_ADMINISTRATOR, {settings.source('DENY_ADMINISTRATOR')})")
    allowed = settings.get("ALLOW_ADMINISTRATOR") or ()
    if allowed:
        if any(matches_entry(e, who) for e in allowed):
            return who
        raise PermissionDeniedError(f"permission denied: {who} may not {what} (not in "
                                    f"ALLOW_ADMINISTRATOR, {settings.source('ALLOW_ADMINISTRATOR')})")
    owner = _owner(home)
    if who.user in ("root", owner):
        return who
    raise PermissionDeniedError(
        f"permission denied: {who} may not {what} (ALLOW_ADMINISTRATOR is unset: only root "
        f"and {owner or 'the owner'} of {home} may; set ALLOW_ADMINISTRATOR in condor_config)")


@dataclass(frozen=True, slots=True)
class EditTime:
    """When an admin event is placed, and the line the CLI prints when it is not 'now'."""

    ts: float
    note: str | None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def edit_time(log_time: float | None, wall: float, window: float) -> EditTime:
    """The event time of an admin edit issued at `wall` on a log whose latest event time is
    `log_time` (None: an empty log, which is live by definition)."""
    if log_time is None or abs(wall - log_time) <= window:
        return EditTime(wall if log_time is None else max(wall, log_time), None)
    where = "of the past" if log_time < wall else "ahead of this machine's clock"
    return EditTime(log_time, f"note: the log is {where} (last event {_iso(log_time)}, more "
                              f"than POOLLEDGER_LIVE_WINDOW={window:g}s from now): the edit is "
                              f"placed at the log's time {_iso(log_time)}")
