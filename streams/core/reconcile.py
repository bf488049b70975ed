"""The reconciliation fold: a real negotiator's Accounting ads beside PoolLedger's own accounting.

Why a fold: in shadow mode the real negotiator's view of each submitter and group arrives as
`ad.updated` events of MyType "Accounting" (forwarded to the collector endpoint, or converted
from Accountantnew.log). Folding them next to the accountant puts both numbers, the difference
and the time since which it exceeds the tolerance into the ledger a snapshot restores, so
drift is a query (`poolledger reconcile`), a metric (gangliad) and an audit trail, answered
for any point of the log, in event time only.

Per (negotiator, name) a row keeps the last values the negotiator reported (`theirs`),
PoolLedger's values for the same record at the time those values describe (`ours`), the
attributes whose difference exceeds POOLLEDGER_RECONCILE_TOLERANCE (`drifting`), since when
the current drift lasts (`since`: the event time of the first report of the stretch) and when
the two last agreed (`agreed`).

What an Accounting ad's `Priority` means depends on who wrote it (read from HTCondor's
source): condor_negotiator's forwarded ads (`forwardAccountingData`, `forwardGroupAccounting`
in matchmaker.cpp) and its ReportState replace the record's Priority with
`GetPriority(name)`, which is Priority x PriorityFactor (the EUP), and always carry
`LastUpdate`, the accountant's last update time; a Customer record of Accountantnew.log keeps
the real priority and has no `LastUpdate`; PoolLedger's own ads carry the real priority and
`EffectivePriority`. `reported` normalises the three to RUP and EUP.

Kept out of the ledger's canonical JSON (the golden digests: existing logs hold PoolLedger's
own Accounting ads), like the job outcomes; snapshots and the faust tables store it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.config import SettingsLike
from streams.core import accountant
from streams.core.accountant import AccountantConfig, AccountantState

__all__ = ["ACCOUNTING", "COMPARED", "DRIFT_AD_TYPE", "QUOTA_COMPARED", "ReconcileConfig",
           "ReconcileRow", "ReconcileState", "on_accounting_ad", "ours_of", "reported", "beyond",
           "differences", "drift_ad", "relative"]

ACCOUNTING: Final = "Accounting"
TOLERANCE_KNOB: Final = "POOLLEDGER_RECONCILE_TOLERANCE"
#: the attributes compared for every submitter and group (HTCondor names; Priority is the RUP)
COMPARED: Final = ("Priority", "EffectivePriority", "PriorityFactor", "ResourcesUsed",
                   "WeightedResourcesUsed", "AccumulatedUsage", "WeightedAccumulatedUsage")
#: and for groups, the quota attributes of condor_userprio -quotas
QUOTA_COMPARED: Final = ("EffectiveQuota", "ConfigQuota", "SubtreeQuota", "Requested")
#: what a row shows beside them (not compared: their meaning differs between accounting modes)
SHOWN: Final = ("BeginUsageTime", "LastUsageTime", "SurplusPolicy")
#: below this an absolute difference is noise, whatever the tolerance (0 against 1e-300)
ABSOLUTE_FLOOR: Final = 1e-9
#: `drifting` of a name PoolLedger has no accounting record of
NO_RECORD: Final = "<no record>"
_QUOTA_KEYS: Final = (("EffectiveQuota", "quota"), ("ConfigQuota", "config_quota"),
                      ("SubtreeQuota", "subtree_quota"), ("Requested", "requested"),
                      ("SurplusPolicy", "surplus_policy"))


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    """The relative tolerance beyond which an attribute drifts."""

    tolerance: float = 0.01

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> ReconcileConfig:
        value = settings.get(TOLERANCE_KNOB)
        return cls(0.01 if value is None else float(value))


@dataclass(slots=True)
class ReconcileRow:
    """One (negotiator, name): the last report, PoolLedger's values for it, and the drift."""

    negotiator: str
    name: str
    is_group: bool
    reported_at: float
    as_of: float
    theirs: dict[str, Any]
    ours: dict[str, Any] | None
    drifting: list[str] = field(default_factory=list)
    since: float | None = None
    agreed: float | None = None
    reports: int = 0

    def to_doc(self) -> dict[str, Any]:
        return {"negotiator": self.negotiator, "name": self.name, "is_group": self.is_group,
                "reported_at": self.reported_at, "as_of": self.as_of, "theirs": self.theirs,
                "ours": self.ours, "drifting": self.drifting, "since": self.since,
                "agreed": self.agreed, "reports": self.reports}

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> ReconcileRow:
        ours = d["ours"]
        return cls(str(d["negotiator"]), str(d["name"]), bool(d["is_group"]),
                   float(d["reported_at"]), float(d["as_of"]), dict(d["theirs"]),
                   None if ours is None else dict(ours), [str(a) for a in d["drifting"]],
                   None if d["since"] is None else float(d["since"]),
                   None if d["agreed"] is None else float(d["agreed"]), int(d["reports"]))

    def copy(self) -> ReconcileRow:
        return ReconcileRow(self.negotiator, self.name, self.is_group, self.reported_at,
                            self.as_of, dict(self.theirs),
                            None if self.ours is None else dict(self.ours), list(self.drifting),
                            self.since, self.agreed, self.reports)


@dataclass(slots=True)
class ReconcileState:
    """Rows by negotiator, then by submitter or group name."""

    rows: dict[str, dict[str, ReconcileRow]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"rows": {n: {k: r.to_doc() for k, r in sorted(by.items())}
                         for n, by in sorted(self.rows.items())}}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_doc(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ReconcileState:
        return cls({str(n): {str(k): ReconcileRow.from_doc(r) for k, r in by.items()}
                    for n, by in doc.get("rows", {}).items()})

    @classmethod
    def from_json(cls, raw: bytes | str) -> ReconcileState:
        return cls.from_doc(orjson.loads(raw))


def _number(value: Any) -> float | None:
    """A finite number of an ad (bools and expressions are not)."""
    kind = type(value)
    if kind is not float and kind is not int:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


#: the numeric attributes `reported` reads (the Priority pair apart)
_NUMERIC: Final = tuple(a for a in (*COMPARED, *QUOTA_COMPARED, *SHOWN)
                        if a not in ("Priority", "EffectivePriority", "SurplusPolicy"))


def reported(ad: Mapping[str, Any]) -> dict[str, Any]:
    """The values an Accounting ad reports, with Priority the RUP and EffectivePriority the EUP
    whoever wrote it (the module docstring says how they differ); unreadable values left out."""
    out: dict[str, Any] = {}
    for attr in _NUMERIC:
        value = ad.get(attr)
        if value is not None:
            number = _number(value)
            if number is not None:
                out[attr] = number
    policy = ad.get("SurplusPolicy")
    if isinstance(policy, str):
        out["SurplusPolicy"] = policy
    prio, factor = _number(ad.get("Priority")), out.get("PriorityFactor")
    if prio is None:
        return out
    eup = _number(ad.get("EffectivePriority"))
    if eup is not None:  # PoolLedger's own ads
        out["Priority"], out["EffectivePriority"] = prio, eup
    elif _number(ad.get("LastUpdate")) is not None:  # condor_negotiator's: Priority is the EUP
        out["EffectivePriority"] = prio
        if factor is not None and factor > 0:
            out["Priority"] = prio / factor
    else:  # a Customer record of Accountantnew.log: the real priority
        out["Priority"] = prio
        if factor is not None:
            out["EffectivePriority"] = prio * factor
    return out


def ours_of(state: AccountantState, quota_rows: Mapping[str, Mapping[str, Any]], name: str,
            t: float, cfg: AccountantConfig) -> dict[str, Any] | None:
    """PoolLedger's values of `name` at `t` under the attribute names `reported` gives (None:
    the accountant has no record of it); a group's quotas from the quota fold's last rows."""
    if name not in state.customers:
        return None
    rec = accountant.view(state, t, cfg, names=(name,))[name]
    out: dict[str, Any] = {a: float(rec[a]) for a in COMPARED}
    out["BeginUsageTime"] = float(rec["BeginUsageTime"])
    out["LastUsageTime"] = float(rec["LastUsageTime"])
    q = quota_rows.get(name)
    if q is not None:
        for attr, key in _QUOTA_KEYS:
            value = q.get(key)
            number = _number(value)
            if isinstance(value, str):
                out[attr] = value
            elif number is not None:
                out[attr] = number
    return out


def beyond(ours: float, theirs: float, tolerance: float) -> bool:
    """Whether two values differ by more than `tolerance`, relative to the larger magnitude."""
    diff = abs(ours - theirs)
    return diff > ABSOLUTE_FLOOR and diff > tolerance * max(abs(ours), abs(theirs))


def differences(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any],
                tolerance: float) -> list[str]:
    """The compared attributes both sides have whose values drift (`NO_RECORD` alone when
    PoolLedger has no record of the name)."""
    if ours is None:
        return [NO_RECORD]
    out = []
    for attr in (*COMPARED, *QUOTA_COMPARED):
        a, b = ours.get(attr), theirs.get(attr)
        if isinstance(a, float) and isinstance(b, float) and beyond(a, b, tolerance):
            out.append(attr)
    a, b = ours.get("SurplusPolicy"), theirs.get("SurplusPolicy")
    if isinstance(a, str) and isinstance(b, str) and a != b:
        out.append("SurplusPolicy")
    return out


def on_accounting_ad(state: ReconcileState, ad: Mapping[str, Any], name: str, ts: float,
                     acct: AccountantState, quota_rows: Mapping[str, Mapping[str, Any]],
                     acct_cfg: AccountantConfig, cfg: ReconcileConfig) -> None:
    """Fold one Accounting ad (event time `ts`): compare it with PoolLedger's record of `name`
    at the time its values describe (its `LastUpdate`, else `ts`) and date the drift."""
    negotiator = ad.get("NegotiatorName")
    neg = negotiator if isinstance(negotiator, str) and negotiator else "<unknown>"
    rec_name = ad.get("Name")
    key = rec_name if isinstance(rec_name, str) and rec_name else name
    theirs = reported(ad)
    last_update = _number(ad.get("LastUpdate"))
    as_of = ts if last_update is None else last_update
    ours = ours_of(acct, quota_rows, key, as_of, acct_cfg)
    drifting = differences(ours, theirs, cfg.tolerance)
    by = state.rows.get(neg)
    if by is None:
        by = state.rows[neg] = {}
    row = by.get(key)
    is_group = ad.get("IsAccountingGroup") is True
    if row is None:
        row = by[key] = ReconcileRow(neg, key, is_group, ts, as_of, theirs, ours)
    row.is_group, row.reported_at, row.as_of = is_group, ts, as_of
    row.theirs, row.ours = theirs, ours
    row.reports += 1
    row.drifting = drifting
    if drifting:
        if row.since is None:
            row.since = ts
    else:
        row.since = None
        row.agreed = ts


#: MyType of the ads `drift_ad` builds (gangliad's metric definitions target it)
DRIFT_AD_TYPE: Final = "Reconciliation"


def relative(ours: float, theirs: float) -> float:
    """(ours - theirs) relative to the larger magnitude (0 when both are 0)."""
    scale = max(abs(ours), abs(theirs))
    return 0.0 if scale == 0 else (ours - theirs) / scale


def drift_ad(row: ReconcileRow, now: float) -> dict[str, Any]:
    """A row as a ClassAd (MyType "Reconciliation") for the metric language and -constraint:
    `PoolLedger<A>`, `Negotiator<A>`, `<A>Drift` (ours - theirs) and `<A>RelativeDrift` for
    every compared attribute A both sides have; `Drifting`, `DriftingAttributes`,
    `DriftSince` and `DriftSeconds` (at `now`), `LastAgreed`, `ReportedAt`, `AsOf`."""
    ad: dict[str, Any] = {
        "MyType": DRIFT_AD_TYPE, "Name": row.name, "NegotiatorName": row.negotiator,
        "IsAccountingGroup": row.is_group, "ReportedAt": row.reported_at, "AsOf": row.as_of,
        "Reports": row.reports, "Drifting": bool(row.drifting),
        "DriftingAttributes": ",".join(row.drifting),
        "DriftSeconds": 0.0 if row.since is None else max(0.0, now - row.since),
        "HasRecord": row.ours is not None,
    }
    if row.since is not None:
        ad["DriftSince"] = row.since
    if row.agreed is not None:
        ad["LastAgreed"] = row.agreed
    ours = row.ours or {}
    for attr in (*COMPARED, *QUOTA_COMPARED, *SHOWN):
        a, b = ours.get(attr), row.theirs.get(attr)
        if a is not None:
            ad[f"PoolLedger{attr}"] = a
        if b is not None:
            ad[f"Negotiator{attr}"] = b
        if isinstance(a, float) and isinstance(b, float) and attr not in SHOWN:
            ad[f"{attr}Drift"] = a - b
            ad[f"{attr}RelativeDrift"] = relative(a, b)
    return ad
