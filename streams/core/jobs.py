"""Job demand per submitter, folded from job lifecycle events.

Why: group quotas hand out surplus by demand (HTCondor's `requested` = weighted running +
weighted idle jobs of a group's submitters), and concurrency limits and the negotiator need
to know what is running where. The schedd's submitter ads carry these counts; here they are
derived from `job.submitted` / `job.started` / `job.stopped` / `job.history` instead, so a
replay reproduces them.

Weighting follows NEGOTIATOR_USE_SLOT_WEIGHTS: a running job weighs its slot's SlotWeight
(as charged at `job.started`), an idle job its RequestCpus (default 1); with weights off
every job weighs 1.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.config import Knobs, SettingsLike, knob_bool
from schemas.events import (ConfigChanged, Envelope, JobHistory, JobStarted, JobStopped,
                            JobSubmitted, Payload)
from streams.core.collector import attr_value, is_number
from streams.core.groups import GroupTree

__all__ = [
    "JobsConfig", "JobsState", "SubmitterDemand", "apply", "step", "submitter_demand",
    "group_demand", "group_usage", "find_job", "job_key", "take_changed", "IDLE", "RUNNING",
    "HELD",
]

IDLE: Final = "idle"
RUNNING: Final = "running"
HELD: Final = "held"
_JOB_STATUS_HELD: Final = 5
_LEAVES: Final = frozenset({"completed", "removed"})
_BACK_TO_IDLE: Final = frozenset({"evicted", "preempted", "vacated"})


@dataclass(frozen=True)
class JobsConfig:
    """Whether demand is weighted (NEGOTIATOR_USE_SLOT_WEIGHTS)."""

    use_slot_weights: bool = True
    source: SettingsLike | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike | None) -> JobsConfig:
        return cls(use_slot_weights=knob_bool(settings, "NEGOTIATOR_USE_SLOT_WEIGHTS", True),
                   source=settings)

    def with_overrides(self, overrides: Mapping[str, str]) -> JobsConfig:
        if not overrides:
            return self
        return JobsConfig.from_settings(Knobs(overrides, self.source))


@dataclass(frozen=True, slots=True)
class SubmitterDemand:
    """A submitter's queue as the negotiator sees it (submitter ad counts)."""

    idle: int
    running: int
    held: int
    weighted_idle: float
    weighted_running: float

    @property
    def requested(self) -> float:
        """HGQ demand: weighted running + weighted idle."""
        return self.weighted_running + self.weighted_idle


def job_key(schedd: str, job_id: str) -> str:
    """A job's identity across schedds (like GlobalJobId without the submit time)."""
    return f"{schedd}#{job_id}"


#: a submitter's totals: job counts (int) and weighted sums (float). Typed Any, not float: the
#: compiled core would otherwise store the counts as floats, changing the canonical JSON.
Totals = dict[str, Any]


def _new_totals() -> Totals:
    return {"idle": 0, "running": 0, "held": 0, "idle_cpus": 0.0, "running_weight": 0.0}


_UNIT: Final = 256.0  # demand values that are multiples of 1/256 are summed exactly as integers
_UNIT_INV: Final = 1.0 / _UNIT
_EXACT: Final = 1 << 53


def _units(value: float) -> int | None:
    """`value` in 1/256 units when that is an integer of less than 53 bits, else None."""
    x = value * _UNIT
    if x.is_integer() and -_EXACT < x < _EXACT:
        return int(x)
    return None


class _DemandView:
    """Per-group demand for one (tree, slot weights, weighted) kept up to date incrementally.

    `group_demand` defines a group's demand as its submitters' values summed in name order,
    one float addition at a time. When every value is a multiple of 1/256 and the sum of their
    magnitudes stays below 2**53 units, every partial sum of that loop is exact, so the result
    is the exact sum, which is kept here as an integer and updated in O(1) per change. A group
    with any other value (or too large) is re-summed in name order instead, as before.
    """

    __slots__ = ("tree", "weights", "weighted", "members", "group", "value", "units", "acc",
                 "mag", "odd", "demand", "dirty", "pos")

    def __init__(self, state: JobsState, tree: GroupTree, weights: bool, weighted: bool) -> None:
        self.tree = tree
        self.weights = weights
        self.weighted = weighted
        self.members: dict[str, set[str]] = {}
        self.group: dict[str, str] = {}
        self.value: dict[str, float] = {}
        self.units: dict[str, int | None] = {}
        self.acc: dict[str, int] = {}
        self.mag: dict[str, int] = {}
        self.odd: dict[str, int] = {}
        self.demand: dict[str, float] = {}
        self.dirty: set[str] = set(state.submitters)
        self.pos = state._changes_base + len(state._changes)

    def pull(self, state: JobsState) -> None:
        """Mark dirty the submitters changed since this view last looked (in change order)."""
        changes = state._changes
        start = self.pos - state._changes_base
        if start < len(changes):
            self.dirty.update(changes[start:] if start else changes)  # adds in change order
        self.pos = state._changes_base + len(changes)

    def _value(self, t: Totals) -> float:
        idle, running = int(t["idle"]), int(t["running"])
        if not self.weighted:
            return float(idle + running)
        if self.weights:
            return float(t["running_weight"]) + float(t["idle_cpus"])
        return float(running) + float(idle)

    def _drop(self, name: str, g: str) -> None:
        u = self.units.pop(name)
        del self.value[name]
        if u is None:
            self.odd[g] -= 1
        else:
            self.acc[g] -= u
            self.mag[g] -= abs(u)

    def refresh(self, state: JobsState) -> dict[str, float]:
        self.pull(state)
        if not self.dirty:
            return self.demand
        groups: set[str] = set()
        subs = state.submitters
        for name in self.dirty:
            g = self.group.get(name)
            if g is not None:
                self._drop(name, g)
            t = subs.get(name)
            if t is not None:
                if g is None:
                    g = self.group[name] = self.tree.group_of(name)
                    if g not in self.members:
                        self.members[g] = set()
                        self.acc[g] = self.mag[g] = self.odd[g] = 0
                    self.members[g].add(name)
                v = self.value[name] = self._value(t)
                u = self.units[name] = _units(v)
                if u is None:
                    self.odd[g] += 1
                else:
                    self.acc[g] += u
                    self.mag[g] += abs(u)
                groups.add(g)
            elif g is not None:
                del self.group[name]
                self.members[g].discard(name)
                groups.add(g)
        self.dirty.clear()
        for g in groups:
            names = self.members[g]
            if not names:
                for d in (self.members, self.acc, self.mag, self.odd, self.demand):
                    d.pop(g, None)
            elif self.odd[g] == 0 and self.mag[g] < _EXACT:
                self.demand[g] = float(self.acc[g]) * _UNIT_INV
            else:
                total = 0.0
                for name in sorted(names):
                    total = total + self.value[name]
                self.demand[g] = total
        return self.demand


@dataclass
class JobsState:
    """Jobs in the queues by key, with running totals per submitter."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    submitters: dict[str, Totals] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    # caches, never serialized: incremental group demand, job keys by job id, the weighting
    _views: list[_DemandView] = field(default_factory=list, repr=False, compare=False)
    #: submitters whose totals changed, in order, while any view exists (the views' dirty
    #: sets are filled from it when they refresh: one append per change instead of one set
    #: add per view); `_changes_base` is the position of its first entry in the whole log
    _changes: list[str] = field(default_factory=list, repr=False, compare=False)
    _changes_base: int = field(default=0, repr=False, compare=False)
    _by_id: dict[str, set[str]] | None = field(default=None, repr=False, compare=False)
    _weights: tuple[JobsConfig, dict[str, str], bool] | None = field(
        default=None, repr=False, compare=False)
    #: bumped whenever totals or overrides change: equal revisions mean equal demand
    _rev: int = field(default=0, repr=False, compare=False)
    #: keys of the jobs added, replaced or removed since `_reader` last took them
    #: (`take_changed`); None while no reader follows the queue
    _changed: set[str] | None = field(default=None, repr=False, compare=False)
    _reader: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — runners compare it for equality."""
        obj = {"jobs": self.jobs, "submitters": self.submitters, "overrides": self.overrides}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> JobsState:
        obj = orjson.loads(text)
        return cls(jobs=obj["jobs"], submitters=obj["submitters"], overrides=obj["overrides"])


_CHANGES_MAX: Final = 4096


def _note(state: JobsState, key: str) -> None:
    """Record that the job at `key` changed, for the reader following the queue; a reader
    gone away (more changes kept than jobs queued) stops being followed."""
    changed = state._changed
    if changed is not None:
        changed.add(key)
        if len(changed) > 2 * len(state.jobs) + _CHANGES_MAX:
            state._changed, state._reader = None, None


def take_changed(state: JobsState, reader: object) -> set[str] | None:
    """The keys of the jobs added, replaced or removed since `reader` last called this; None
    when it cannot know (its first call, or another reader took them since): it reads the
    whole queue then. Lets a negotiator keep its idle queues in step with work proportional
    to what changed, not to the queue's length (one reader at a time)."""
    if state._reader is not reader or state._changed is None:
        state._reader, state._changed = reader, set()
        return None
    out = state._changed
    state._changed = set()
    return out


def _flush_changes(state: JobsState) -> None:
    """Hand the change log to every view's dirty set and empty it."""
    for view in state._views:
        view.pull(state)
    state._changes_base += len(state._changes)
    state._changes.clear()


# --- bookkeeping -----------------------------------------------------------------------------

def _tally(tot: Totals, job: dict[str, Any], sign: int) -> bool:
    """Add (+1) or remove (-1) `job` in its submitter's totals `tot`; True when they are
    empty afterwards (the caller drops them)."""
    status: str = job["status"]  # typed: compiled string compares and dict look-ups
    n = tot[status] = tot[status] + sign
    if status == IDLE:
        tot["idle_cpus"] = 0.0 if n == 0 else tot["idle_cpus"] + sign * job["cpus"]
    elif status == RUNNING:
        tot["running_weight"] = 0.0 if n == 0 else tot["running_weight"] + sign * job["weight"]
    return n == 0 and tot["idle"] == 0 and tot["running"] == 0 and tot["held"] == 0


def _totals(state: JobsState, name: str) -> Totals:
    """The submitter's totals (created when missing), noted as changed for the demand views."""
    if state._views:
        changes = state._changes
        changes.append(name)
        if len(changes) >= _CHANGES_MAX:
            _flush_changes(state)
    subs = state.submitters
    tot = subs.get(name)
    if tot is None:
        tot = subs[name] = _new_totals()
    return tot


def _account(state: JobsState, job: dict[str, Any], sign: int) -> None:
    """Add (+1) or remove (-1) a job's contribution to its submitter's totals."""
    state._rev += 1
    name = job["submitter"]
    if _tally(_totals(state, name), job, sign):
        del state.submitters[name]


def _set(state: JobsState, key: str, job: dict[str, Any] | None,
         old: dict[str, Any] | None = None) -> None:
    """Replace the job at `key` (None removes it), keeping the totals in step. `old` is the
    job at `key` when the caller already looked it up."""
    jobs = state.jobs
    if old is None:
        old = jobs.get(key)
    by_id = state._by_id
    _note(state, key)
    if old is not None:
        _account(state, old, -1)
        del jobs[key]
        if by_id is not None and (job is None or job["job_id"] != old["job_id"]):
            keys = by_id[old["job_id"]]
            keys.discard(key)
            if not keys:
                del by_id[old["job_id"]]
        elif job is not None:  # the same key under the same job id: the index stays as it is
            by_id = None
    if job is not None:
        jobs[key] = job
        _account(state, job, +1)
        if by_id is not None:
            by_id.setdefault(job["job_id"], set()).add(key)


def _restate(state: JobsState, key: str, old: dict[str, Any], job: dict[str, Any]) -> None:
    """`_set(state, key, job, old)` for a job that keeps its key, job id and submitter: both
    `_account` calls in one (the job index stays as it is)."""
    state._rev += 2
    _note(state, key)
    name = job["submitter"]
    tot = _totals(state, name)  # once: twice would mark the same submitter dirty again
    subs = state.submitters
    if _tally(tot, old, -1):  # emptied: re-created, as `_account` would (same key order)
        del subs[name]
        tot = subs[name] = _new_totals()
    jobs = state.jobs
    del jobs[key]
    jobs[key] = job
    if _tally(tot, job, 1):
        del subs[name]


def _keys_of(state: JobsState, job_id: str) -> list[str]:
    """The keys of the jobs with this job id, sorted (an index kept beside `jobs`)."""
    if state._by_id is None:
        by_id: dict[str, set[str]] = {}
        for k, j in state.jobs.items():
            by_id.setdefault(j["job_id"], set()).add(k)
        state._by_id = by_id
    return sorted(state._by_id.get(job_id, ()))


_MISSING: Final = object()


def _attr(ad: Mapping[str, Any], attr: str, now: float) -> Any:
    """`attr_value(ad, attr, now)`, answered from the dict when the attribute is there as
    spelled and is not an expression."""
    value = ad.get(attr, _MISSING)
    if value is _MISSING or (type(value) is str and value.startswith("/Expr(")):
        return attr_value(ad, attr, now)
    return value


def _request_cpus(ad: Mapping[str, Any], now: float) -> float:
    value = _attr(ad, "RequestCpus", now)
    t = type(value)
    if t is int or t is float:
        return float(value) if value > 0 else 1.0
    return float(value) if is_number(value) and value > 0 else 1.0


def find_job(state: JobsState, job_id: str, schedd: str = "", slot: str = "") -> str | None:
    """The key of a job; without a schedd (v1 `job.stopped`) the job id (and slot) decide."""
    if schedd:
        key = job_key(schedd, job_id)
        return key if key in state.jobs else None
    found = _keys_of(state, job_id)
    if slot:
        on_slot = [k for k in found if state.jobs[k].get("slot") == slot]
        if on_slot:
            return on_slot[0]
    return found[0] if len(found) == 1 else None


def history_job(ad: dict[str, Any]) -> tuple[str, str]:
    """(job id, schedd) a history ad names: ClusterId.ProcId, else the middle of GlobalJobId
    `schedd#cluster.proc#qdate`, and that GlobalJobId's schedd; '' for what it lacks."""
    gid = ad.get("GlobalJobId")
    cluster, proc = ad.get("ClusterId"), ad.get("ProcId")
    schedd_name = ""
    if type(cluster) is int and type(proc) is int:
        job_id = f"{cluster}.{proc}"
    else:
        job_id = f"{cluster}.{proc}" if is_number(cluster) and is_number(proc) else ""
    if isinstance(gid, str) and gid.count("#") >= 2:
        schedd_name, middle, _ = gid.split("#", 2)
        job_id = job_id or middle
    return job_id, schedd_name


def _history_key(state: JobsState, named: tuple[str, str]) -> str | None:
    """Find the job a history ad closes, given the (job id, schedd) it names
    (`history_job`)."""
    job_id, schedd_name = named
    if not job_id:
        return None
    if schedd_name:
        key = job_key(schedd_name, job_id)
        if key in state.jobs:
            return key
    if state._by_id is None:
        _keys_of(state, job_id)  # builds the index
    assert state._by_id is not None
    if job_id not in state._by_id:
        return None  # no job with this id (the usual case: it left at its stop)
    if schedd_name:
        # the event's schedd may be `schedd@host` while GlobalJobId carries `host`
        for k in _keys_of(state, job_id):
            j = state.jobs[k]
            if j["schedd"].split("@")[-1] == schedd_name.split("@")[-1]:
                return k
    return find_job(state, job_id)


# --- the fold ------------------------------------------------------------------------------

def on_submitted(state: JobsState, data: JobSubmitted, now: float, key: str) -> None:
    """`step` for a `job.submitted` whose job key is `key` (the ledger's hot path; reads two
    attributes of the ad)."""
    schedd, job_id, submitter = data.schedd, data.job_id, data.submitter  # each read once
    old = state.jobs.get(key)
    ad = data.ad
    status = IDLE
    if old is not None and old["status"] == RUNNING:
        status = RUNNING
    else:
        js = ad.get("JobStatus", _MISSING)
        if type(js) is int:
            if js == _JOB_STATUS_HELD:
                status = HELD
        elif _attr(ad, "JobStatus", now) == _JOB_STATUS_HELD:
            status = HELD
    cpus = ad.get("RequestCpus", _MISSING)
    if type(cpus) is int:
        cpus = float(cpus) if cpus > 0 else 1.0
    else:
        cpus = _request_cpus(ad, now)
    if old is None:
        job = {"job_id": job_id, "schedd": schedd, "submitter": submitter,
               "status": status, "cpus": cpus, "weight": 1.0, "slot": None}
    else:
        job = {"job_id": job_id, "schedd": schedd, "submitter": submitter,
               "status": status, "cpus": cpus, "weight": old["weight"], "slot": old["slot"]}
        if old["job_id"] == job_id and old["submitter"] == submitter:
            _restate(state, key, old, job)
            return
    _set(state, key, job, old)


def on_started(state: JobsState, data: JobStarted, key: str) -> None:
    """`step` for a `job.started` whose job key is `key` (the ledger's hot path)."""
    # each attribute read once: the payload is an instance of an interpreted class
    schedd, job_id, submitter, w = data.schedd, data.job_id, data.submitter, data.slot_weight
    old = state.jobs.get(key)
    weight = w if w > 0 else 1.0
    if old is not None:
        cpus = old["cpus"]
    else:
        res: Any = data.resources.get("Cpus")
        cpus = float(res) if is_number(res) and res > 0 else 1.0
    job = {"job_id": job_id, "schedd": schedd, "submitter": submitter,
           "status": RUNNING, "cpus": cpus, "weight": weight, "slot": data.slot}
    if old is not None and old["job_id"] == job_id and old["submitter"] == submitter:
        _restate(state, key, old, job)
    else:
        _set(state, key, job, old)


def on_stopped(state: JobsState, data: JobStopped, key: str) -> None:
    """`step` for a `job.stopped` whose job key, if it names a schedd, is `key` (the
    ledger's hot path)."""
    if data.schedd:
        old = state.jobs.get(key)  # find_job with a schedd
        if old is None:
            return
    else:
        found = find_job(state, data.job_id, "", data.slot)
        if found is None:
            return
        key = found
        old = state.jobs[key]
    reason = data.reason
    if reason in _LEAVES:
        _set(state, key, None, old)
        return
    status = HELD if reason == "held" else IDLE
    _restate(state, key, old, {**old, "status": status, "slot": None})


def on_history(state: JobsState, named: tuple[str, str]) -> None:
    """`step` for a `job.history` ad naming (job id, schedd) `named` (`history_job`; the
    ledger's hot path)."""
    found = _history_key(state, named)
    if found is not None:
        _set(state, found, None)


def step(state: JobsState, env: Envelope, cfg: JobsConfig) -> None:
    """Apply one event."""
    data = env.data
    if isinstance(data, JobSubmitted):
        on_submitted(state, data, env.ts, job_key(data.schedd, data.job_id))
    elif isinstance(data, JobStarted):
        on_started(state, data, job_key(data.schedd, data.job_id))
    elif isinstance(data, JobStopped):
        on_stopped(state, data, job_key(data.schedd, data.job_id))
    elif isinstance(data, JobHistory):
        on_history(state, history_job(data.ad))
    elif isinstance(data, ConfigChanged):
        state.overrides[data.knob.upper()] = data.value
        state._rev += 1


def apply(state: JobsState, env: Envelope, cfg: JobsConfig) -> list[Payload]:
    """The demand fold. It derives no events: quotas and limits read it."""
    step(state, env, cfg)
    return []


# --- queries -------------------------------------------------------------------------------

def submitter_demand(state: JobsState, cfg: JobsConfig) -> dict[str, SubmitterDemand]:
    """Counts per submitter; weighted counts honour NEGOTIATOR_USE_SLOT_WEIGHTS."""
    weights = cfg.with_overrides(state.overrides).use_slot_weights
    out = {}
    for name in sorted(state.submitters):
        t = state.submitters[name]
        idle, running = int(t["idle"]), int(t["running"])
        out[name] = SubmitterDemand(
            idle=idle, running=running, held=int(t["held"]),
            weighted_idle=float(t["idle_cpus"]) if weights else float(idle),
            weighted_running=float(t["running_weight"]) if weights else float(running))
    return out


def _use_weights(state: JobsState, cfg: JobsConfig) -> bool:
    """`cfg.with_overrides(state.overrides).use_slot_weights`, cached."""
    w = state._weights
    if w is None or w[0] is not cfg or w[1] != state.overrides:
        w = state._weights = (cfg, dict(state.overrides),
                              cfg.with_overrides(state.overrides).use_slot_weights)
    return w[2]


def group_demand(state: JobsState, tree: GroupTree, cfg: JobsConfig, *,
                 weighted: bool = True) -> dict[str, float]:
    """HGQ `requested` per group (own submitters only): running + idle, weighted or counted.

    Kept incrementally (see `_DemandView`); equal to summing `submitter_demand` in name order.
    """
    weights = _use_weights(state, cfg)
    for view in state._views:
        if view.tree is tree and view.weights == weights and view.weighted == weighted:
            break
    else:
        view = _DemandView(state, tree, weights, weighted)
        state._views.append(view)
        if len(state._views) > 4:
            del state._views[0]
    return dict(view.refresh(state))


def group_usage(state: JobsState, tree: GroupTree, cfg: JobsConfig) -> dict[str, float]:
    """Weighted resources in use per group (own submitters), for GROUP_SORT_EXPR."""
    out: dict[str, float] = {}
    for name, d in submitter_demand(state, cfg).items():
        g = tree.group_of(name)
        out[g] = out.get(g, 0.0) + d.weighted_running
    return out
