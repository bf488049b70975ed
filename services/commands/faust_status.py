"""`poolledger faust-status`: how far the faust workers of an app have folded.

Why a status file: the worker's state lives in Kafka changelogs a client can only read by
replaying them; each worker instead writes, every `streams.faust_app.STATUS_EVERY` seconds
and off the fold's path, a small JSON file under `<home>/faust-status/` (events folded, the
offset it folds next, the events partition's end, the lag, its role). This command lists the
app's live workers from those files: the active one's progress and the standbys.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from services.commands import home_dir

if TYPE_CHECKING:
    from schemas.config import SettingsLike

#: a status file older than this many reporting intervals belongs to a stalled worker
STALE_AFTER = 3


def register(sub: Any) -> None:
    p = sub.add_parser("faust-status", help="progress of the faust workers (events folded, lag)",
                       description="The faust workers of POOLLEDGER_FAUST_APP writing status "
                                   "files under the data directory: role, events folded, "
                                   "next offset, the events topic's end and the lag.")
    p.add_argument("--json", action="store_true", help="the status files as a JSON list")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    from compose.kafka import pid_alive
    from streams.faust_app import STATUS_EVERY, status_dir

    app = str(settings.get("POOLLEDGER_FAUST_APP") or "poolledger")
    folder = status_dir(str(home_dir(settings, create=False)))
    docs = []
    for path in sorted(folder.glob(f"{app}-*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("app") == app and pid_alive(int(doc.get("pid", 0))):
            docs.append(doc)
    if not docs:
        print(f"poolledger faust-status: no faust worker of app {app} is writing status to "
              f"{folder} (start one: POOLLEDGER_HOME={home_dir(settings, create=False)} "
              "python -m streams.faust_app worker)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(docs, indent=2, sort_keys=True))
        return 0
    now = time.time()
    for doc in sorted(docs, key=lambda d: (d.get("role") != "active", d.get("pid", 0))):
        age = now - float(doc.get("updated", 0))
        stale = " (STALLED: no report for %.0f s)" % age if age > STALE_AFTER * STATUS_EVERY else ""
        head = f"{doc['app']} pid {doc['pid']}: {doc.get('role')} on topic {doc.get('topic')}"
        if doc.get("role") == "active":
            when = doc.get("event_time")
            at = (datetime.fromtimestamp(float(when), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                  if isinstance(when, (int, float)) else "?")
            head += (f"; {doc.get('applied')} events folded (event time {at}), next offset "
                     f"{doc.get('next_offset')}, end {doc.get('end_offset')}, lag {doc.get('lag')}")
        print(head + f"; reported {age:.0f} s ago" + stale)
    return 0
