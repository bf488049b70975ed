"""The accountant (HTCondor's Accountant.cpp) as a pure fold of the event log.

State holds one customer record per submitter and per group (including `<none>`) with
HTCondor's attribute names, plus one resource record per claimed slot. `apply` folds one
event into the state IN PLACE and returns the derived `priority.changed` events.

Two modes (DESIGN.md, "Accounting: exact and HTCondor-compatible"):

* `exact` (default): usage is piecewise constant between events, so every event that touches
  a record first integrates it up to the event time t: with beta = 0.5^((t - LastUpdateTime)/h),
  Priority = max(0.5, beta*Priority + (1 - beta)*rho), rho its WeightedResourcesUsed
  (HierWeightedResourcesUsed for a group when positive). The flow composes
  (beta1*beta2 = beta), so results do not depend on how often records are touched. The floor
  applied only at the end of a stretch equals a floor held continuously, because within a
  stretch rho is constant and Priority moves monotonically from its start (>= 0.5, an
  invariant: setprio is clamped too) toward rho: if rho >= 0.5 the path never dips below 0.5;
  if rho < 0.5 the path, once under 0.5, stays under it, so both give 0.5 from then on.
* `htcondor`: priorities move only at `negotiation.cycle` events, UpdatePriorities-style, from
  the usage at that moment plus the uncharged time of matches that started or ended in between,
  reproducing condor_userprio's numbers. A cycle folded after matches that started later than
  it (a real negotiator's, reported by its ads once its matches ran) leaves them out of its
  update and charges them from after it, as condor_negotiator did.

One clock: every event is folded at its envelope `ts`. Time running backwards (skew between
sources) integrates nothing rather than un-decaying a priority, but a late `job.stopped` (exact
mode) takes back what its records were charged after its time (`_late_stop`), so its interval
is charged where it belongs.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import orjson

from schemas.config import SettingsLike, boolean_word
from schemas.events import (
    AdminCommanded, ConfigChanged, Envelope, JobStarted, JobStopped, NegotiationCycled, Payload,
    PriorityChanged,
)
from streams.core.errors import AccountantConfigError, EventRejectedError
from streams.core.groups import ROOT, ChargePath, GroupTree, is_nice_user, split_submitter
from streams.core.userprio_ops import (
    CANCEL_OPS, LEASE_OPS, MIN_PRIORITY, AdminCommandError, canonical_target, describe_admin,
    is_group_target, number, validate_admin,
)

__all__ = [
    "MIN_PRIORITY", "MIN_PRIORITY_FACTOR", "MODE_KNOB", "AccountantConfig", "AccountantConfigError",
    "AccountantState", "AdminCommandError", "CustomerRecord", "Lease", "ResourceMatch", "apply",
    "close_books", "default_factor", "describe_admin", "fold", "priority_at", "validate_admin", "view",
]

MIN_PRIORITY_FACTOR: Final = 1.0
MODE_KNOB: Final = "POOLLEDGER_ACCOUNTING_MODE"
Mode = Literal["exact", "htcondor"]
_GROUP_FACTOR_PREFIX: Final = "GROUP_PRIO_FACTOR_"


def _to_bool(knob: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = boolean_word(str(value))
    if word is not None:
        return word
    raise AccountantConfigError(f"{knob} must be True or False, not {value!r}")


def _to_float(knob: str, value: Any, positive: bool = True) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise AccountantConfigError(f"{knob} must be a number, not {value!r}") from None
    if not math.isfinite(v) or (positive and v <= 0) or v < 0:
        raise AccountantConfigError(f"{knob} must be a {'positive' if positive else 'non-negative'} "
                                    f"number, not {value!r}")
    return v


_FLOAT_KNOBS: Final[dict[str, str]] = {
    "PRIORITY_HALFLIFE": "priority_halflife", "DEFAULT_PRIO_FACTOR": "default_prio_factor",
    "NICE_USER_PRIO_FACTOR": "nice_user_prio_factor", "REMOTE_PRIO_FACTOR": "remote_prio_factor",
}
#: Every knob the accountant reads (GROUP_PRIO_FACTOR_<group> is a family).
KNOBS: Final = (*_FLOAT_KNOBS, "ACCOUNTANT_LOCAL_DOMAIN", "NEGOTIATOR_USE_SLOT_WEIGHTS",
                "GROUP_NAMES", MODE_KNOB, _GROUP_FACTOR_PREFIX + "<group>")


@dataclass(frozen=True, slots=True)
class AccountantConfig:
    """The knobs the accountant reads, with HTCondor's defaults.

    `group_prio_factors` maps lower-cased group names to GROUP_PRIO_FACTOR_<group>.
    """

    priority_halflife: float = 86400.0
    default_prio_factor: float = 1000.0
    nice_user_prio_factor: float = 1e10
    remote_prio_factor: float = 1e7
    accountant_local_domain: str = ""
    use_slot_weights: bool = True
    group_prio_factors: Mapping[str, float] = field(default_factory=dict)
    mode: Mode = "exact"
    groups: GroupTree = field(default_factory=GroupTree)

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> AccountantConfig:
        """Read every accountant knob from `settings`; unset knobs keep HTCondor's default."""
        cfg = cls()
        for knob in (*_FLOAT_KNOBS, "ACCOUNTANT_LOCAL_DOMAIN", "NEGOTIATOR_USE_SLOT_WEIGHTS",
                     "GROUP_NAMES", MODE_KNOB):
            value = settings.get(knob)
            if value is not None:
                cfg = cfg.with_knob(knob, value)
        for group in cfg.groups.names:
            value = settings.get(_GROUP_FACTOR_PREFIX + group)
            if value is not None:
                cfg = cfg.with_knob(_GROUP_FACTOR_PREFIX + group, value)
        return cfg

    def with_knob(self, name: str, value: Any) -> AccountantConfig:
        """A copy with one knob changed (a `config.changed`); None or "" restores the default.

        Knobs the accountant does not read return `self` unchanged.
        """
        knob = name.strip().upper()
        unset = value is None or (isinstance(value, str) and not value.strip())
        default = AccountantConfig()
        if knob in _FLOAT_KNOBS:
            attr = _FLOAT_KNOBS[knob]
            changes: dict[str, Any] = {attr: getattr(default, attr) if unset else _to_float(knob, value)}
            return replace(self, **changes)
        if knob == "ACCOUNTANT_LOCAL_DOMAIN":
            return replace(self, accountant_local_domain="" if unset else str(value).strip())
        if knob == "NEGOTIATOR_USE_SLOT_WEIGHTS":
            return replace(self, use_slot_weights=True if unset else _to_bool(knob, value))
        if knob == "GROUP_NAMES":
            return replace(self, groups=GroupTree.from_names(None if unset else value))
        if knob == MODE_KNOB:
            mode = "exact" if unset else str(value).strip().lower()
            if mode not in ("exact", "htcondor"):
                raise AccountantConfigError(f"{MODE_KNOB} must be exact or htcondor, not {value!r}")
            return replace(self, mode="exact" if mode == "exact" else "htcondor")
        if knob.startswith(_GROUP_FACTOR_PREFIX):
            group = name.strip()[len(_GROUP_FACTOR_PREFIX):].lower()
            factors = dict(self.group_prio_factors)
            if unset:
                factors.pop(group, None)
            else:
                factors[group] = _to_float(knob, value, positive=False)
            return replace(self, group_prio_factors=factors)
        return self

    def affects_integration(self, knob: str) -> bool:
        """Whether changing `knob` must close the books first (exact mode's stretches)."""
        return knob.strip().upper() in ("PRIORITY_HALFLIFE", MODE_KNOB)


@dataclass(slots=True)
class Lease:
    """A temporary ceiling/floor/factor: the value to restore and when (condor_userprio -duration)."""

    pre_lease_value: float
    expires: float


@dataclass(slots=True)
class CustomerRecord:
    """One `Customer.<name>` record: a submitter or a group (`is_group`)."""

    name: str
    is_group: bool
    priority: float = MIN_PRIORITY
    factor: float = 1000.0
    resources_used: int = 0
    weighted_resources_used: float = 0.0
    hier_weighted_resources_used: float = 0.0
    accumulated_usage: float = 0.0
    weighted_accumulated_usage: float = 0.0
    begin_usage_time: float = 0.0
    last_usage_time: float = 0.0
    last_update_time: float = 0.0
    floor: float = 0.0
    ceiling: float = -1.0
    uncharged_time: float = 0.0
    weighted_uncharged_time: float = 0.0
    leases: dict[str, Lease] = field(default_factory=dict)

    def rho(self) -> float:
        """The usage the priority decays toward: groups use their subtree's usage when positive."""
        if self.is_group and self.hier_weighted_resources_used > 0:
            return self.hier_weighted_resources_used
        return self.weighted_resources_used

    def to_attrs(self) -> dict[str, Any]:
        """The record as HTCondor attributes (the canonical JSON form)."""
        out: dict[str, Any] = {
            "Name": self.name, "IsAccountingGroup": self.is_group,
            "Priority": float(self.priority), "PriorityFactor": float(self.factor),
            "ResourcesUsed": int(self.resources_used),
            "WeightedResourcesUsed": float(self.weighted_resources_used),
            "AccumulatedUsage": float(self.accumulated_usage),
            "WeightedAccumulatedUsage": float(self.weighted_accumulated_usage),
            "BeginUsageTime": float(self.begin_usage_time), "LastUsageTime": float(self.last_usage_time),
            "LastUpdateTime": float(self.last_update_time),
            "Floor": float(self.floor), "Ceiling": float(self.ceiling),
            "UnchargedTime": float(self.uncharged_time),
            "WeightedUnchargedTime": float(self.weighted_uncharged_time),
            "Leases": {k: {"PreLeaseValue": float(v.pre_lease_value), "Expires": float(v.expires)}
                       for k, v in self.leases.items()},
        }
        if self.is_group:
            out["HierWeightedResourcesUsed"] = float(self.hier_weighted_resources_used)
        return out

    @classmethod
    def from_attrs(cls, a: Mapping[str, Any]) -> CustomerRecord:
        return cls(
            name=a["Name"], is_group=bool(a["IsAccountingGroup"]), priority=float(a["Priority"]),
            factor=float(a["PriorityFactor"]), resources_used=int(a["ResourcesUsed"]),
            weighted_resources_used=float(a["WeightedResourcesUsed"]),
            hier_weighted_resources_used=float(a.get("HierWeightedResourcesUsed", 0.0)),
            accumulated_usage=float(a["AccumulatedUsage"]),
            weighted_accumulated_usage=float(a["WeightedAccumulatedUsage"]),
            begin_usage_time=float(a["BeginUsageTime"]), last_usage_time=float(a["LastUsageTime"]),
            last_update_time=float(a["LastUpdateTime"]), floor=float(a["Floor"]),
            ceiling=float(a["Ceiling"]), uncharged_time=float(a["UnchargedTime"]),
            weighted_uncharged_time=float(a["WeightedUnchargedTime"]),
            leases={k: Lease(float(v["PreLeaseValue"]), float(v["Expires"]))
                    for k, v in a.get("Leases", {}).items()},
        )


@dataclass(slots=True)
class ResourceMatch:
    """One `Resource.<slot>` record: who runs there, at what weight, since when.

    `group` is fixed at AddMatch so RemoveMatch reverses exactly what was added even if
    GROUP_NAMES changed meanwhile; `slot_weight` is the weight charged (1.0 without slot weights).
    """

    slot: str
    job_id: str
    submitter: str
    group: str
    slot_weight: float
    start_time: float
    concurrency_limits: str = ""

    def __init__(self, slot: str, job_id: str, submitter: str, group: str, slot_weight: float,
                 start_time: float, concurrency_limits: str = "") -> None:
        # written out: the compiled core compiles this one, while the __init__ @dataclass
        # generates runs interpreted (one per job start)
        self.slot, self.job_id, self.submitter, self.group = slot, job_id, submitter, group
        self.slot_weight, self.start_time = slot_weight, start_time
        self.concurrency_limits = concurrency_limits

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # copy and pickle rebuild through __init__: the compiled class's __new__ runs it
        return ResourceMatch, (self.slot, self.job_id, self.submitter, self.group,
                               self.slot_weight, self.start_time, self.concurrency_limits)

    def to_attrs(self) -> dict[str, Any]:
        return {"RemoteUser": self.submitter, "AccountingGroup": self.group, "JobId": self.job_id,
                "SlotWeight": float(self.slot_weight), "StartTime": float(self.start_time),
                "MatchedConcurrencyLimits": self.concurrency_limits}

    @classmethod
    def from_attrs(cls, slot: str, a: Mapping[str, Any]) -> ResourceMatch:
        return cls(slot, a["JobId"], a["RemoteUser"], a["AccountingGroup"], float(a["SlotWeight"]),
                   float(a["StartTime"]), a.get("MatchedConcurrencyLimits", ""))


@dataclass(slots=True)
class AccountantState:
    """All customer and resource records plus the accountant's LastUpdateTime.

    `last_update_time` starts at the first event folded (the accountant "starts" there) and
    moves at each negotiation cycle; in `htcondor` mode it is the D of UpdatePriorities.
    """

    customers: dict[str, CustomerRecord] = field(default_factory=dict)
    resources: dict[str, ResourceMatch] = field(default_factory=dict)
    last_update_time: float | None = None

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, shortest round-trip floats): runners compare it for equality."""
        doc = {
            "Accountant": {"LastUpdateTime": self.last_update_time},
            "Customers": {n: r.to_attrs() for n, r in self.customers.items()},
            "Resources": {s: m.to_attrs() for s, m in self.resources.items()},
        }
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> AccountantState:
        doc = orjson.loads(text)
        lu = doc["Accountant"]["LastUpdateTime"]
        return cls(
            customers={n: CustomerRecord.from_attrs(a) for n, a in doc["Customers"].items()},
            resources={s: ResourceMatch.from_attrs(s, a) for s, a in doc["Resources"].items()},
            last_update_time=None if lu is None else float(lu),
        )

    def for_cycle(self) -> AccountantState:
        """A copy a `negotiation.cycle` may be folded into, leaving this state as it is: its
        own customer records (leases included); the per-slot match records shared, since a
        cycle only reads them (a preview costs the submitters, not the pool's matches)."""
        return AccountantState({n: replace(r, leases=dict(r.leases))
                                for n, r in self.customers.items()},
                               self.resources, self.last_update_time)

    def records_json(self) -> bytes:
        """`to_json` without its per-slot match records (`matches_json`): a snapshot's
        accountant section, all a priority query reads (thousands of submitters beside
        hundreds of thousands of matches in a large pool)."""
        doc = {"Accountant": {"LastUpdateTime": self.last_update_time},
               "Customers": {n: r.to_attrs() for n, r in self.customers.items()}}
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)

    def matches_json(self) -> bytes:
        """The per-slot match records (`Resources` of `to_json`), a section of their own."""
        return orjson.dumps({s: m.to_attrs() for s, m in self.resources.items()},
                            option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_records_json(cls, raw: bytes) -> AccountantState:
        """The state of `records_json` with no match records yet (`load_matches`)."""
        doc = orjson.loads(raw)
        lu = doc["Accountant"]["LastUpdateTime"]
        return cls(customers={n: CustomerRecord.from_attrs(a) for n, a in doc["Customers"].items()},
                   last_update_time=None if lu is None else float(lu))

    def load_matches(self, raw: bytes) -> None:
        """Install the match records of `matches_json` (as `from_json` restores them)."""
        self.resources = {s: ResourceMatch.from_attrs(s, a) for s, a in orjson.loads(raw).items()}


# --- default priority factor ----------------------------------------------------------------

def default_factor(name: str, cfg: AccountantConfig, is_group: bool = False) -> float:
    """The factor a new record gets, in HTCondor's order.

    nice-user -> NICE_USER_PRIO_FACTOR; GROUP_PRIO_FACTOR_<group> if nonzero; a submitter whose
    domain differs from a set ACCOUNTANT_LOCAL_DOMAIN -> REMOTE_PRIO_FACTOR; else
    DEFAULT_PRIO_FACTOR. Group records have no domain, so the remote rule skips them.
    """
    if is_nice_user(name):
        return max(MIN_PRIORITY_FACTOR, cfg.nice_user_prio_factor)
    group = cfg.groups.canonical(name) if is_group else cfg.groups.group_of(name)
    if group is not None and group != ROOT:
        f = cfg.group_prio_factors.get(group.lower(), 0.0)
        if f:
            return max(MIN_PRIORITY_FACTOR, f)
    if not is_group and cfg.accountant_local_domain:
        if split_submitter(name)[2] != cfg.accountant_local_domain:
            return max(MIN_PRIORITY_FACTOR, cfg.remote_prio_factor)
    return max(MIN_PRIORITY_FACTOR, cfg.default_prio_factor)


def _new_record(name: str, is_group: bool, t: float, cfg: AccountantConfig) -> CustomerRecord:
    return CustomerRecord(name=name, is_group=is_group, factor=default_factor(name, cfg, is_group),
                          last_update_time=t)


# --- integration -----------------------------------------------------------------------------

def _advance(rec: CustomerRecord, t: float, cfg: AccountantConfig) -> None:
    """Exact mode: integrate `rec` over the constant stretch [LastUpdateTime, t]."""
    d = t - rec.last_update_time
    if d <= 0:
        return
    h = cfg.priority_halflife
    beta = 0.5 ** (d / h) if h > 0 else 0.0
    rec.priority = max(MIN_PRIORITY, beta * rec.priority + (1.0 - beta) * rec.rho())
    if rec.resources_used:
        if rec.accumulated_usage == 0:
            rec.begin_usage_time = rec.last_update_time  # usage began when this stretch began
        rec.accumulated_usage += rec.resources_used * d
        rec.last_usage_time = t
    rec.weighted_accumulated_usage += rec.weighted_resources_used * d
    rec.last_update_time = t


def _update_priorities(state: AccountantState, now: float, cfg: AccountantConfig) -> None:
    """htcondor mode: UpdatePriorities at `now` for every record (REFERENCE.md, Accountant)."""
    lu = state.last_update_time if state.last_update_time is not None else now
    d = now - lu
    if d <= 0:
        return
    h = cfg.priority_halflife
    a = 0.5 ** (d / h) if h > 0 else 0.0
    for rec in state.customers.values():
        r = rec.rho() + rec.weighted_uncharged_time / d
        rec.priority = max(MIN_PRIORITY, rec.priority * a + r * (1.0 - a))
        recent = rec.resources_used * d + rec.uncharged_time
        had = rec.accumulated_usage
        rec.accumulated_usage += recent
        rec.weighted_accumulated_usage += rec.weighted_resources_used * d + rec.weighted_uncharged_time
        if had <= 0 < rec.accumulated_usage:
            rec.begin_usage_time = now
        if recent > 0:
            rec.last_usage_time = now
        rec.uncharged_time = 0.0
        rec.weighted_uncharged_time = 0.0
        rec.last_update_time = now
    state.last_update_time = now


def close_books(state: AccountantState, t: float, cfg: AccountantConfig) -> None:
    """Bring every record to `t` under `cfg` (before a knob that changes integration switches)."""
    if cfg.mode == "exact":
        for rec in state.customers.values():
            _advance(rec, t, cfg)
        state.last_update_time = t
    else:
        _update_priorities(state, t, cfg)


# --- the fold ---------------------------------------------------------------------------------

_Snap = tuple[float, float, int, float, float, float]


def _snap(rec: CustomerRecord) -> _Snap:
    """What a `priority.changed` reports, to tell whether an event changed the record."""
    return (rec.priority, rec.factor, rec.resources_used, rec.weighted_resources_used,
            rec.floor, rec.ceiling)


class _Edit:
    """Records touched by one event: fetched (created, integrated) once, diffed at the end."""

    __slots__ = ("state", "t", "lu", "cfg", "before")

    def __init__(self, state: AccountantState, t: float, cfg: AccountantConfig) -> None:
        self.state = state
        self.t = t
        self.lu = state.last_update_time if state.last_update_time is not None else t
        self.cfg = cfg
        self.before: dict[str, _Snap | None] = {}

    def get(self, name: str, is_group: bool = False) -> CustomerRecord:
        rec = self.state.customers.get(name)
        if name not in self.before:
            self.before[name] = None if rec is None else _snap(rec)
            if rec is not None and self.cfg.mode == "exact":
                _advance(rec, self.t, self.cfg)
        elif rec is not None and rec.last_update_time < self.t and self.cfg.mode == "exact":
            _advance(rec, self.t, self.cfg)  # (a record fetched this event is already at t)
        if rec is None:
            rec = self.state.customers[name] = _new_record(name, is_group, self.t, self.cfg)
        return rec

    def derived(self, cause: str) -> list[Payload]:
        out: list[Payload] = []
        for name, old in self.before.items():
            rec = self.state.customers.get(name)
            if rec is None:  # deleted: it reads as a fresh record from now on
                rec = _new_record(name, False, self.t, self.cfg)
            if _snap(rec) == old:
                continue
            out.append(PriorityChanged(  # positional: name, priority, factor, EP, cause, old…
                name, rec.priority, rec.factor, rec.priority * rec.factor, cause,
                None if old is None else old[0], None if old is None else old[1],
                float(rec.resources_used), rec.weighted_resources_used, rec.floor, rec.ceiling,
                None if old is None else old[4], None if old is None else old[5]))
        return out


def _charge_weight(slot_weight: float, cfg: AccountantConfig) -> float:
    if not cfg.use_slot_weights:
        return 1.0
    return slot_weight if math.isfinite(slot_weight) and slot_weight >= 0 else 1.0


def _chain(group: str, cfg: AccountantConfig) -> tuple[str, ...]:
    """The group and its ancestors up to `<none>`; a group GROUP_NAMES dropped stands alone."""
    return cfg.groups.chain(group)


def _remove_match(ed: _Edit, m: ResourceMatch) -> None:
    """RemoveMatch: reverse AddMatch and charge the time since max(StartTime, LastUpdateTime)."""
    del ed.state.resources[m.slot]
    w = m.slot_weight
    lu = ed.lu
    since = ed.t - max(m.start_time, lu)
    for rec in (ed.get(m.submitter), ed.get(m.group, is_group=True)):
        rec.resources_used -= 1
        rec.weighted_resources_used = rec.weighted_resources_used - w if rec.resources_used else 0.0
        if ed.cfg.mode == "htcondor":
            rec.uncharged_time += since
            rec.weighted_uncharged_time += w * since
    for g in _chain(m.group, ed.cfg):
        rec = ed.get(g, is_group=True)
        hier = rec.hier_weighted_resources_used - w
        rec.hier_weighted_resources_used = hier if abs(hier) > 1e-9 else 0.0


def _add_match(ed: _Edit, d: JobStarted) -> None:
    """AddMatch: charge the slot's weight to the submitter, its group and the group's ancestors."""
    old = ed.state.resources.get(d.slot)
    if old is not None:  # a new claim on a busy slot ends the old one first, as HTCondor does
        _remove_match(ed, old)
    w = _charge_weight(d.slot_weight, ed.cfg)
    group = ed.cfg.groups.group_of(d.submitter)
    lu = ed.lu
    for rec in (ed.get(d.submitter), ed.get(group, is_group=True)):
        rec.resources_used += 1
        rec.weighted_resources_used += w
        if ed.cfg.mode == "htcondor":
            rec.uncharged_time -= ed.t - lu
            rec.weighted_uncharged_time -= w * (ed.t - lu)
    for g in _chain(group, ed.cfg):
        ed.get(g, is_group=True).hier_weighted_resources_used += w
    ed.state.resources[d.slot] = ResourceMatch(d.slot, d.job_id, d.submitter, group, w, ed.t,
                                               d.concurrency_limits)


def _recharge(ed: _Edit, m: ResourceMatch, sign: int, since: float) -> None:
    """htcondor mode, a cycle folded after matches that started later than it (a real
    negotiator's cycle, reported by its ads after the schedds' events: services.collector.
    backend): take back (`sign` -1) their AddMatch, charged `since` seconds after the last
    update, or make it again (+1) `since` seconds after this cycle."""
    w = m.slot_weight
    for rec in (ed.get(m.submitter), ed.get(m.group, is_group=True)):
        rec.resources_used += sign
        rec.weighted_resources_used += sign * w
        rec.uncharged_time -= sign * since
        rec.weighted_uncharged_time -= sign * w * since
    for g in _chain(m.group, ed.cfg):
        ed.get(g, is_group=True).hier_weighted_resources_used += sign * w


def _expire_leases(ed: _Edit) -> None:
    """At cycle start every lease whose expiry has come restores its PreLeaseValue."""
    # sorted: the derived events' order must not depend on the dict's history (a restored
    # state iterates in sorted order, a live one in insertion order); only the records with
    # a lease (few: every cycle comes here)
    for name, rec in sorted((n, r) for n, r in ed.state.customers.items() if r.leases):
        due = [k for k, lease in rec.leases.items() if lease.expires <= ed.t]
        if due:
            rec = ed.get(name, rec.is_group)
            for kind in due:
                _set_leased(rec, kind, rec.leases.pop(kind).pre_lease_value)


def _set_leased(rec: CustomerRecord, kind: str, value: float) -> None:
    if kind == "factor":
        rec.factor = max(MIN_PRIORITY_FACTOR, value)
    elif kind == "ceiling":
        rec.ceiling = -1.0 if value < 0 else float(int(value))
    else:
        rec.floor = 0.0 if value < 0 else float(int(value))


def _reset_usage(rec: CustomerRecord, t: float) -> None:
    rec.accumulated_usage = 0.0
    rec.weighted_accumulated_usage = 0.0
    rec.begin_usage_time = t


def _admin(ed: _Edit, d: AdminCommanded) -> None:
    op = d.op
    if op == "resetall":
        for name, rec in sorted(ed.state.customers.items()):
            _reset_usage(ed.get(name, rec.is_group), ed.t)
        return
    name = canonical_target(op, d.target, ed.cfg)
    is_group = is_group_target(op, d.target)
    v = number(d.value)
    if op == "delete":
        if name not in ed.state.customers:
            return
        old = ed.get(name)
        del ed.state.customers[name]
        if old.resources_used or old.hier_weighted_resources_used:
            # Running claims stay charged: the record restarts fresh but keeps its live usage.
            fresh = _new_record(name, old.is_group, ed.t, ed.cfg)
            for attr in ("resources_used", "weighted_resources_used", "hier_weighted_resources_used",
                         "uncharged_time", "weighted_uncharged_time"):
                setattr(fresh, attr, getattr(old, attr))
            ed.state.customers[name] = fresh
        return
    rec = ed.get(name, is_group)
    if op in LEASE_OPS and v is not None:
        kind = LEASE_OPS[op]
        current = rec.factor if kind == "factor" else rec.ceiling if kind == "ceiling" else rec.floor
        rec.leases.pop(kind, None)  # a plain set ends any lease: the admin's value wins
        if d.duration is not None:
            rec.leases[kind] = Lease(current, ed.t + d.duration)
        _set_leased(rec, kind, v)
    elif op in CANCEL_OPS:
        kind = CANCEL_OPS[op]
        _set_leased(rec, kind, rec.leases.pop(kind).pre_lease_value)
    elif op == "setprio" and v is not None:
        rec.priority = max(MIN_PRIORITY, v)
    elif op == "setaccum" and v is not None:
        rec.weighted_accumulated_usage = v
    elif op == "setbegin" and v is not None:
        rec.begin_usage_time = float(int(v))
    elif op == "setlast" and v is not None:
        rec.last_usage_time = float(int(v))
    elif op == "resetusage":
        _reset_usage(rec, ed.t)


def apply(state: AccountantState, env: Envelope, cfg: AccountantConfig) -> list[Payload]:
    """Fold one event into `state` (mutated in place); return its derived `priority.changed`s.

    `cfg` is the configuration in effect before `env`. For a `config.changed`, this closes the
    books when needed and the caller then switches to `cfg.with_knob(...)` (`fold` does both).
    An admin edit that fails validation changes nothing: EventRejectedError. Deduplication of
    event ids is the caller's job.
    """
    d = env.data
    t = env.ts
    if state.last_update_time is None:
        state.last_update_time = t
    kind = type(d)
    if kind not in _HANDLED and not isinstance(d, _HANDLED_TYPES):
        return []
    if kind is JobStarted:
        if cfg.mode == "exact" and d.slot not in state.resources:
            return _start_exact(state, d, t, cfg, env.id)
    elif kind is JobStopped:
        m = state.resources.get(d.slot)
        # A stop for a job other than the slot's current one is stale (its claim already ended).
        if m is None or (d.job_id and m.job_id and d.job_id != m.job_id):
            return []
        if cfg.mode == "exact":
            return _stop_exact(state, m, t, cfg, env.id)
    ed = _Edit(state, t, cfg)
    if isinstance(d, JobStarted):
        _add_match(ed, d)
    elif isinstance(d, JobStopped):
        m = state.resources.get(d.slot)
        if m is None or (d.job_id and m.job_id and d.job_id != m.job_id):
            return []
        _remove_match(ed, m)
    elif isinstance(d, NegotiationCycled):
        _expire_leases(ed)
        if cfg.mode == "htcondor":
            for name, rec in sorted(state.customers.items()):
                ed.before.setdefault(name, _snap(rec))
            # only the late ones are sorted (by slot: the float sums' order is the runners')
            late = [state.resources[s] for s in sorted(
                s for s, m in state.resources.items() if m.start_time > t)] if t > ed.lu else []
            for m in late:  # as if their AddMatch came after this cycle, as it did
                _recharge(ed, m, -1, m.start_time - ed.lu)
            _update_priorities(state, t, cfg)
            for m in late:
                _recharge(ed, m, 1, m.start_time - t)
        state.last_update_time = t
    elif isinstance(d, AdminCommanded):
        try:
            validate_admin(d.op, d.target, d.value, d.duration, state, cfg)
        except AdminCommandError as exc:
            raise EventRejectedError(env.id, f"{d.op} {d.target}: {exc}") from None
        _admin(ed, d)
    elif isinstance(d, ConfigChanged):
        if cfg.affects_integration(d.knob):
            for name, rec in sorted(state.customers.items()):
                ed.before.setdefault(name, _snap(rec))
            close_books(state, t, cfg)
    else:
        return []
    return ed.derived(env.id)


# --- exact mode's hot path: one match starting or ending ------------------------------------
#
# `_add_match` / `_remove_match` through `_Edit`, specialised: the records a match touches come
# from a memo (`GroupTree.charge_path`). Same floats, same events.

_priority_changed: Final = PriorityChanged


def _match_exact(state: AccountantState, path: ChargePath, t: float, w: float, start: bool,
                 cfg: AccountantConfig, cause: str, began: float = 0.0) -> list[Payload]:
    """AddMatch (`start`) or RemoveMatch of weight `w`, a match that `began` then, on the
    records of `path`, exact mode; a RemoveMatch at `t` before a record's LastUpdateTime (a
    late `job.stopped`) first takes back what the record was charged after `t` (`_late_stop`).

    Each record is fetched, snapshotted and integrated (`_advance`, inlined: keep in step) once,
    in `_Edit.get`'s first-touch order; the changes are `_add_match`'s / `_remove_match`'s; the
    `priority.changed`s are `_Edit.derived`'s. The submitter and the group always change
    (ResourcesUsed moves); a record only on the chain changes iff integration moved its priority.
    One pass over the records (`path.steps`): each record's changes touch only that record.
    """
    customers = state.customers
    h = cfg.priority_halflife
    out: list[Payload] = []
    append = out.append
    for name, is_group, direct, chained, always in path.steps:
        rec = customers.get(name)
        if rec is None:
            rec = customers[name] = _new_record(name, is_group, t, cfg)
            fresh = True
            p0 = f0 = 0.0
        else:
            fresh = False
            p0 = p = rec.priority
            f0 = rec.factor
            lu = rec.last_update_time
            if lu < t:  # _advance(rec, t, cfg)
                d = t - lu
                beta = 0.5 ** (d / h) if h > 0 else 0.0
                hier = rec.hier_weighted_resources_used
                rho = hier if rec.is_group and hier > 0 else rec.weighted_resources_used
                p = beta * p + (1.0 - beta) * rho
                rec.priority = p if p > MIN_PRIORITY else MIN_PRIORITY
                used = rec.resources_used
                if used:
                    if rec.accumulated_usage == 0:
                        rec.begin_usage_time = lu
                    rec.accumulated_usage += used * d
                    rec.last_usage_time = t
                rec.weighted_accumulated_usage += rec.weighted_resources_used * d
                rec.last_update_time = t
            elif lu > t and not start:
                _late_stop(rec, lu - (t if t > began else began), w, direct, chained, h)
        if start:
            if direct:  # `direct` is 0, 1 or 2 (the submitter's record is the group's)
                rec.resources_used += 1
                rec.weighted_resources_used += w
                if direct > 1:
                    rec.resources_used += 1
                    rec.weighted_resources_used += w
            if chained:
                rec.hier_weighted_resources_used += w
                for _ in range(chained - 1):
                    rec.hier_weighted_resources_used += w
        else:
            if direct:
                rec.resources_used -= 1
                rec.weighted_resources_used = rec.weighted_resources_used - w if rec.resources_used else 0.0
                if direct > 1:
                    rec.resources_used -= 1
                    rec.weighted_resources_used = (rec.weighted_resources_used - w
                                                   if rec.resources_used else 0.0)
            if chained:
                hier = rec.hier_weighted_resources_used - w
                rec.hier_weighted_resources_used = hier if abs(hier) > 1e-9 else 0.0
                for _ in range(chained - 1):
                    hier = rec.hier_weighted_resources_used - w
                    rec.hier_weighted_resources_used = hier if abs(hier) > 1e-9 else 0.0
        p = rec.priority
        if fresh:
            f = rec.factor
            append(_priority_changed(name, p, f, p * f, cause, None, None,
                                     float(rec.resources_used), rec.weighted_resources_used,
                                     rec.floor, rec.ceiling, None, None))
        elif always or p != p0:
            f = rec.factor
            append(_priority_changed(name, p, f, p * f, cause, p0, f0,
                                     float(rec.resources_used), rec.weighted_resources_used,
                                     rec.floor, rec.ceiling, rec.floor, rec.ceiling))
    return out


def _late_stop(rec: CustomerRecord, span: float, w: float, direct: int, chained: int,
               h: float) -> None:
    """A match of weight `w` that ended `span` seconds before `rec`'s LastUpdateTime (a late
    `job.stopped`): take back what `rec` was charged for it since, as if it had stopped in
    time. The priority's flow is linear in rho, so w held in rho over the last `span` seconds
    added exactly w*(1 - 0.5^(span/h)) to it (the later decay included): subtracted, at the
    floor at most (exact unless the floor held the priority within the span). The
    undecayed totals were charged span and w*span per time the match counts in them."""
    if span <= 0:
        return
    k = chained if rec.is_group and rec.hier_weighted_resources_used > 0 else direct
    if k:
        beta = 0.5 ** (span / h) if h > 0 else 0.0
        p = rec.priority - k * w * (1.0 - beta)
        rec.priority = p if p > MIN_PRIORITY else MIN_PRIORITY
    if direct:
        rec.accumulated_usage -= direct * span
        rec.weighted_accumulated_usage -= direct * w * span


def _start_exact(state: AccountantState, d: JobStarted, t: float, cfg: AccountantConfig,
                 cause: str) -> list[Payload]:
    """`_add_match` on a free slot in exact mode, with its derived events."""
    w = _charge_weight(d.slot_weight, cfg)
    submitter, slot = d.submitter, d.slot  # each read once: attributes of an interpreted class
    group, path = cfg.groups.submitter_path(submitter)
    out = _match_exact(state, path, t, w, True, cfg, cause)
    state.resources[slot] = ResourceMatch(slot, d.job_id, submitter, group, w, t,
                                          d.concurrency_limits)
    return out


def _stop_exact(state: AccountantState, m: ResourceMatch, t: float, cfg: AccountantConfig,
                cause: str) -> list[Payload]:
    """`_remove_match` in exact mode, with its derived events."""
    del state.resources[m.slot]
    return _match_exact(state, cfg.groups.charge_path(m.submitter, m.group), t, m.slot_weight,
                        False, cfg, cause, m.start_time)


def on_started(state: AccountantState, d: JobStarted, t: float, cfg: AccountantConfig,
               cause: str) -> list[Payload]:
    """`apply` for a `job.started` at `t` (the ledger's hot path)."""
    if state.last_update_time is None:
        state.last_update_time = t
    if cfg.mode == "exact" and d.slot not in state.resources:
        return _start_exact(state, d, t, cfg, cause)
    ed = _Edit(state, t, cfg)
    _add_match(ed, d)
    return ed.derived(cause)


def on_stopped(state: AccountantState, d: JobStopped, t: float, cfg: AccountantConfig,
               cause: str) -> list[Payload]:
    """`apply` for a `job.stopped` at `t` (the ledger's hot path)."""
    if state.last_update_time is None:
        state.last_update_time = t
    m = state.resources.get(d.slot)
    # A stop for a job other than the slot's current one is stale (its claim already ended).
    job_id = d.job_id
    if m is None or (job_id and m.job_id and job_id != m.job_id):
        return []
    if cfg.mode == "exact":
        return _stop_exact(state, m, t, cfg, cause)
    ed = _Edit(state, t, cfg)
    _remove_match(ed, m)
    return ed.derived(cause)


_HANDLED_TYPES = (JobStarted, JobStopped, NegotiationCycled, AdminCommanded, ConfigChanged)
_HANDLED = frozenset(_HANDLED_TYPES)


def fold(state: AccountantState, env: Envelope,
         cfg: AccountantConfig) -> tuple[AccountantConfig, list[Payload]]:
    """`apply`, then the configuration in effect after `env` (changed by a `config.changed`)."""
    out = apply(state, env, cfg)
    d = env.data
    if isinstance(d, ConfigChanged):
        try:
            cfg = cfg.with_knob(d.knob, d.value)
        except AccountantConfigError:
            pass  # a bad value reached the log: keep the old config, never stop the pipeline
    return cfg, out


# --- read side -------------------------------------------------------------------------------

def _at(rec: CustomerRecord, now: float, cfg: AccountantConfig) -> CustomerRecord:
    """A copy of `rec` as of `now` (exact mode integrates; htcondor mode shows the last cycle)."""
    copy = replace(rec, leases=dict(rec.leases))
    if cfg.mode == "exact":
        _advance(copy, now, cfg)
    return copy


def priority_at(state: AccountantState, name: str, now: float, cfg: AccountantConfig) -> float:
    """The real priority (RUP) of `name` at `now` without mutating; 0.5 for an unknown name."""
    rec = state.customers.get(name)
    return MIN_PRIORITY if rec is None else _at(rec, now, cfg).priority


def view(state: AccountantState, now: float, cfg: AccountantConfig,
         names: Iterable[str] | None = None, groups: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Every record (or `names`) as HTCondor attributes at `now`, with EffectivePriority.

    Adds AccountingGroup (the submitter's group at `now`'s config) and, while usage runs,
    LastUsageTime = now as condor_userprio shows "<now>". `groups` (configured group names)
    without a record yet are listed as the record the accountant would create for them now,
    as condor_userprio lists every group of GROUP_NAMES.
    """
    out: dict[str, dict[str, Any]] = {}
    wanted = state.customers.keys() if names is None else names
    for name in [*wanted, *(g for g in groups if g not in state.customers)]:
        rec = state.customers.get(name)
        if rec is None:
            if name not in groups:
                continue
            rec = _new_record(name, True, now, cfg)
        cur = _at(rec, now, cfg)
        attrs = cur.to_attrs()
        del attrs["UnchargedTime"], attrs["WeightedUnchargedTime"]
        attrs["EffectivePriority"] = cur.priority * cur.factor
        attrs["AccountingGroup"] = name if rec.is_group else cfg.groups.group_of(name)
        out[name] = attrs
    return out
