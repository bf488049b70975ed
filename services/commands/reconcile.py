"""`poolledger reconcile`: PoolLedger's accounting beside a real negotiator's, per submitter
and group, with the difference and since when it exceeds the tolerance.

The real negotiator's view arrives as Accounting ads on the log (forwarded to `poolledger
collector`, or converted from a followed Accountantnew.log); the ledger's reconciliation fold
(`streams/core/reconcile.py`) keeps, per negotiator and name, its last report, PoolLedger's
values for the same record at the time the report describes, and the drift dated in event
time. This command only reads those rows (the ledger's read API), from the newest snapshot
plus the log's tail, as `userprio` does.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from typing import Any

from schemas.classads import compile_expr, evaluate
from schemas.config import SettingsLike
from schemas.errors import ClassAdError
from services.commands import add_log_source, fold_log, log_name
from services.negotiator.shard import names, unknown_negotiator
from streams.core.reconcile import (COMPARED, QUOTA_COMPARED, TOLERANCE_KNOB, ReconcileRow,
                                    drift_ad, relative)
from streams.replay import ReplayError

EPILOG = """\
Each row compares the last Accounting ad a negotiator published for a submitter or group
(Priority, EffectivePriority, PriorityFactor, ResourcesUsed, WeightedResourcesUsed,
AccumulatedUsage, WeightedAccumulatedUsage, and for groups EffectiveQuota, ConfigQuota,
SubtreeQuota, Requested, SurplusPolicy) with PoolLedger's record at the time the ad describes
(its LastUpdate). An attribute drifts when |ours - theirs| > TOLERANCE x max(|ours|, |theirs|);
"since" is the event time of the first report of the current drift. Run PoolLedger with
POOLLEDGER_ACCOUNTING_MODE=htcondor to compare with a real condor_negotiator.

Exit status: 0 when every row shown is within the tolerance, 1 when some row shown drifts
(or the log holds no Accounting ad of the negotiator asked for), 2 for a usage or
configuration error: `poolledger reconcile --drifting || alert` in a cron job."""


def register(sub: Any) -> None:
    p = sub.add_parser("reconcile", help="PoolLedger's accounting beside the real negotiator's",
                       description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--negotiator", metavar="NAME",
                   help="only the Accounting ads of this negotiator (its NegotiatorName, or the "
                        "part before '@')")
    p.add_argument("-name", dest="shard", metavar="NEGOTIATOR",
                   help="compare with this named negotiator's own accounting (NEGOTIATOR_NAMES: "
                        "its shard of the log is replayed); implies --negotiator NEGOTIATOR")
    p.add_argument("--tolerance", metavar="REL", type=str,
                   help=f"relative tolerance (default: the {TOLERANCE_KNOB} knob, 0.01); "
                        "another value folds the whole log again under it")
    p.add_argument("-constraint", metavar="EXPR",
                   help="only rows whose Reconciliation ad satisfies EXPR (e.g. 'Drifting', "
                        "'EffectivePriorityRelativeDrift > 0.05', 'DriftSeconds > 3600'; "
                        "attributes PoolLedger<A>, Negotiator<A>, <A>Drift, <A>RelativeDrift)")
    p.add_argument("--drifting", action="store_true", help="only rows beyond the tolerance")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_log_source(p)
    p.set_defaults(func=run)


def _tolerance(args: argparse.Namespace, settings: SettingsLike) -> tuple[Any, str | None]:
    """The settings to fold under (another tolerance than the knob's is an override) and a
    usage error, if any."""
    if args.tolerance is None:
        return settings, None
    try:
        value = float(args.tolerance)
    except ValueError:
        return settings, f"--tolerance {args.tolerance!r}: not a number"
    if not math.isfinite(value) or value < 0:
        return settings, f"--tolerance {args.tolerance!r}: must be a finite number >= 0"
    if value == float(settings.get(TOLERANCE_KNOB)):
        return settings, None
    # a what-if: the drift's dates depend on it, so the log is folded again under it
    args.overrides = [*args.overrides, f"{TOLERANCE_KNOB}={value!r}"]
    return settings.with_overrides({TOLERANCE_KNOB: repr(value)}), None


def _iso(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def row_json(row: ReconcileRow, now: float) -> dict[str, Any]:
    """One row with, per compared attribute, both values and their difference."""
    ours = row.ours or {}
    attrs: dict[str, Any] = {}
    for attr in (*COMPARED, *QUOTA_COMPARED, "SurplusPolicy"):
        a, b = ours.get(attr), row.theirs.get(attr)
        if a is None and b is None:
            continue
        entry: dict[str, Any] = {"poolledger": a, "negotiator": b,
                                 "drifting": attr in row.drifting}
        if isinstance(a, float) and isinstance(b, float):
            entry["difference"] = a - b
            entry["relative"] = relative(a, b)
        attrs[attr] = entry
    return {"negotiator": row.negotiator, "name": row.name, "is_group": row.is_group,
            "has_record": row.ours is not None, "reported_at": row.reported_at,
            "as_of": row.as_of, "reports": row.reports, "drifting": row.drifting,
            "since": row.since, "drift_seconds": 0.0 if row.since is None else now - row.since,
            "last_agreed": row.agreed, "attributes": attrs}


def _pair(ours: Any, theirs: Any, fmt: str) -> str:
    a = "-" if ours is None else format(ours, fmt)
    b = "-" if theirs is None else format(theirs, fmt)
    return f"{a}/{b}"


def _diff(ours: Any, theirs: Any) -> str:
    if not isinstance(ours, float) or not isinstance(theirs, float):
        return "-"
    return f"{relative(ours, theirs) * 100:+.3g}%"


def format_rows(rows: list[ReconcileRow], tolerance: float) -> str:
    """The table: per negotiator, one line per submitter and group (EUP, usage and quota as
    PoolLedger/negotiator, their relative difference, since when it drifts and which
    attributes)."""
    out: list[str] = []
    by_neg: dict[str, list[ReconcileRow]] = {}
    for row in rows:
        by_neg.setdefault(row.negotiator, []).append(row)
    for neg, group in by_neg.items():
        drifting = sum(1 for r in group if r.drifting)
        last = max(r.reported_at for r in group)
        out.append(f"Reconciliation with {neg}: {len(group)} submitters and groups, {drifting} "
                   f"drifting beyond {tolerance:g} (last report {_iso(last)} UTC)")
        width = max(30, *(len(r.name) for r in group))
        out.append(f"{'Name':{width}}  {'Effective Priority (ours/theirs)':>34} {'Diff':>8}  "
                   f"{'Usage wghted-hrs (ours/theirs)':>32} {'Diff':>8}  {'In Use':>9}  "
                   f"{'Effective Quota':>15}  {'Drifting since (UTC)':19}  Attributes")
        for r in group:
            ours = r.ours or {}
            th = r.theirs
            usage_o = ours.get("WeightedAccumulatedUsage")
            usage_t = th.get("WeightedAccumulatedUsage")
            hrs_o = None if usage_o is None else usage_o / 3600
            hrs_t = None if usage_t is None else usage_t / 3600
            quota = (_pair(ours.get("EffectiveQuota"), th.get("EffectiveQuota"), ".2f")
                     if r.is_group else "")
            in_use = _pair(ours.get("WeightedResourcesUsed"), th.get("WeightedResourcesUsed"), ".0f")
            out.append(
                f"{r.name:{width}}  "
                f"{_pair(ours.get('EffectivePriority'), th.get('EffectivePriority'), '.2f'):>34} "
                f"{_diff(ours.get('EffectivePriority'), th.get('EffectivePriority')):>8}  "
                f"{_pair(hrs_o, hrs_t, '.2f'):>32} {_diff(hrs_o, hrs_t):>8}  "
                f"{in_use:>9}  "
                f"{quota:>15}  {_iso(r.since) if r.drifting else '-':19}  "
                f"{','.join(r.drifting) or '-'}")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    settings, problem = _tolerance(args, settings)
    if problem is None and args.constraint is not None:
        try:
            compile_expr(args.constraint)
        except ClassAdError as exc:
            problem = f"-constraint {args.constraint!r}: {exc}"
    if problem is not None:
        print(f"poolledger reconcile: {problem}", file=sys.stderr)
        return 2
    try:
        folded, shard = fold_log(args, settings, negotiator=args.shard)
    except (ReplayError, ValueError) as exc:
        print(f"poolledger reconcile: {exc}", file=sys.stderr)
        return 1
    unknown = unknown_negotiator(shard, args.shard)
    if unknown is not None:
        print(f"poolledger reconcile: -name: {unknown}", file=sys.stderr)
        return 2
    ledger = folded.ledger
    now = ledger.now if ledger.now is not None else 0.0
    rows = ledger.reconciliation()
    want = args.negotiator or args.shard
    if want:
        rows = [r for r in rows if names(r.negotiator, want)]
    if not rows:
        of = f" of negotiator {want!r}" if want else ""
        where = args.log_file if args.log_file is not None else log_name(settings)
        print(f"poolledger reconcile: no Accounting ads{of} on the log {where}: forward the "
              "negotiator's ads to `poolledger collector` (CONDOR_VIEW_HOST) or follow its "
              "Accountantnew.log", file=sys.stderr)
        return 1
    if args.drifting:
        rows = [r for r in rows if r.drifting]
    if args.constraint is not None:
        rows = [r for r in rows if evaluate(args.constraint, drift_ad(r, now), now=now) is True]
    tolerance = ledger.reconcile_tolerance()
    if args.json:
        print(json.dumps({"now": now, "tolerance": tolerance,
                          "rows": [row_json(r, now) for r in rows]}, indent=2, sort_keys=True))
    elif rows:
        print(format_rows(rows, tolerance), end="")
    return 1 if any(r.drifting for r in rows) else 0
