"""`poolledger userprio`: condor_userprio over the ledger — views, --json, and validated edits.

Views are computed at the log's last event time (event time only), so the same log always
prints the same table. Edits are validated against the current state with HTCondor's rules
and wording (a refusal exits 2); only a valid edit by an ADMINISTRATOR (services.admin) is
appended, as an `admin.command` naming the caller's real identity and the optional --reason,
at the time services.admin.edit_time gives it.

condor_userprio's one home: this command, its tables (`views`, also printed by `run` and
`replay`) and, in the core, the edit rules (`streams.core.userprio_ops`), which stay there
because the accountant checks every folded edit with them again.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from typing import Any

from schemas.config import SettingsLike
from schemas.errors import EventValidationError
from schemas.events import AdminCommanded, Envelope, make_event, validated
from services.admin import PermissionDeniedError, authorize, edit_time
from services.commands import (add_log_source, events_topic, fold_log, home_dir,
                               open_configured_log)
from services.commands.userprio.views import format_userprio, quotas_note, userprio_json
from services.negotiator.shard import admin_source, unknown_negotiator
from streams.core.userprio_ops import AdminCommandError, check_issued, describe_admin
from streams.replay import ReplayError, parse_time

VIEW_FLAGS = ("most", "all", "quotas", "usage", "priority", "allusers", "long")
# condor_userprio option -> (op, number of arguments after the name)
EDITS = {"setfactor": ("setfactor", 1), "setprio": ("setprio", 1), "setaccum": ("setaccum", 1),
         "setbegin": ("setbegin", 1), "setlast": ("setlast", 1), "resetusage": ("resetusage", 0),
         "delete": ("delete", 0), "setceiling": ("setceil", 1), "setfloor": ("setfloor", 1),
         "cancelceilinglease": ("cancelceillease", 0), "cancelfloorlease": ("cancelfloorlease", 0),
         "cancelfactorlease": ("cancelfactorlease", 0)}


def register(sub: Any) -> None:
    p = sub.add_parser("userprio", help="user priorities, like condor_userprio",
                       description="Show or edit user priorities. Views use the log's last "
                                   "event time; edits are validated, then appended.")
    views = p.add_mutually_exclusive_group()
    for flag in VIEW_FLAGS:
        views.add_argument(f"-{flag}", dest="view", action="store_const", const=flag,
                           help=f"the condor_userprio -{flag} view")
    p.add_argument("-activefrom", metavar="TIME", help="show users active since TIME "
                   "(epoch or ISO 8601) instead of the last 24 hours")
    edits = p.add_mutually_exclusive_group()
    for flag, (_op, nargs) in EDITS.items():
        edits.add_argument(f"-{flag}", dest="edit", nargs=1 + nargs, action=_Edit, op_flag=flag,
                           metavar=("NAME", "VALUE")[:1 + nargs], help=f"condor_userprio -{flag}")
    edits.add_argument("-resetall", dest="edit", nargs=0, action=_Edit, op_flag="resetall",
                       help="reset the accumulated usage of every record")
    p.add_argument("-duration", metavar="SECONDS",
                   help="with -setceiling/-setfloor/-setfactor: a lease that expires")
    p.add_argument("-name", dest="negotiator", metavar="NEGOTIATOR",
                   help="the named negotiator whose accounting to show or edit (a pool with "
                        "several, NEGOTIATOR_NAMES): its shard of the log is replayed, and an "
                        "edit is addressed to it alone")
    p.add_argument("--reason", default="", help="why (recorded in the admin.command event)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_log_source(p)
    p.set_defaults(func=run, view="default", edit=None)


class _Edit(argparse.Action):
    """Stores (option, arguments) for one edit option."""

    def __init__(self, *args: Any, op_flag: str, **kwargs: Any) -> None:
        self.op_flag = op_flag
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, (self.op_flag, list(values or [])))


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    try:
        folded, shard = fold_log(args, settings, negotiator=args.negotiator)
    except (ReplayError, ValueError) as exc:
        print(f"poolledger userprio: {exc}", file=sys.stderr)
        return 1
    ledger = folded.ledger
    problem = unknown_negotiator(shard, args.negotiator)
    if problem is not None:
        print(f"poolledger userprio: -name: {problem}", file=sys.stderr)
        return 2
    if args.edit is not None:
        return _edit(args, settings, ledger, folded.last_ts)
    now = ledger.now if ledger.now is not None else 0.0
    rows = ledger.priorities(now, all_groups=True)
    groups = ledger.group_quotas()
    fresh = ledger.quotas_computed_now()
    if fresh:
        print(quotas_note("userprio", now), file=sys.stderr)
    if args.json:
        print(json.dumps(userprio_json(rows, now=now, groups=groups, limits=ledger.limits_view(),
                                       quotas_at=now if fresh else None,
                                       allocations=ledger.group_allocations()),
                         indent=2, sort_keys=True))
        return 0
    try:
        activefrom = parse_time(args.activefrom) if args.activefrom else None
    except ReplayError as exc:
        print(f"poolledger userprio: -activefrom: {exc}", file=sys.stderr)
        return 2
    last = ledger.last_priority_update or now
    print(format_userprio(rows, now=now, last_update=last, view=args.view, groups=groups,
                          activefrom=activefrom), end="")
    return 0


def _edit(args: argparse.Namespace, settings: SettingsLike, ledger: Any, log_time: float | None) -> int:
    flag, values = args.edit
    if args.log_file is not None:
        print("poolledger userprio: edits go to the configured log, not to --log files",
              file=sys.stderr)
        return 2
    op = "resetall" if flag == "resetall" else EDITS[flag][0]
    # -resetall names no record; the event's target may not be empty (SubmitterName): "*"
    target = values[0] if values else "*"
    value: float | str | None = None
    if len(values) > 1:
        try:
            value = float(values[1])
        except ValueError:
            print(f"poolledger userprio: -{flag} {target}: {values[1]!r} is not a number",
                  file=sys.stderr)
            return 2
    if args.duration is not None and op not in ("setceil", "setfloor", "setfactor"):
        print("poolledger userprio: -duration goes with -setceiling, -setfloor or -setfactor",
              file=sys.stderr)
        return 2
    duration = _duration(args.duration)
    if duration == 0:
        print("poolledger userprio: -duration requires a positive integer number of seconds",
              file=sys.stderr)
        return 2
    try:
        ledger.check_admin(op, target, value, duration)
        check_issued(op, value)
    except AdminCommandError as exc:  # HTCondor's words, under our command's name
        print(f"poolledger userprio: {str(exc).removeprefix('condor_userprio: ')}",
              file=sys.stderr)
        return 2
    # The CLI is an edge: a live log gets the time the command was issued, a log of the past
    # its own time (services.admin.edit_time).
    when = edit_time(log_time, time.time(), float(settings.get("POOLLEDGER_LIVE_WINDOW")))

    def edit(by: str, source: str) -> Envelope:
        return make_event(AdminCommanded(op, target, value, by, args.reason,  # type: ignore[arg-type]
                                         duration),
                          ts=when.ts, source=source, seq=0, id=f"{source}:{uuid.uuid4()}")

    try:  # the readers' contract, at the door: never an edit every reader dead-letters
        validated(edit("", "userprio"))
    except EventValidationError as exc:
        field = (exc.field or "data.value").removeprefix("data.")
        print(f"poolledger userprio: -{flag} {target}: {field} "
              f"{exc.reason.removeprefix(f'-{op}: ')}", file=sys.stderr)
        return 2
    home = home_dir(settings)
    try:
        who = authorize(settings, home, f"-{flag}")
    except PermissionDeniedError as exc:
        print(f"poolledger userprio: {exc}", file=sys.stderr)
        return 1
    from streams.log.events import EventLog, ensure_topics

    # -name NEG: the negotiator is named in the source (services.negotiator.shard)
    env = edit(str(who), admin_source(f"userprio@{who.host}",
                                      args.negotiator.partition("@")[0] if args.negotiator else None))
    log = open_configured_log(settings)
    try:
        ensure_topics(log)
        EventLog(log).append(events_topic(settings), [env])
    finally:
        log.close()
    if when.note:
        print(when.note)
    print(describe_admin(op, target, value, duration))
    return 0


def _duration(text: str | None) -> float | None:
    """-duration as condor_userprio reads it: a positive integer below INT_MAX, else 0 (refused);
    None without the option."""
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        return 0
    v = int(text)
    return float(v) if 0 < v < 2**31 - 1 else 0
