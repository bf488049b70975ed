"""`poolledger follow events|history|accountant PATH`: a real pool's files, live, into the log.

Shadow mode (DESIGN.md "A real pool"): an access point's job event log (EVENT_LOG) becomes
`job.*` events, its history file (and an execute point's startd_history) `job.history`
events, the real negotiator's Accountantnew.log its Accounting ads. Each follower polls its
file every POOLLEDGER_FOLLOW_INTERVAL seconds (or once, `--once`), resumes exactly where it
stopped after a crash (its position is stored with the events it appended), survives rotation
and truncation, and dead-letters what it cannot read with the file and byte offset named
(services/follow). `log import-history --follow` is `follow history` for several files.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from schemas.config import SettingsLike
from services.commands import broker_url, home_dir, open_configured_log
from services.follow.base import Follower, FollowError, FollowReport
from streams.log.events import EventLog, ensure_topics

__all__ = ["register", "run_followers"]


def register(sub: Any) -> None:
    p = sub.add_parser("follow", help="follow a real pool's job event log, history file or "
                       "Accountantnew.log into the log (shadow mode)")
    fsub = p.add_subparsers(dest="follow_command", metavar="FILE_KIND", required=True)
    e = fsub.add_parser("events", help="a schedd's EVENT_LOG (or a user log) -> job.* events")
    e.add_argument("--schedd", metavar="NAME",
                   help="the schedd's Name, as its GlobalJobIds start (default FULL_HOSTNAME)")
    e.add_argument("--submitter", metavar="USER@DOMAIN",
                   help="submitter of jobs the log does not name (one user's log without "
                        "job ad information events)")
    e.set_defaults(func=follow, kind="events")
    h = fsub.add_parser("history", help="a schedd's history file or a startd_history -> "
                        "job.history events")
    h.set_defaults(func=follow, kind="history")
    a = fsub.add_parser("accountant", help="the real negotiator's Accountantnew.log -> its "
                        "Accounting ads (ad.updated, observations for `reconcile`)")
    a.add_argument("--negotiator", metavar="NAME",
                   help="NegotiatorName of the ads (default POOLLEDGER_FOLLOW_NEGOTIATOR)")
    a.set_defaults(func=follow, kind="accountant")
    for q in (e, h, a):
        q.add_argument("path", type=Path, metavar="PATH")
        add_follow_options(q)


def add_follow_options(p: argparse.ArgumentParser) -> None:
    """--name, --once and --interval, shared with `log import-history --follow`."""
    p.add_argument("--name", metavar="NAME", help="the follower's name: its position and its "
                   "events' source (default: the file's absolute path)")
    p.add_argument("--once", action="store_true",
                   help="read what the file holds now, then exit (non-zero if anything was "
                        "dead-lettered)")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help="seconds between polls (default POOLLEDGER_FOLLOW_INTERVAL)")


def make_follower(kind: str, elog: EventLog, path: Path, args: argparse.Namespace,
                  settings: SettingsLike) -> Follower:
    """The follower of one file of `kind` (events, history, accountant)."""
    home = home_dir(settings) if broker_url(settings) else None
    common: dict[str, Any] = {"name": getattr(args, "name", None), "home": home}
    if kind == "events":
        from services.follow.eventlog import JobEventLogFollower

        return JobEventLogFollower(
            elog, path, schedd=args.schedd or str(settings.get("FULL_HOSTNAME")),
            uid_domain=str(settings.get("UID_DOMAIN")), submitter=args.submitter, **common)
    if kind == "history":
        from services.follow.history import HistoryFollower

        return HistoryFollower(elog, path, **common)
    from services.follow.accountant import AccountantFollower
    from streams.core.groups import GroupTree

    tree = GroupTree.from_names(settings.get("GROUP_NAMES"))
    return AccountantFollower(
        elog, path, negotiator=args.negotiator or str(settings.get("POOLLEDGER_FOLLOW_NEGOTIATOR")),
        default_factor=float(settings.get("DEFAULT_PRIO_FACTOR")), group_of=tree.group_of,
        **common)


def _say(follower: Follower) -> Callable[[FollowReport], None]:
    def say(report: FollowReport) -> None:
        for note in report.notes:
            print(f"note: {note}", flush=True)
        if report.events or report.dead:
            print(f"{follower.path}: {report.events} events appended, {report.dead} "
                  f"dead-lettered (at byte {follower.pos.offset})", flush=True)
    return say


def run_followers(followers: list[Follower], *, once: bool, interval: float) -> FollowReport:
    """Poll every follower (once, or until SIGINT/SIGTERM) and return the totals."""
    total = FollowReport()
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    while True:
        for f in followers:
            report = f.poll(stop.is_set)
            if once:
                report.add(f.flush())
            _say(f)(report)
            total.add(report)
        if once or stop.wait(interval):
            return total


def follow(args: argparse.Namespace, settings: SettingsLike) -> int:
    return follow_paths(args.kind, [args.path], args, settings)


def follow_paths(kind: str, paths: list[Path], args: argparse.Namespace, settings: SettingsLike) -> int:
    """Follow `paths` (files of one kind); the shared body of `follow` and `log import-history
    --follow`."""
    cmd = f"poolledger {args.command}"
    if len(paths) > 1 and getattr(args, "name", None):
        print(f"{cmd}: --name names one follower; give one file with it", file=sys.stderr)
        return 2
    for path in paths:
        if args.once and not path.is_file():
            print(f"{cmd}: {path}: no such file", file=sys.stderr)
            return 1
        if not path.parent.is_dir():
            print(f"{cmd}: {path}: no such directory {path.parent}", file=sys.stderr)
            return 1
    interval = args.interval if args.interval is not None else float(
        settings.get("POOLLEDGER_FOLLOW_INTERVAL"))
    if interval <= 0:
        print(f"{cmd}: --interval {interval:g}: must be positive", file=sys.stderr)
        return 2
    log = open_configured_log(settings)
    try:
        ensure_topics(log)
        elog = EventLog(log)
        followers = [make_follower(kind, elog, p, args, settings) for p in paths]
        if broker_url(settings):
            print(f"{cmd}: on Kafka the position is stored after each append (no transaction "
                  "spans both): after a crash the same events are appended again with the same "
                  "ids, which the ledger drops", file=sys.stderr)
        for f in followers:
            if not f.path.exists():
                print(f"{cmd}: {f.path}: waiting for the file to appear", file=sys.stderr)
        total = run_followers(followers, once=args.once, interval=interval)
    except FollowError as exc:
        print(f"{cmd}: {exc}", file=sys.stderr)
        return 1
    finally:
        log.close()
    print(f"followed {len(paths)} file(s): {total.events} events appended, {total.dead} "
          f"dead-lettered, {total.rotations} rotation(s), {total.truncations} truncation(s)")
    return 1 if args.once and total.dead else 0
