"""`poolledger replay`: the state at any point of the log, and what-if replays with changed knobs."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from schemas.config import SettingsLike
from services.commands import add_log_source, fold_log
from services.commands.audit import _iso
from services.commands.userprio.views import format_userprio, quotas_note, userprio_json
from services.negotiator.shard import unknown_negotiator
from streams.core.ledger import JUMPS_KEPT
from streams.replay import ReplayError, parse_until


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="rebuild the state at a time or position; what-if knobs",
                       description="Fold the log from the start up to --until. Knob overrides "
                                   "(the global --set KNOB=VALUE) make it a what-if replay.")
    p.add_argument("--until", metavar="TIME|POSITION",
                   help="stop after event time TIME (epoch seconds or ISO 8601, UTC by default) "
                        "or before position #N (the first N events of the log)")
    p.add_argument("--json", action="store_true",
                   help="print the priorities, quotas and limits as JSON (HTCondor names)")
    p.add_argument("--state", action="store_true",
                   help="print the whole canonical ledger state as JSON")
    p.add_argument("--negotiator", metavar="NEG",
                   help="only that named negotiator's accounting (its shard of the log)")
    add_log_source(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    try:
        until = parse_until(args.until) if args.until else None
        conflicts: list[str] = []
        folded, shard = fold_log(args, settings, until, args.negotiator,
                                 needs=None if args.state else (), on_conflict=conflicts.append)
        ledger = folded.ledger
    except (ReplayError, ValueError) as exc:
        print(f"poolledger replay: {exc}", file=sys.stderr)
        return 2 if args.until else 1
    problem = unknown_negotiator(shard, args.negotiator)
    if problem is not None and until is None:  # an early --until may stop before its definition
        print(f"poolledger replay: --negotiator: {problem}", file=sys.stderr)
        return 2
    now = ledger.now if ledger.now is not None else 0.0
    if args.state:
        print(ledger.to_json())
        return 0
    rows = ledger.priorities(now, all_groups=True)
    fresh = ledger.quotas_computed_now()
    if fresh:
        print(quotas_note("replay", now), file=sys.stderr)
    if args.json:
        print(json.dumps(userprio_json(rows, now=now, groups=ledger.group_quotas(),
                                       limits=ledger.limits_view(),
                                       quotas_at=now if fresh else None,
                                       allocations=ledger.group_allocations()),
                         indent=2, sort_keys=True))
        return 0
    whatif = ", ".join(f"{k}={v}" for k, v in sorted(_overrides(args).items()))
    print(f"Replayed {ledger.applied} events" + (f" (what-if: {whatif})" if whatif else ""))
    if ledger.rejected:
        named = ("the runner dead-lettered them with their reasons; the tail's are named above"
                 if folded.from_snapshot else "each named above with its reason")
        print(f"Rejected {ledger.rejected} events ({named})")
    jumps = ledger.clock_jumps()
    if jumps:
        print(f"Clock moved by more than a negotiation cycle (NEGOTIATOR_INTERVAL = "
              f"{ledger.cycle:g}s) "
              f"at {len(jumps)} events{'' if len(jumps) < JUMPS_KEPT else ' (the latest)'}:")
        for event_id, before, after in jumps:
            print(f"  {event_id}: {_iso(before)} -> {_iso(after)} (+{after - before:.0f}s)")
    if conflicts:
        print(f"Conflicting duplicates: {len(conflicts)} events reuse an id with other content"
              + (" (of the events folded after the snapshot)" if folded.from_snapshot else ""))
        for line in conflicts:
            print(f"  {line}")
    lost = ledger.lost_updates()
    if lost:
        print("Lost updates (seq gaps): " + ", ".join(f"{s} {n}" for s, n in sorted(lost.items())))
    print(format_userprio(rows, now=now, last_update=ledger.last_priority_update or now,
                          view="allusers", groups=ledger.group_quotas()), end="")
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    from services.cli import parse_overrides

    return parse_overrides(args.overrides)
