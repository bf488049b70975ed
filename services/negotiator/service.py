"""The negotiator service: one negotiation cycle fed from the ledger's materialized state.

Why a separate module: the matchmaker (`matchmaker.negotiate`) is a pure function of a
`CycleInput`; this module is the only place that knows where those inputs live in the
folds, so the matchmaker never depends on fold internals and a replay of the log can
rebuild the exact same snapshot at the cycle's event time.

Inputs, all from the log's folds through the ledger's read API (`streams.core.ledger`):
- slot ads: the collector fold (`ledger.current_ads("Machine")`);
- idle jobs: the demand fold (`ledger.job_records()`, which jobs are idle) joined with the
  job-ad fold (`ledger.job_ad(key)`: the ads the matchmaker needs, Requirements, Rank,
  Request*, JobPrio, ConcurrencyLimits, QDate, ...), each ad's queue order and merge
  signature computed once (`JobAds`);
- priorities: the accountant as it will be once this cycle's `negotiation.cycle` event is
  folded (`ledger.priorities_at_cycle`), as HTCondor updates priorities at the start of
  each cycle;
- groups: effective quotas and GROUP_SORT_EXPR order (`ledger.cycle_groups`);
- concurrency limits: maxima, default and usage (`ledger.limit_inputs`).

`run_cycle` returns the `match` payloads and one `negotiation.cycle` payload whose
`rejections` say, per autocluster, why its jobs did not match, with their ids (bounded), and
whose `submitters` say why jobs that were never tried were left alone, so `poolledger why`
answers from the log alone.
"""
from __future__ import annotations

import hashlib
import math
import time
from bisect import bisect_left, insort

import orjson
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from schemas.classads import ad_at_time, at_time
from schemas.config import DEFAULT_SOURCE, SettingsLike
from schemas.events import Matched, NegotiationCycled, Payload
from services.negotiator.autocluster import prio_key, referenced_names
from services.negotiator.matchmaker import negotiate
from services.negotiator.model import (CycleInput, CycleResult, GroupInput,
                                       NegotiatorConfig, SubmitterInput)
from streams.core.jobs import IDLE, RUNNING
from streams.core.ledger import Ledger

__all__ = [
    "DEFAULT_NEGOTIATOR", "JobAds", "Offer", "PER_JOB_ATTRS", "negotiator_config", "snapshot", "run_cycle",
    "cycle_payloads", "MAX_REJECTION_ENTRIES", "MAX_JOBS_PER_ENTRY", "NOT_CONSIDERED",
]

DEFAULT_NEGOTIATOR = "negotiator"
#: NegotiatorConfig fields holding ClassAd expressions (their time() reads the cycle's now)
_CONFIG_EXPRS = ("negotiator_pre_job_rank", "negotiator_post_job_rank", "preemption_requirements",
                 "preemption_rank", "negotiator_slot_constraint")
#: Bounds on the `negotiation.cycle` event: autocluster entries, and job ids listed per entry
#: (`count` always holds the full number).
MAX_REJECTION_ENTRIES = 500
MAX_JOBS_PER_ENTRY = 200
#: Why idle jobs that the cycle never tried stayed idle (per submitter, in `submitters`).
NOT_CONSIDERED = ("submitter limit exceeded", "no free slots left")
_EPS = 1e-6
_ATTR_TEXT_MAX = 200

#: Knobs NegotiatorConfig reads (condor_config names).
_NEGOTIATOR_KNOBS = (
    "NEGOTIATOR_PRE_JOB_RANK", "NEGOTIATOR_POST_JOB_RANK", "PREEMPTION_REQUIREMENTS",
    "PREEMPTION_RANK", "NEGOTIATOR_CONSIDER_PREEMPTION", "NEGOTIATOR_SLOT_CONSTRAINT",
    "NEGOTIATE_ALL_JOBS_IN_CLUSTER", "SIGNIFICANT_ATTRIBUTES", "NEGOTIATOR_STRICT_ENFORCE_QUOTA",
    "NEGOTIATOR_USE_SLOT_WEIGHTS", "GROUP_QUOTA_MAX_ALLOCATION_ROUNDS",
    "NEGOTIATOR_MAX_TIME_PER_SUBMITTER", "NEGOTIATOR_MAX_TIME_PER_SCHEDD",
    "NEGOTIATOR_MAX_TIME_PER_CYCLE", "NEGOTIATOR_MAX_TIME_PER_PIESPIN", "ALLOW_PSLOT_PREEMPTION",
    "NEGOTIATOR_WORKERS", "GROUP_QUOTA_ROUND_ROBIN_RATE", "HFS_ROUND_ROBIN_RATE",
    "HFS_MAX_ALLOCATION_ROUNDS",
)


# --- job ads -----------------------------------------------------------------------------------

#: Per-job bookkeeping attributes that never decide a match unless an expression names them:
#: jobs equal in everything else are interchangeable for the matchmaker (HTCondor's schedd
#: sends one resource request per autocluster for the same reason).
PER_JOB_ATTRS = frozenset({"ClusterId", "ProcId", "GlobalJobId", "QDate", "EnteredCurrentStatus",
                           "Out", "Err", "Args"})
_PER_JOB_LOWER = frozenset(a.lower() for a in PER_JOB_ATTRS)
_PRIO_ATTRS = ("PreJobPrio1", "PreJobPrio2", "JobPrio", "PostJobPrio1", "PostJobPrio2", "QDate",
               "ClusterId", "ProcId")


@dataclass(frozen=True, slots=True)
class _JobInfo:
    """What the snapshot needs per job, computed once when the ad is folded."""

    ad: dict[str, Any]
    order: tuple[Any, ...]  # the schedd's queue order (as the matchmaker sorts)
    sig: bytes | None  # equal for interchangeable jobs; None: never merged
    timed: bool  # an expression mentions time() (`ad_at_time` binds it to the cycle's now)


def _expr_facts(ad: Mapping[str, Any], own: bool) -> tuple[set[str], bool]:
    """Names the ad's expressions read from their own ad (`own`) or from the other ad, and
    whether one mentions time (`ad_at_time` may rewrite the ad): one pass, each expression's
    answers worked out once per text."""
    names: set[str] = set()
    timed = False
    for v in ad.values():
        if isinstance(v, str) and v.startswith("/Expr("):
            found = _REFS.get(v)
            if found is None:
                if len(_REFS) > 4096:
                    _REFS.clear()
                mine, other = referenced_names(v[6:-2]) if v.endswith(")/") else (set(), set())
                found = _REFS[v] = (mine, other, "time" in v.lower())
            names |= found[0] if own else found[1]
            timed = timed or found[2]
    return names, timed


_REFS: dict[str, tuple[set[str], set[str], bool]] = {}


def _job_info(ad: dict[str, Any]) -> _JobInfo:
    order = (str(ad.get("ScheddName", "")),
             prio_key({a.lower(): ad[a] for a in _PRIO_ATTRS if a in ad}))
    refs, timed = _expr_facts(ad, own=True)
    if refs & _PER_JOB_LOWER:
        return _JobInfo(ad, order, None, timed)
    rest = {k: v for k, v in ad.items() if k not in PER_JOB_ATTRS}
    # a digest, not the text: an idle job keeps its signature while it waits (thousands of
    # them, each about a kilobyte of ad)
    sig = hashlib.blake2b(orjson.dumps(rest, option=orjson.OPT_SORT_KEYS), digest_size=16)
    return _JobInfo(ad, order, sig.digest(), timed)


#: an idle job in its submitter's queue: (queue order, job key), how the matchmaker sorts
_Entry = tuple[tuple[Any, ...], str]


class JobAds:
    """The idle jobs a negotiator offers, by submitter and merge signature in queue order,
    kept in step with the ledger's queue: each cycle re-reads only the jobs that changed
    since the last (`Ledger.changed_jobs`), so a cycle costs what changed and what it offers,
    not the length of the queues. Per idle job, what the matchmaker needs of its ad
    (`Ledger.job_ad`, the core's job-ad fold) is computed once: the ad with `ScheddName` (the
    schedd daemon name, so matches name the schedd exactly as the job events do), its queue
    order and merge signature. `with_ads` False offers only what the demand fold knows of a
    job (RequestCpus, ids)."""

    def __init__(self, *, with_ads: bool = True) -> None:
        self.with_ads = with_ads
        #: idle job key -> (info, submitter, entry)
        self._idle: dict[str, tuple[_JobInfo, str, _Entry]] = {}
        #: submitter -> signature (None: never merged) -> its idle entries, sorted
        self.queues: dict[str, dict[bytes | None, list[_Entry]]] = {}
        #: running job key -> its schedd's host; running jobs per schedd host
        self._running: dict[str, str] = {}
        self.running: Counter[str] = Counter()
        #: slot name -> (its ad as folded, names its expressions read of the job, timed)
        self._slots: dict[str, tuple[Mapping[str, Any], set[str], bool]] = {}

    def slots(self, ledger: Ledger, now: float) -> tuple[list[dict[str, Any]], set[str]]:
        """The current slot ads, time() read as `now`, and every name their expressions read
        of a job; what each ad references is worked out once per ad the collector folded."""
        known = self._slots
        fresh: dict[str, tuple[Mapping[str, Any], set[str], bool]] = {}
        ads: list[dict[str, Any]] = []
        names: set[str] = set()
        for name, ad in ledger.current_ads("Machine"):
            hit = known.get(name)
            if hit is None or hit[0] is not ad:
                hit = (ad, *_expr_facts(ad, own=False))
            fresh[name] = hit
            ads.append(ad_at_time(ad, now) if hit[2] else ad)
            names |= hit[1]
        self._slots = fresh
        return ads, names

    def update(self, ledger: Ledger) -> None:
        """Bring the queues up to the ledger's: the changed jobs, or all after a restore or
        when another reader followed the ledger in between."""
        changed = ledger.changed_jobs(self)
        if changed is None:
            self._idle.clear()
            self.queues.clear()
            self._running.clear()
            self.running.clear()
            for key, job in ledger.job_records():
                self._add(ledger, key, job, bulk=True)
            for sigs in self.queues.values():
                for entries in sigs.values():
                    entries.sort()
            return
        for key in changed:
            self._remove(key)
            now = ledger.job_record(key)
            if now is not None:
                self._add(ledger, key, now, bulk=False)

    def _remove(self, key: str) -> None:
        known = self._idle.pop(key, None)
        if known is not None:
            info, sub, entry = known
            sigs = self.queues[sub]
            entries = sigs[info.sig]
            del entries[bisect_left(entries, entry)]
            if not entries:
                del sigs[info.sig]
                if not sigs:
                    del self.queues[sub]
            return
        host = self._running.pop(key, None)
        if host is not None:
            self.running[host] -= 1
            if not self.running[host]:
                del self.running[host]

    def _add(self, ledger: Ledger, key: str, job: Mapping[str, Any], *, bulk: bool) -> None:
        status = job["status"]
        if status == RUNNING:
            host = self._running[key] = str(job["schedd"]).rpartition("@")[2]
            self.running[host] += 1
            return
        if status != IDLE:
            return
        found = ledger.job_ad(key) if self.with_ads else None
        if found is None:
            info = _JobInfo(_minimal_ad(job), (str(job["schedd"]), prio_key({})), None, False)
        else:
            schedd, ad = found
            info = _job_info({**ad, "ScheddName": schedd})
        entry = (info.order, key)
        sub = job["submitter"]
        self._idle[key] = (info, sub, entry)
        entries = self.queues.setdefault(sub, {}).setdefault(info.sig, [])
        if bulk:
            entries.append(entry)
        else:
            insort(entries, entry)

    def info(self, key: str) -> _JobInfo:
        """The info of an idle job of the queues."""
        return self._idle[key][0]


def _minimal_ad(job: Mapping[str, Any]) -> dict[str, Any]:
    """What the demand fold alone tells about a job whose ad was never seen."""
    cluster, _, proc = str(job["job_id"]).partition(".")
    ad: dict[str, Any] = {"MyType": "Job", "RequestCpus": job.get("cpus", 1.0),
                          "ScheddName": job["schedd"]}
    if cluster.isdigit() and proc.isdigit():
        ad["ClusterId"], ad["ProcId"] = int(cluster), int(proc)
    return ad


# --- configuration -----------------------------------------------------------------------------

def _knob_text(settings: SettingsLike, name: str) -> str | None:
    """A knob as condor_config text (None when unset or empty)."""
    text_of = getattr(settings, "text", None)
    if text_of is not None:
        try:
            text = str(text_of(name))
        except KeyError:
            return None
        return text if text.strip() else None
    value = settings.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value) or None
    return str(value) or None


def at_cycle_time(cfg: NegotiatorConfig, now: float) -> NegotiatorConfig:
    """`cfg` with time() in its expressions read as the cycle's `now`."""
    bound: dict[str, Any] = {name: at_time(text, now) for name in _CONFIG_EXPRS
             if (text := getattr(cfg, name)) is not None and at_time(text, now) != text}
    return replace(cfg, **bound) if bound else cfg


def negotiator_config(settings: SettingsLike) -> NegotiatorConfig:
    """NegotiatorConfig from the knobs in force (config files plus `config.changed`)."""
    knobs = {k: t for k in _NEGOTIATOR_KNOBS if (t := _knob_text(settings, k)) is not None}
    source_of = getattr(settings, "source", None)
    if source_of is not None and source_of("GROUP_QUOTA_MAX_ALLOCATION_ROUNDS") == DEFAULT_SOURCE:
        # unset: HTCondor's older spelling HFS_MAX_ALLOCATION_ROUNDS, if set, is read instead
        knobs.pop("GROUP_QUOTA_MAX_ALLOCATION_ROUNDS", None)
    return NegotiatorConfig.from_knobs(knobs)


# --- the snapshot ------------------------------------------------------------------------------

def _submitters(ledger: Ledger, now: float, idle: Mapping[str, list[dict[str, Any]]]
                ) -> list[SubmitterInput]:
    """Every submitter with idle jobs or running claims, as the accountant sees it."""
    prios = ledger.priorities_at_cycle(now)
    names = set(idle)
    names |= {n for n, r in prios.items() if not r["IsAccountingGroup"]
              and float(r["WeightedResourcesUsed"]) > 0}
    out = []
    for name in sorted(names):
        rec = prios.get(name)
        schedd = str(idle[name][0].get("ScheddName", "")) if idle.get(name) else ""
        if rec is None:
            new = ledger.new_submitter(name)
            out.append(SubmitterInput(name=name, eup=new.eup, group=new.group,
                                      priority_factor=new.factor, schedd=schedd))
            continue
        out.append(SubmitterInput(
            name=name, eup=float(rec["EffectivePriority"]),
            weighted_usage=float(rec["WeightedResourcesUsed"]), group=str(rec["AccountingGroup"]),
            floor=float(rec["Floor"]), ceiling=float(rec["Ceiling"]),
            priority_factor=float(rec["PriorityFactor"]), schedd=schedd))
    return out


def _groups(ledger: Ledger, subs: list[SubmitterInput], size: float, now: float
            ) -> tuple[list[GroupInput], list[str]]:
    """Group inputs and GROUP_SORT_EXPR order (at the cycle's `now`); none at all when
    GROUP_NAMES is empty."""
    usage: dict[str, float] = {}
    for s in subs:
        usage[s.group] = usage.get(s.group, 0.0) + s.weighted_usage
    cycle = ledger.cycle_groups(size, usage, now)
    if cycle is None:
        return [], []
    groups = [GroupInput(name=g.name, quota=g.quota, usage=usage.get(g.name, 0.0),
                         autoregroup=g.autoregroup, accept_surplus=g.accept_surplus)
              for g in cycle.groups]
    return groups, list(cycle.order)


@dataclass
class Offer:
    """Which idle jobs a snapshot offered, and which it held back as interchangeable.

    A submitter cannot match more jobs in one cycle than the pool has slots (a partitionable
    slot counting once per core), so of jobs with the same signature only that many, in queue
    order, are offered. The rest (`held`, by submitter and signature, as queue entries in
    queue order) share the fate of their offered twins: a rejection extends to them, so `why`
    and the statistics stay exact.
    """

    sig_of: dict[str, bytes] = field(default_factory=dict)
    held: dict[tuple[str, bytes], list[_Entry]] = field(default_factory=dict)
    offered: dict[str, int] = field(default_factory=dict)


def _capacity(slots: list[dict[str, Any]]) -> int:
    """How many matches the pool can take in one cycle, at most."""
    total = 0
    for ad in slots:
        cpus = ad.get("Cpus")
        if ad.get("PartitionableSlot") is True and isinstance(cpus, (int, float)):
            total += max(1, int(cpus))
        else:
            total += 1
    return total


def _mergeable(slot_refs: set[str], cfg: NegotiatorConfig) -> bool:
    """Whether no slot expression (`slot_refs`: the names they read of the job) or
    negotiator rank reads a per-job attribute."""
    names = set(slot_refs)
    for text in (cfg.negotiator_pre_job_rank, cfg.negotiator_post_job_rank,
                 cfg.preemption_requirements, cfg.preemption_rank,
                 cfg.negotiator_slot_constraint or ""):
        names |= referenced_names(text)[1]
    return not names & _PER_JOB_LOWER


def _snapshot(ledger: Ledger, now: float, cycle: int, job_ads: JobAds | None,
              cfg: NegotiatorConfig) -> tuple[CycleInput, Offer]:
    # time() in an ad reads the cycle's `now`, never the wall clock (schemas.classads.at_time)
    queues = job_ads if job_ads is not None else JobAds(with_ads=False)
    slots, slot_refs = queues.slots(ledger, now)
    queues.update(ledger)
    room = _schedd_max_running(ledger)
    for host, n in queues.running.items():
        if host in room:
            room[host] -= n
    offer = Offer()
    cap = _capacity(slots) if _mergeable(slot_refs, cfg) else 0
    idle: dict[str, list[dict[str, Any]]] = {}
    for sub in sorted(queues.queues):
        offered: list[_Entry] = []
        count = 0
        for sig, entries in queues.queues[sub].items():
            count += len(entries)
            if sig is None or cap <= 0:
                offered += entries
                continue
            first = entries[:cap]
            offered += first
            for _order, key in first:
                offer.sig_of[key] = sig
            if len(entries) > cap:
                offer.held[(sub, sig)] = entries[cap:]
        offered.sort()
        offer.offered[sub] = count
        kept: list[dict[str, Any]] = []
        for _order, key in offered:
            info = queues.info(key)
            kept.append(ad_at_time(info.ad, now) if info.timed else info.ad)
        idle[sub] = kept
    subs = _submitters(ledger, now, idle)
    size = ledger.pool_size()
    groups, order = _groups(ledger, subs, size, now)
    limits = ledger.limit_inputs()
    snap = CycleInput(
        now=float(now), cycle=cycle, submitters=subs, slots=slots, jobs=idle, groups=groups,
        group_order=order, limit_max=limits.max_for, limit_default=limits.default,
        limit_usage=limits.usage, schedd_room={h: max(0, n) for h, n in room.items()})
    return snap, offer


def _schedd_max_running(ledger: Ledger) -> dict[str, int]:
    """MaxJobsRunning of each schedd's Scheduler ad, by host (the ads' Name)."""
    out: dict[str, int] = {}
    for name, ad in ledger.current_ads("Scheduler"):
        mx = ad.get("MaxJobsRunning")
        if isinstance(mx, (int, float)) and not isinstance(mx, bool) and math.isfinite(mx):
            out[str(ad.get("Name", name)).rpartition("@")[2]] = int(mx)
    return out


def snapshot(ledger: Ledger, now: float, cycle: int, positions: Mapping[str, Any] | None = None,
             job_ads: JobAds | None = None, cfg: NegotiatorConfig | None = None) -> CycleInput:
    """The cycle's consistent view of the ledger at event time `now`.

    `positions` (the log positions the ledger has folded) is not part of the input but is
    what makes the snapshot reproducible; it goes into the cycle event. Without `job_ads`
    idle jobs are offered with only what the demand fold knows (RequestCpus, ids).
    """
    del positions
    conf = cfg if cfg is not None else negotiator_config(ledger.settings)
    return _snapshot(ledger, now, cycle, job_ads, conf)[0]


# --- the cycle's events --------------------------------------------------------------------------

def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _ATTR_TEXT_MAX:
        return value[:_ATTR_TEXT_MAX - 3] + "..."
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _top_reason(reasons: Mapping[str, int]) -> str:
    """The reason reported for an autocluster: the one most of its jobs got."""
    return sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _rejections(result: CycleResult, offer: Offer) -> tuple[dict[str, Any], Counter[str]]:
    """Per autocluster `submitter#id`: reason, reasons, count, job keys (bounded), attributes;
    and per submitter how many held-back jobs were rejected with their offered twins."""
    out: dict[str, Any] = {}
    extra: Counter[str] = Counter()
    for r in result.rejections:
        jobs = list(r.jobs)
        reasons = dict(r.reasons)
        top = _top_reason(reasons)
        for sig in dict.fromkeys(offer.sig_of[k] for k in r.jobs if k in offer.sig_of):
            twins = offer.held.pop((r.submitter, sig), [])
            jobs += [k for _order, k in twins[:max(0, MAX_JOBS_PER_ENTRY - len(jobs))]]
            reasons[top] = reasons.get(top, 0) + len(twins)
            extra[r.submitter] += len(twins)
        if len(out) >= MAX_REJECTION_ENTRIES:
            continue
        out[f"{r.submitter}#{r.autocluster}"] = {
            "submitter": r.submitter, "autocluster": r.autocluster,
            "reason": top, "reasons": dict(sorted(reasons.items())),
            "count": sum(reasons.values()), "jobs": jobs[:MAX_JOBS_PER_ENTRY],
            "attributes": {k: _short(v) for k, v in sorted(r.attributes.items())},
        }
    if len(result.rejections) > MAX_REJECTION_ENTRIES:
        out["_truncated"] = {"autoclusters": len(result.rejections) - MAX_REJECTION_ENTRIES}
    return out, extra


def _submitter_stats(snap: CycleInput, result: CycleResult, offer: Offer,
                     extra: Mapping[str, int]) -> dict[str, Any]:
    """condor_negotiator's per-submitter numbers plus why untried jobs stayed idle."""
    out: dict[str, Any] = {}
    for s in snap.submitters:
        st = result.submitters.get(s.name)
        if st is None:
            continue
        offered = offer.offered.get(s.name, len(snap.jobs.get(s.name, ())))
        rejected = st.rejections + extra.get(s.name, 0)
        untried = max(0, offered - st.matches - rejected)
        doc: dict[str, Any] = {
            "matches": st.matches, "weight": st.weight, "rejections": rejected,
            "limit": st.limit, "usage": st.usage_end, "idle": offered, "eup": s.eup,
            "group": s.group, "not_considered": untried}
        if st.time_limit is not None:
            doc["time_limit"] = st.time_limit
        if untried:
            limited = st.weight + _EPS >= st.limit or (
                s.ceiling >= 0 and st.usage_end + _EPS >= s.ceiling)
            doc["stopped"] = st.time_limit or (NOT_CONSIDERED[0] if limited else NOT_CONSIDERED[1])
        out[s.name] = doc
    return out


def cycle_payloads(snap: CycleInput, result: CycleResult, negotiator: str,
                   positions: Mapping[str, Any] | None, duration: float,
                   offer: Offer | None = None) -> list[Payload]:
    """The `match` payloads (a carved dynamic slot is matched as its partitionable slot, which
    the startd carves itself) followed by one `negotiation.cycle`."""
    offer = offer if offer is not None else Offer()
    out: list[Payload] = []
    for m in result.matches:
        out.append(Matched(negotiator=negotiator, cycle=result.cycle, job_id=m.job_id,
                           schedd=m.schedd, submitter=m.submitter, group=m.group,
                           slot=m.pslot or m.slot, reason=m.reason,  # type: ignore[arg-type]
                           preempts=m.preempts))
    rejections, extra = _rejections(result, offer)
    if result.time_limits:
        # only when a NEGOTIATOR_MAX_TIME_PER_* limit was reached (wall-clock dependent)
        rejections["_time_limits"] = dict(result.time_limits)
    out.append(NegotiationCycled(
        negotiator=negotiator, cycle=result.cycle, now=result.now,
        positions=dict(positions or {}), submitters=_submitter_stats(snap, result, offer, extra),
        duration=duration, matches=len(result.matches), rejections=rejections))
    return out


def run_cycle(ledger: Ledger, cfg: NegotiatorConfig | None, now: float, cycle: int,
              positions: Mapping[str, Any] | None = None, *, job_ads: JobAds | None = None,
              negotiator: str = DEFAULT_NEGOTIATOR,
              clock: Callable[[], float] | None = time.perf_counter) -> list[Payload]:
    """One negotiation cycle at event time `now`: the `match` payloads, then the
    `negotiation.cycle` payload.

    `cfg` None reads the negotiator knobs from the ledger's settings (so `config.changed`
    events apply). `clock` times the cycle for the event's `duration` statistic and drives
    the NEGOTIATOR_MAX_TIME_PER_* limits in the matchmaker; None records 0.0 and never reaches
    a time limit, so that a run's log is byte-for-byte reproducible. A reached limit shows in
    the `negotiation.cycle` payload only when it happens: `rejections["_time_limits"]`
    (`cycle_time_limit_reached`, `submitters`, `schedds`, `piespins`), per-submitter
    `time_limit`/`stopped`, and rejection reasons "submitter time limit exceeded" /
    "schedd time limit exceeded" on the jobs left.
    """
    t0 = clock() if clock is not None else 0.0
    conf = at_cycle_time(cfg if cfg is not None else negotiator_config(ledger.settings), now)
    snap, offer = _snapshot(ledger, now, cycle, job_ads, conf)
    result = negotiate(snap, conf, clock)
    duration = (clock() - t0) if clock is not None else 0.0
    return cycle_payloads(snap, result, negotiator, positions, round(duration, 6), offer)
