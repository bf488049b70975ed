"""`poolledger audit SUBMITTER`: a submitter's RUP/EUP timeline with every change and its cause.

Each row is one event that changed the record (a job start or stop with its slot and weight,
an admin command with who, why, old and new value, a knob change, a negotiation cycle), with
the decay since the previous row shown separately so an SRE can tell usage from time.

Shadowing a real pool, the negotiator's Accounting ads for the submitter are folded beside
its record (streams/core/reconcile.py): every report that starts, changes or ends a drift
beyond POOLLEDGER_RECONCILE_TOLERANCE is listed too, with both sides' values and the last
change of the record before it (the events around the drift are the rows above).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from schemas.config import SettingsLike
from schemas.events import (AdminCommanded, AdUpdated, ConfigChanged, Envelope, JobStarted,
                            JobStopped, NegotiationCycled, PriorityChanged)
from services.commands import add_log_source, events_topic, load_events, open_log_to_read
from services.negotiator.shard import names, select_negotiator, unknown_negotiator
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.core.reconcile import ACCOUNTING, ReconcileRow
from streams.replay import ReplayError, parse_time

SAMPLES = 400


class CurvePoint(NamedTuple):
    """The audited record at one time: RUP, EUP (RUP x factor) and priority factor."""

    t: float
    rup: float
    eup: float
    factor: float


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One change of the audited record."""

    Time: float
    EventId: str
    EventType: str
    Cause: str
    DecayedFrom: float | None
    PriorityBefore: float | None
    Priority: float
    PriorityFactor: float
    EffectivePriority: float
    WeightedResourcesUsed: float
    Floor: float
    Ceiling: float


@dataclass(frozen=True, slots=True)
class DriftRow:
    """A negotiator's report on the audited record that started, changed or ended a drift
    (`State`: "started", "changed", "ended"; the first report of a negotiator: "agrees" too),
    both sides' values (None where a side has none) and the last change of the record before
    it (`After`, an AuditRow's cause and event id)."""

    Time: float
    EventId: str
    Negotiator: str
    State: str
    Drifting: tuple[str, ...]
    Since: float | None
    Priority: tuple[float | None, float | None]
    EffectivePriority: tuple[float | None, float | None]
    WeightedAccumulatedUsage: tuple[float | None, float | None]
    WeightedResourcesUsed: tuple[float | None, float | None]
    After: str


def _drift_row(env: Envelope, row: ReconcileRow, state: str, rows: list[AuditRow]) -> DriftRow:
    ours = row.ours or {}

    def pair(attr: str) -> tuple[float | None, float | None]:
        return ours.get(attr), row.theirs.get(attr)

    after = next((f"{r.Cause} [{r.EventId}]" for r in reversed(rows) if r.Time <= env.ts), "")
    return DriftRow(env.ts, env.id, row.negotiator, state, tuple(row.drifting), row.since,
                    pair("Priority"), pair("EffectivePriority"),
                    pair("WeightedAccumulatedUsage"), pair("WeightedResourcesUsed"), after)


def _drift_state(before: ReconcileRow | None, after: ReconcileRow) -> str | None:
    """How a report moved the drift of a row (None: it did not)."""
    if not after.drifting:
        if before is None:
            return "agrees"
        return "ended" if before.drifting else None
    if before is None or not before.drifting:
        return "started"
    return "changed" if before.drifting != after.drifting else None
def _by(d: AdminCommanded | ConfigChanged) -> str:
    """Who appended an edit, and who an imported one claimed had (a claim, not a fact)."""
    claim = f" (imported; claimed by {d.claimed_by})" if d.claimed_by else ""
    return f"{d.by or 'unknown'}{claim}"


def describe(env: Envelope) -> str:
    """What an event did, in an operator's words."""
    d = env.data
    if isinstance(d, JobStarted):
        return f"job {d.job_id} started on {d.slot} (SlotWeight {d.slot_weight:g})"
    if isinstance(d, JobStopped):
        return f"job {d.job_id} {d.reason} on {d.slot}"
    if isinstance(d, AdminCommanded):
        value = "" if d.value is None else f" {d.value}"
        lease = f" for {d.duration:g}s" if d.duration else ""
        why = f" because {d.reason!r}" if d.reason else ""
        return f"{d.op}{value}{lease} by {_by(d)}{why}"
    if isinstance(d, ConfigChanged):
        return f"config {d.knob} = {d.value} by {_by(d)}"
    if isinstance(d, NegotiationCycled):
        return f"negotiation cycle {d.cycle} by {d.negotiator}"
    return env.type


def _point(ledger: Ledger, name: str, t: float) -> CurvePoint | None:
    """The record of `name` at `t` as condor_userprio shows it (None: no record)."""
    rec = ledger.submitter(name, t)
    if rec is None:
        return None
    return CurvePoint(t, rec["Priority"], rec["EffectivePriority"], rec["PriorityFactor"])


def audit(events: Iterable[Envelope], settings: SettingsLike, name: str, t_from: float | None = None,
          t_to: float | None = None, rejected: list[tuple[Envelope, str]] | None = None,
          ledger: Ledger | None = None, drift: list[DriftRow] | None = None,
          negotiator: str | None = None) -> tuple[list[AuditRow], list[CurvePoint]]:
    """The rows for `name` within [t_from, t_to], and a sampled curve of its RUP, EUP and
    factor (with the values just before and after each change, so an edit is a step at its
    time, not a ramp between samples); admin edits and knob changes from t_from on that the
    ledger rejected are appended to `rejected` with the reason, and the negotiators' reports
    that started, changed or ended a drift of `name` to `drift` (only `negotiator`'s, when
    named: a shard's ledger is compared with its own negotiator's reports alone).
    `ledger` is the state before `events` (restored from a snapshot that ends before
    `t_from`); default a fresh one."""
    if ledger is None:
        ledger = Ledger(settings)
    rows: list[AuditRow] = []
    curve: list[CurvePoint] = []
    evs = list(events)
    if not evs:
        return rows, curve
    # Event time need not be monotonic in a log (sources' clocks, late admin edits).
    lo = t_from if t_from is not None else min(e.ts for e in evs)
    hi = t_to if t_to is not None else max(e.ts for e in evs)
    step = max((hi - lo) / SAMPLES, 1e-9)
    next_sample = lo
    last_after: float | None = None
    for env in evs:
        if env.ts > hi:
            continue
        while next_sample <= min(env.ts, hi):
            sample = _point(ledger, name, next_sample)
            if sample is not None:
                curve.append(sample)
            next_sample += step
        before = ledger.priority_at(name, env.ts)
        data = env.data
        report = (drift is not None and isinstance(data, AdUpdated)
                  and data.ad_type == ACCOUNTING and data.ad.get("Name", data.name) == name)
        was = {r.negotiator: r for r in ledger.reconciliation_of(name)} if report else {}
        try:
            derived_events = ledger.apply(env)
        except EventRejectedError as exc:
            if rejected is not None and isinstance(env.data, (AdminCommanded, ConfigChanged)) \
                    and env.ts >= lo:
                rejected.append((env, exc.reason))
            continue
        for derived in derived_events:
            d = derived.data
            if not isinstance(d, PriorityChanged) or d.name != name or env.ts < lo:
                continue
            rows.append(AuditRow(env.ts, env.id, env.type, describe(env), last_after, before,
                                 d.priority, d.factor, d.effective_priority,
                                 d.weighted_resources_used, d.floor, d.ceiling))
            last_after = d.priority
            if before is not None and curve:
                factor = curve[-1].factor
                curve.append(CurvePoint(env.ts, before, before * factor, factor))
            curve.append(CurvePoint(env.ts, d.priority, d.effective_priority, d.factor))
        if report and drift is not None and env.ts >= lo:
            for row in ledger.reconciliation_of(name):
                if negotiator and not names(row.negotiator, negotiator):
                    continue
                state = _drift_state(was.get(row.negotiator), row)
                if state is not None:
                    drift.append(_drift_row(env, row, state, rows))
    while next_sample <= hi:
        sample = _point(ledger, name, next_sample)
        if sample is None:  # no record of `name`
            break
        curve.append(sample)
        next_sample += step
    curve.sort(key=lambda p: p.t)  # a late event's step goes where it happened (stable sort)
    return rows, curve


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="a submitter's RUP/EUP timeline with every cause")
    p.add_argument("submitter", help="submitter or group name, e.g. alice@example.org")
    p.add_argument("--from", dest="t_from", metavar="T1", help="epoch seconds or ISO 8601")
    p.add_argument("--to", dest="t_to", metavar="T2", help="epoch seconds or ISO 8601")
    p.add_argument("--json", action="store_true", help="rows as JSON")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="plot RUP, EUP and priority factor over time, each "
                   "admin edit marked and named")
    p.add_argument("--negotiator", metavar="NEG",
                   help="only that named negotiator's accounting (its shard of the log)")
    add_log_source(p)
    p.set_defaults(func=run)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    try:
        t_from = parse_time(args.t_from) if args.t_from else None
        t_to = parse_time(args.t_to) if args.t_to else None
        refused: list[tuple[Envelope, str]] = []
        drift: list[DriftRow] = []
        shard = None
        if t_from is not None and args.log_file is None and not args.negotiator:
            rows, curve = _audit_from_snapshot(args, settings, t_from, t_to, refused, drift)
        else:
            evs, shard = select_negotiator(load_events(args, settings), args.negotiator, settings)
            rows, curve = audit(evs, settings, args.submitter, t_from, t_to, refused, drift=drift,
                                negotiator=args.negotiator)
    except (ReplayError, ValueError) as exc:
        print(f"poolledger audit: {exc}", file=sys.stderr)
        return 2
    problem = unknown_negotiator(shard, args.negotiator)
    if problem is not None:
        print(f"poolledger audit: --negotiator: {problem}", file=sys.stderr)
        return 2
    if not rows and not curve and not drift:
        print(f"poolledger audit: no record of {args.submitter!r} in the log", file=sys.stderr)
        return 1
    if args.plot:
        plot(args.plot, args.submitter, rows, curve)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    print(f"Audit of {args.submitter}: {len(rows)} changes")
    print(f"{'Time (UTC)':19}  {'Decay':>21}  {'RUP':>19}  {'Factor':>9}  {'EUP':>12}  Cause")
    for r in rows:
        decay = ("" if r.DecayedFrom is None or r.PriorityBefore is None
                 else f"{r.DecayedFrom:9.2f}->{r.PriorityBefore:<9.2f}")
        before = "new" if r.PriorityBefore is None else f"{r.PriorityBefore:.2f}"
        print(f"{_iso(r.Time):19}  {decay:>21}  {before + '->' + format(r.Priority, '.2f'):>19}  "
              f"{r.PriorityFactor:9.2f}  {r.EffectivePriority:12.2f}  {r.Cause} [{r.EventId}]")
    if drift:
        _print_drift(drift)
    if refused:
        print(f"Rejected admin edits and knob changes (dead-lettered, not applied): {len(refused)}")
        for env, reason in refused:
            print(f"{_iso(env.ts):19}  {describe(env)} [{env.id}]: {reason}")
    return 0


def _print_drift(drift: list[DriftRow]) -> None:
    """The negotiators' reports that started, changed or ended a drift (ours/theirs)."""
    def pair(p: tuple[float | None, float | None], scale: float = 1.0) -> str:
        return "/".join("-" if v is None else f"{v / scale:.2f}" for v in p)

    print(f"Reconciliation with the negotiator: {len(drift)} reports that moved the drift "
          "(values PoolLedger/negotiator)")
    print(f"{'Time (UTC)':19}  {'State':7}  {'RUP':>13}  {'EUP':>19}  {'Usage hrs':>15}  "
          f"{'In Use':>7}  Drifting (since)  Negotiator [event]; last change before it")
    for d in drift:
        since = f" (since {_iso(d.Since)})" if d.Since is not None else ""
        print(f"{_iso(d.Time):19}  {d.State:7}  {pair(d.Priority):>13}  "
              f"{pair(d.EffectivePriority):>19}  {pair(d.WeightedAccumulatedUsage, 3600):>15}  "
              f"{pair(d.WeightedResourcesUsed):>7}  {','.join(d.Drifting) or '-'}{since}  "
              f"{d.Negotiator} [{d.EventId}]; {d.After or '-'}")


def _audit_from_snapshot(args: argparse.Namespace, settings: SettingsLike, t_from: float,
                         t_to: float | None, refused: list[tuple[Envelope, str]],
                         drift: list[DriftRow] | None = None
                         ) -> tuple[list[AuditRow], list[CurvePoint]]:
    """`audit --from T1` on the configured log: from the newest snapshot of events all
    before T1 (`streams.replay.start_of`), auditing only the events after it."""
    from streams.log.events import EventLog, ensure_topics
    from streams.replay import Until, start_of

    log = open_log_to_read(settings)
    try:
        ensure_topics(log)
        elog = EventLog(log)
        topic = events_topic(settings)
        start = start_of(elog, settings, Until(ts=math.nextafter(t_from, -math.inf)), topic=topic,
                         whatif=bool(args.overrides),
                         warn=lambda line: print(f"poolledger audit: warning: {line}",
                                                 file=sys.stderr))
        evs = (env for _rec, env in elog.read(topic, start_positions=start.positions))
        return audit(evs, settings, args.submitter, t_from, t_to, refused, start.ledger, drift)
    finally:
        log.close()


#: An edit more than this many usage spans after the last usage is named at the edge instead.
FAR_EDIT_SPANS = 2.0

#: A panel spanning more than this ratio (a nice_user's factor 1e10 beside 1000) is drawn log.
LOG_SPAN = 1000.0

#: How each kind of edit is drawn: its colour and its legend entry.
EDITS = {"admin.command": ("tab:red", "admin command (condor_userprio)"),
         "config.changed": ("tab:purple", "knob change")}


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def _edit_label(r: AuditRow) -> str:
    """What an edit did and who did it, short enough to stand beside its mark
    ("setfactor 2000.0 by root"; the reason is in the table)."""
    return r.Cause.split(" because ")[0].split(" (imported")[0]


def draw(name: str, rows: list[AuditRow], curve: list[CurvePoint]) -> Any:
    """The figure of `audit --plot`: RUP, EUP and priority factor in three panels on one UTC
    time axis, each admin command and knob change that moved the record a dashed line through
    all three, named (what and who) at the top. The axis spans the submitter's usage and the
    edits near it; an edit issued long after (a live edit on an old run: months later) is
    named in a note at the right edge instead of squashing the run into a pixel."""
    import matplotlib.dates as mdates
    from matplotlib.lines import Line2D

    from services.plots import plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, layout="constrained",
                             gridspec_kw={"height_ratios": [3, 3, 2]})
    rup_ax, eup_ax, factor_ax = axes
    fig.suptitle(f"Priority of {name}")
    rup_ax.set_ylabel("real user priority\n(RUP)")
    eup_ax.set_ylabel("effective priority\n(EUP = RUP \u00d7 factor)")
    factor_ax.set_ylabel("priority factor")
    factor_ax.set_xlabel("time (UTC)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    if not curve:
        return fig
    usage = [r.Time for r in rows if r.EventType not in EDITS] or [curve[-1].t]
    start = curve[0].t
    span = max(max(usage) - start, 3600.0)
    right = max(usage) + span * FAR_EDIT_SPANS  # beyond it an edit is "long after"
    shown = [p for p in curve if p.t <= right]
    xs = [_utc(p.t) for p in shown]
    for ax, values, color, label, style in (
            (rup_ax, [p.rup for p in shown], "tab:blue", "RUP", "default"),
            (eup_ax, [p.eup for p in shown], "tab:orange", "EUP", "default"),
            (factor_ax, [p.factor for p in shown], "tab:green", "priority factor", "steps-post")):
        ax.plot(xs, values, color=color, label=label, linewidth=1.6, drawstyle=style)
        low, high = min(values), max(values)
        if low > 0 and high / low > LOG_SPAN:
            ax.set_yscale("log")
            ax.set_ylabel(ax.get_ylabel() + ", log")
        else:
            ax.set_ylim(0, high * 1.12 or 1.0)
    edits = [r for r in rows if r.EventType in EDITS]
    near = [r for r in edits if r.Time <= right]
    at: dict[float, list[AuditRow]] = {}  # edits at one time share a mark and a name
    for r in near:
        at.setdefault(r.Time, []).append(r)
    for t, same in at.items():
        color = EDITS[same[-1].EventType][0]
        for ax in axes:
            ax.axvline(_utc(t), color=color, linestyle="--", linewidth=0.9, zorder=1)
        eup_ax.plot([_utc(t)], [same[-1].EffectivePriority], "o", color=color, zorder=3)
        factor_ax.plot([_utc(t)], [same[-1].PriorityFactor], "o", color=color, zorder=3)
        labels = [_edit_label(r) for r in same]
        named = "; ".join(f"{x} (\u00d7{labels.count(x)})" if labels.count(x) > 1 else x
                          for x in dict.fromkeys(labels))
        rup_ax.annotate(named, xy=(_utc(t), 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -4), textcoords="offset points", rotation=90,
                        rotation_mode="anchor", ha="right", va="top", fontsize="small",
                        color=color)
    kinds = [k for k in EDITS if any(r.EventType == k for r in near)]
    handles = [Line2D([], [], color="tab:blue", label="RUP"),
               Line2D([], [], color="tab:orange", label="EUP"),
               Line2D([], [], color="tab:green", label="priority factor")]
    handles += [Line2D([], [], color=EDITS[k][0], linestyle="--", marker="o", label=EDITS[k][1])
                for k in kinds]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               fontsize="small")
    far = [r for r in edits if r.Time > right]
    end = max(p.t for p in shown)
    if far:
        factor_ax.set_xlim(right=_utc(end + (end - start) * 0.02))
        text = "\n".join(f"{r.Cause} at {_iso(r.Time)} UTC "
                         f"({(r.Time - end) / 86400:.0f} days later) \u2192" for r in far[-3:])
        factor_ax.annotate(text, xy=(0.99, 0.05), xycoords="axes fraction", ha="right",
                           va="bottom", fontsize="small", color=EDITS[far[-1].EventType][0])
    locator = mdates.AutoDateLocator(tz=timezone.utc)
    factor_ax.xaxis.set_major_locator(locator)
    factor_ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    return fig


def plot(path: Path, name: str, rows: list[AuditRow], curve: list[CurvePoint]) -> None:
    """Write `draw`'s figure to `path`."""
    from services.plots import save

    save(draw(name, rows, curve), path)
