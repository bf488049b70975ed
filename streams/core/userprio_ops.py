"""condor_userprio edits: validation with HTCondor's wording and its success messages.

The CLI validates before an edit reaches the log (DESIGN invariant 5); the accountant validates
again when folding, so an invalid edit that reached the log anyway changes nothing. The checks
and texts follow condor_userprio (`src/condor_tools/user_prio.cpp`), a lease refused by the
negotiator in the words of its accountant (`Accountant.cpp`) under condor_userprio's
"negotiator rejected ..." line. Edits need a full submitter name (`user@uid.domain`); as a
PoolLedger extension every edit of a record's value (not `-delete`) also accepts a group from
GROUP_NAMES (a name without '@' that is not one gets condor_userprio's full-name message).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from schemas.events import ADMIN_OPS
from streams.core.errors import AdminCommandError
from streams.core.groups import ROOT

if TYPE_CHECKING:
    from streams.core.accountant import AccountantConfig, AccountantState

PROG: Final = "condor_userprio"
#: HTCondor's minimum real priority (the accountant's MinPriority); the accountant's floor too.
MIN_PRIORITY: Final = 0.5
#: Ops that may carry `duration` (a lease), by the record attribute they lease.
LEASE_OPS: Final[dict[str, str]] = {"setceil": "ceiling", "setfloor": "floor", "setfactor": "factor"}
#: Lease cancellations, by the leased attribute.
CANCEL_OPS: Final[dict[str, str]] = {"cancelceillease": "ceiling", "cancelfloorlease": "floor",
                                     "cancelfactorlease": "factor"}
#: A leased attribute in condor_userprio's and the accountant's messages.
LEASE_WORDS: Final[dict[str, str]] = {"ceiling": "ceiling", "floor": "floor",
                                      "factor": "priority-factor"}
#: condor_userprio's option of each cancellation, named when its target is not a submitter.
_CANCEL_FLAGS: Final[dict[str, str]] = {"cancelceillease": "-cancelceilinglease",
                                        "cancelfloorlease": "-cancelfloorlease",
                                        "cancelfactorlease": "-cancelfactorlease"}
#: Ops that accept a group name as target (PoolLedger extension): every edit of a record's
#: value, so a negotiator's group records (Accountantnew.log) can be carried whole.
GROUP_OPS: Final = frozenset(LEASE_OPS) | frozenset(CANCEL_OPS) | frozenset(
    {"setprio", "setaccum", "setbegin", "setlast", "resetusage"})
_NUMERIC_OPS: Final = frozenset({"setprio", "setfactor", "setaccum", "setbegin", "setlast",
                                 "setceil", "setfloor"})
# What condor_userprio names in its "full name" complaint, per op.
_WHAT: Final[dict[str, str]] = {
    "setprio": "priority", "setfactor": "priority", "resetusage": "priority",
    "setaccum": "Accumulated usage", "setbegin": "begin usage time", "setlast": "last usage time",
    "setceil": "ceiling", "setfloor": "floor",
}


def number(value: float | str | None) -> float | None:
    """The admin value as a finite float, or None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        v = float(value)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def is_group_target(op: str, target: str) -> bool:
    """Whether `target` names a group (no '@') for an op that accepts groups."""
    return op in GROUP_OPS and "@" not in target


def _fmt_time(t: float) -> str:
    return str(int(t)) if float(t).is_integer() else repr(t)


def _full_name_error(op: str, target: str) -> AdminCommandError:
    if op == "delete":
        return AdminCommandError(
            f"{PROG}: You must specify the full name of the record you wish\n"
            "\tto delete (user@uid.domain or user@full.host.name)")
    if op in CANCEL_OPS:
        return AdminCommandError(f"{PROG}: {_CANCEL_FLAGS[op]} requires a full submitter name "
                                 "(user@domain)")
    what = _WHAT[op]
    tail = f" (not {target})" if op in ("setceil", "setfloor") else ""
    return AdminCommandError(
        f"{PROG}: You must specify the full name of the submittor you wish\n"
        f"\tto update the {what} of (user@uid.domain or user@full.host.name){tail}")


def validate_admin(op: str, target: str, value: float | str | None, duration: float | None,
                   state: AccountantState, cfg: AccountantConfig) -> None:
    """Raise AdminCommandError if condor_userprio (or the negotiator) would refuse this edit.

    A lease is "in effect" while its record holds it: leases end only at a negotiation cycle
    at or after their expiry, or by cancellation, so no clock is needed here.
    """
    if op not in ADMIN_OPS:
        raise AdminCommandError(f"{PROG}: unknown operation {op!r}")
    if duration is not None:
        if op not in LEASE_OPS:
            raise AdminCommandError(f"{PROG}: -duration applies only to -setceiling, -setfloor "
                                    "and -setfactor")
        if not math.isfinite(duration) or duration <= 0:
            raise AdminCommandError(f"{PROG}: -duration requires a positive integer number of "
                                    "seconds")
    if op == "resetall":
        return
    if is_group_target(op, target):
        if target != ROOT and target not in cfg.groups:  # not our extension's: HTCondor's words
            raise _full_name_error(op, target)
    elif "@" not in target:
        raise _full_name_error(op, target)
    name = canonical_target(op, target, cfg)
    v = number(value)
    if op in _NUMERIC_OPS and v is None:
        raise AdminCommandError(f"{PROG}: -{op} needs a number, not {value!r}")
    if op == "setfactor" and v is not None and v < 1:
        raise AdminCommandError("Priority factors must be greater than or equal to 1.")
    if op in ("setfloor", "setceil") and v is not None:
        label, low = ("floor", 0) if op == "setfloor" else ("ceiling", -1)
        if int(v) < low:
            raise AdminCommandError(f"{label} must be greater than or equal to {low}.")
    if op == "setaccum" and v is not None and v < 0:
        raise AdminCommandError("Usage must be greater than 0 seconds")
    if op in ("setbegin", "setlast") and v is not None and int(v) < 0:
        raise AdminCommandError("Time must be greater than 0 seconds")
    rec = state.customers.get(name)
    if op in LEASE_OPS and duration is not None:
        kind = LEASE_OPS[op]
        lease = rec.leases.get(kind) if rec is not None else None
        if lease is not None:
            word = LEASE_WORDS[kind]
            raise AdminCommandError(f"negotiator rejected {word} lease: {word} lease for {name} "
                                    f"is already in effect (expires at {_fmt_time(lease.expires)})")
    if op in CANCEL_OPS:
        kind = CANCEL_OPS[op]
        if rec is None or kind not in rec.leases:
            raise AdminCommandError(f"negotiator rejected cancel: no {LEASE_WORDS[kind]} lease "
                                    f"in effect for {name}")


def check_issued(op: str, value: float | str | None) -> None:
    """The stricter check of an edit being issued (CLI, scenario): a `setprio` below
    HTCondor's minimum priority is refused, where condor_userprio only refuses <= 0 and the
    accountant then stores its floor ("set to -5" while 0.5 is stored would be a lie in the
    audit trail). The fold keeps clamping such an edit already on a log, so old logs replay
    unchanged."""
    v = number(value)
    if op == "setprio" and v is not None and v < MIN_PRIORITY:
        raise AdminCommandError(f"Priority must be greater than or equal to {MIN_PRIORITY:g} "
                                "(HTCondor's minimum priority).")


def canonical_target(op: str, target: str, cfg: AccountantConfig) -> str:
    """The record name an edit addresses: groups in their configured casing, submitters as given."""
    if is_group_target(op, target):
        return cfg.groups.canonical(target) or target
    return target


def describe_admin(op: str, target: str, value: float | str | None,
                   duration: float | None = None) -> str:
    """condor_userprio's confirmation line for a successful edit (a lease: its MANAGE_* reply)."""
    v = number(value) or 0.0
    if op in LEASE_OPS and duration is not None:
        shown = f"{v:f}" if op == "setfactor" else str(int(v))
        return (f"Set {LEASE_WORDS[LEASE_OPS[op]]} lease on {target} to {shown} "
                f"for {int(duration)} seconds")
    if op == "setprio":
        return f"The priority of {target} was set to {v:f}"
    if op == "setfactor":
        return f"The priority factor of {target} was set to {v:f}"
    if op in ("setfloor", "setceil"):
        return f"The {LEASE_OPS[op]} of {target} was set to {int(v)}"
    if op == "setaccum":
        return f"The Accumulated Usage of {target} was set to {v:f}"
    if op == "setbegin":
        return f"The Begin Usage Time of {target} was set to {int(v)}"
    if op == "setlast":
        return f"The Last Usage Time of {target} was set to {int(v)}"
    if op == "resetusage":
        return f"The accumulated usage of {target} was reset"
    if op == "resetall":
        return "The accumulated usage was reset for all users"
    if op == "delete":
        return f"The accountant record named {target} was deleted"
    if op in CANCEL_OPS:
        return f"Cancelled {LEASE_WORDS[CANCEL_OPS[op]]} lease for {target}"
    raise AdminCommandError(f"{PROG}: unknown operation {op!r}")
