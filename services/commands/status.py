"""`poolledger status`: condor_status over the collector's view the log folds to.

Why the collector fold (streams.core.collector) and not the last update of each ad: the collector
forgets ads that were not refreshed within their lifetime and keeps expiring slot ads as
absent; folding the log to its last event gives what condor_status would have printed then.
It is the ledger's own collector fold, read through the ledger's read API: on the configured
log it starts from the newest usable snapshot and folds only the tail (`fold_log`).
The layouts are condor_status's defaults: slots with the per-platform state summary, -schedd,
-submitters, -negotiator, -any; -total prints the summary only; -l the whole ads; -af the
named attributes; -constraint filters with a ClassAd expression. `poolledger updates-stats`
is condor_updates_stats (seed 002) for the same ads: updates received and lost per daemon,
counted from the events' sequence numbers.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from schemas.classads import ERROR, UNDEFINED, ad_from_json, evaluate, evaluation_problem, excerpt
from schemas.errors import ClassAdError
from services.commands import add_log_source, fold_log, printable
from streams.core import collector
from streams.core.ledger import Ledger
from streams.replay import ReplayError

if TYPE_CHECKING:
    from schemas.config import SettingsLike

#: condor_status's summary columns: each counts the slots in that State (BkIdle: Backfill/Idle)
SUMMARY = ("Owner", "Claimed", "Unclaimed", "Matched", "Preempting", "Drain", "Backfill", "BkIdle")


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="condor_status: the pool's ads as the collector holds them",
                       description="Print the collector's ads as of the log's last event, in "
                                   "condor_status's default layouts.")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("-schedd", action="store_true", help="Scheduler ads")
    kind.add_argument("-submitters", action="store_true", help="Submitter ads")
    kind.add_argument("-negotiator", action="store_true", help="Negotiator ads")
    kind.add_argument("-any", action="store_true", help="every ad, whatever its type")
    p.add_argument("-absent", action="store_true", help="only slots the collector holds as absent")
    p.add_argument("-total", action="store_true", help="only the summary")
    p.add_argument("-l", "-long", dest="long", action="store_true", help="whole ads")
    p.add_argument("-af", "-autoformat", dest="af", nargs="+", metavar="ATTR",
                   help="only these attributes (expressions), space-separated, one ad a line")
    p.add_argument("-constraint", metavar="EXPR", help="only ads for which EXPR is true")
    add_log_source(p)
    p.set_defaults(func=run)
    u = sub.add_parser("updates-stats", help="condor_updates_stats: updates received and lost",
                       description="For each ad the collector holds, the updates its daemon "
                                   "sent: total, received (sequenced) and lost, as "
                                   "`condor_status -l | condor_updates_stats` prints them.")
    u.add_argument("-constraint", metavar="EXPR", help="only ads for which EXPR is true")
    add_log_source(u)
    u.set_defaults(func=run_updates_stats, schedd=False, submitters=False, negotiator=False,
                   any=True, absent=False, af=None)


def _ad_type(args: argparse.Namespace) -> str | None:
    if args.any:
        return None
    return "Scheduler" if args.schedd else "Submitter" if args.submitters else \
        "Negotiator" if args.negotiator else "Machine"


def _fold(args: argparse.Namespace, settings: SettingsLike
          ) -> tuple[Ledger, list[collector.AdRecord]] | int:
    """The ledger at the log's end (from the newest usable snapshot, folding only the tail:
    `fold_log`) and the collector's ads the options select; an exit status after one line
    on stderr when an expression or the log is bad."""
    for flag, text in [("-constraint", args.constraint)] + [("-af", a) for a in args.af or []]:
        if text is None:
            continue
        problem = evaluation_problem(text)  # malformed, or more than a ClassAd evaluates
        if problem:
            print(f"poolledger {args.command}: {flag} {excerpt(text)}: {problem}",
                  file=sys.stderr)
            return 2
    try:
        ledger = fold_log(args, settings, needs=("pool",))[0].ledger
    except ReplayError as exc:
        print(f"poolledger {args.command}: {exc}", file=sys.stderr)
        return 1
    records = ledger.collector_ads(_ad_type(args), absent=True if args.absent else False)
    if _ad_type(args) == "Machine":  # condor_status orders slots by machine, then name
        records.sort(key=lambda r: (str(r.ad.get("Machine", "")), str(r.ad.get("Name", ""))))
    now = ledger.collector_now() or 0.0
    if args.constraint is not None:
        records = [r for r in records if _holds(args.constraint, r.ad, now)]
    return ledger, records


def _holds(constraint: str, ad: Mapping[str, Any], now: float) -> bool:
    """The constraint is true of the ad (one whose attributes classad2 refuses to evaluate,
    too deep or too much work, is not)."""
    try:
        return evaluate(constraint, ad, now=now) is True
    except ClassAdError:
        return False


def run_updates_stats(args: argparse.Namespace, settings: SettingsLike) -> int:
    folded = _fold(args, settings)
    if isinstance(folded, int):
        return folded
    ledger, records = folded
    stats = ledger.update_stats()
    for r in records:
        st = stats.get(r.source)
        if st is None:
            continue
        name = r.ad.get("Name", r.name)
        print(f"*** Name/Machine = '{name}' MyType = '{r.ad_type}' ***")
        print(" Type: Main")
        print(f"   Stats: Total={st.total}, Seq={st.received}, Lost={st.lost} ({st.lost_pct:.2f}%)")
    return 0


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    folded = _fold(args, settings)
    if isinstance(folded, int):
        return folded
    ledger, records = folded
    ads = [r.ad for r in records]
    now = ledger.collector_now() or 0.0
    if args.long:
        print("\n".join(ad_from_json(ad).printOld() for ad in ads), end="")
    elif args.af:
        for ad in ads:
            print(" ".join(_value(ad, a, now) for a in args.af))
    else:
        print("\n".join(_layout(args, ads, now)))
    return 0


def _value(ad: Mapping[str, Any], attr: str, now: float) -> str:
    """-af: a value as condor_status prints it (strings bare, undefined as `undefined`)."""
    try:
        value = evaluate(attr, ad, now=now)
    except ClassAdError:  # an attribute classad2 refuses to evaluate: as condor_status, error
        return "error"
    if value is UNDEFINED:
        return "undefined"
    if value is ERROR:
        return "error"
    if value is True or value is False:
        return "true" if value else "false"
    return printable(str(value))  # a value's newline must not start a line of its own


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 86400}+{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _table(header: list[str], rows: Iterable[list[str]], right: set[int]) -> list[str]:
    rows = list(rows)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return " ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), ""] + [line(r) for r in rows]


def _layout(args: argparse.Namespace, ads: list[dict[str, Any]], now: float) -> list[str]:
    if args.schedd:
        return _totals(ads, ["Name", "Machine"], ["TotalRunningJobs", "TotalIdleJobs", "TotalHeldJobs"],
                       ["RunningJobs", "IdleJobs", "HeldJobs"], args.total, by_name=False)
    if args.submitters:
        return _totals(ads, ["Name", "Machine"], ["RunningJobs", "IdleJobs", "HeldJobs"],
                       ["RunningJobs", "IdleJobs", "HeldJobs"], args.total, by_name=True)
    if args.negotiator or args.any:
        cols = ["Name", "Machine"] if args.negotiator else ["MyType", "TargetType", "Name"]
        return _table(cols, ([str(ad.get(c, "")) for c in cols] for ad in ads), set())
    return _machines(ads, now, args.total)


def _totals(ads: list[dict[str, Any]], keys: list[str], attrs: list[str], titles: list[str],
            total_only: bool, *, by_name: bool) -> list[str]:
    """-schedd / -submitters: a row per ad, then the totals (per submitter name too)."""
    def num(ad: Mapping[str, Any], attr: str) -> int:
        value = ad.get(attr, 0)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    out: list[str] = []
    if not total_only:
        out += _table(keys + titles, ([str(ad.get(k, "")) for k in keys] + [str(num(ad, a)) for a in attrs]
                                      for ad in ads), {2, 3, 4}) + [""]
    groups: dict[str, list[int]] = {}
    if by_name:
        for ad in ads:
            row = groups.setdefault(str(ad.get("Name", "")), [0] * len(attrs))
            for i, a in enumerate(attrs):
                row[i] += num(ad, a)
    total = [sum(num(ad, a) for ad in ads) for a in attrs]
    rows = [[name] + [str(v) for v in vals] for name, vals in sorted(groups.items())]
    rows.append(["Total"] + [str(v) for v in total])
    header = [""] + (titles if by_name else attrs)
    return out + _table(header, rows, {0, 1, 2, 3})


def _machines(ads: list[dict[str, Any]], now: float, total_only: bool) -> list[str]:
    """The default slot layout and the per-platform summary of slot states."""
    out: list[str] = []
    if not total_only:
        rows = []
        for ad in ads:
            entered = ad.get("EnteredCurrentActivity")
            load = ad.get("LoadAvg", 0.0)
            rows.append([str(ad.get("Name", "")), str(ad.get("OpSys", "")), str(ad.get("Arch", "")),
                         str(ad.get("State", "")), str(ad.get("Activity", "")),
                         f"{float(load):.3f}" if isinstance(load, (int, float)) else "",
                         str(ad.get("Memory", "")),
                         _duration(now - float(entered)) if isinstance(entered, (int, float)) else ""])
        out += _table(["Name", "OpSys", "Arch", "State", "Activity", "LoadAv", "Mem", "ActvtyTime"],
                      rows, {5, 6, 7}) + [""]
    platforms: dict[str, list[int]] = {}
    for ad in ads:
        counts = platforms.setdefault(f"{ad.get('Arch', '?')}/{ad.get('OpSys', '?')}",
                                      [0] * (len(SUMMARY) + 1))
        counts[0] += 1
        state = "Drain" if ad.get("State") == "Drained" else str(ad.get("State"))
        if state in SUMMARY:
            counts[1 + SUMMARY.index(state)] += 1
        if state == "Backfill" and ad.get("Activity") == "Idle":
            counts[1 + SUMMARY.index("BkIdle")] += 1
    rows = [[p] + [str(n) for n in c] for p, c in sorted(platforms.items())]
    rows.append(["Total"] + [str(sum(c[i] for c in platforms.values())) for i in range(len(SUMMARY) + 1)])
    return out + _table(["", "Total", *SUMMARY], rows, set(range(len(SUMMARY) + 2)))
