"""`poolledger log export|import|info`: move events between the log and `.jsonl` files."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from services.commands import broker_url, home_dir
from streams.log.events import EventLog, ensure_topics, open_log
from streams.log.port import LogError
from streams.log.topics import EVENTS


def register(sub: Any) -> None:
    p = sub.add_parser("log", help="export, import and inspect the event log")
    lsub = p.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    e = lsub.add_parser("export", help="write a topic as .jsonl, one envelope per line")
    e.add_argument("--topic", default=EVENTS, help=f"topic to export (default {EVENTS})")
    e.add_argument("path", type=Path)
    e.set_defaults(func=export)
    i = lsub.add_parser("import", help="append a .jsonl file's events; bad lines go to the DLQ")
    i.add_argument("--topic", default=EVENTS, help=f"topic to append to (default {EVENTS})")
    i.add_argument("path", type=Path)
    i.set_defaults(func=import_)
    h = lsub.add_parser("import-history",
                        help="append HTCondor history (history file, startd_history, "
                             "condor_history -l / -json) as job.history events")
    h.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    h.set_defaults(func=import_history, what="history", unit="job ads")
    st = lsub.add_parser("import-status",
                         help="append a condor_status -l dump as ad.updated events")
    st.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    st.set_defaults(func=import_history, what="status", unit="ads")
    ac = lsub.add_parser("import-accountant",
                         help="append a negotiator's Accountantnew.log as the condor_userprio "
                              "edits that set each submitter's and group's record")
    ac.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    ac.set_defaults(func=import_history, what="accountant", unit="record edits")
    n = lsub.add_parser("info", help="topics, partitions and end offsets")
    n.set_defaults(func=info)


def _open(settings: Any) -> EventLog:
    log = open_log(broker_url(settings), home_dir(settings))
    ensure_topics(log)
    return EventLog(log)


def export(args: argparse.Namespace, settings: Any) -> int:
    elog = _open(settings)
    try:
        n = elog.export_jsonl(args.topic, args.path)
    except LogError as exc:
        print(f"poolledger log export: {exc}", file=sys.stderr)
        return 1
    finally:
        elog.log.close()
    print(f"exported {n} events from {args.topic} to {args.path}")
    return 0


def import_(args: argparse.Namespace, settings: Any) -> int:
    if not args.path.is_file():
        print(f"poolledger log import: {args.path}: no such file", file=sys.stderr)
        return 1
    elog = _open(settings)
    try:
        imported, rejected = elog.import_jsonl(args.path, args.topic)
    except LogError as exc:
        print(f"poolledger log import: {exc}", file=sys.stderr)
        return 1
    finally:
        elog.log.close()
    print(f"imported {imported} events into {args.topic}; {rejected} rejected to {args.topic}.dlq")
    return 1 if rejected else 0


def info(args: argparse.Namespace, settings: Any) -> int:
    elog = _open(settings)
    try:
        for topic in sorted(elog.log.topics()):
            ends = elog.log.end_offsets(topic)
            print(f"{topic:32} partitions={len(ends):<3} events={sum(ends.values())}")
    finally:
        elog.log.close()
    return 0


def import_history(args: argparse.Namespace, settings: Any) -> int:
    """import-history / import-status / import-accountant: one file/DLQ path for all three."""
    from adstash import sources

    command = f"poolledger log import-{args.what}"
    run_import = {"history": sources.import_history, "status": sources.import_status,
                  "accountant": sources.import_accountant}[args.what]
    for path in args.paths:
        if not path.is_file():
            print(f"{command}: {path}: no such file", file=sys.stderr)
            return 1
    elog = _open(settings)
    try:
        report = run_import(elog, args.paths)
    except (LogError, OSError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    finally:
        elog.log.close()
    print(f"imported {report.imported} {args.unit} into {EVENTS} ({report.already} already "
          f"there); {report.rejected} malformed to {EVENTS}.dlq")
    return 1 if report.rejected else 0
