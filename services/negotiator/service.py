"""The negotiator service: one negotiation cycle fed from the ledger's materialized state.

Why a separate module: the matchmaker (`matchmaker.negotiate`) is a pure function of a
`CycleInput`; this module is the only place that knows where those inputs live in the
folds, so the matchmaker never depends on fold internals and a replay of the log can
rebuild the exact same snapshot at the cycle's event time.

Inputs, all from the log's folds:
- slot ads: the collector fold (`ledger.pool`, current non-absent Machine ads);
- idle jobs: the demand fold (`ledger.jobs`, which jobs are idle) joined with `JobAds`, the
  job ads from `job.submitted` (the demand fold keeps only counts, not the ads the
  matchmaker needs: Requirements, Rank, Request*, JobPrio, ConcurrencyLimits, QDate, ...);
- priorities: the accountant as it will be once this cycle's `negotiation.cycle` event is
  folded (leases expired, and in `htcondor` mode UpdatePriorities at `now`), as HTCondor
  updates priorities at the start of each cycle;
- groups: effective quotas and GROUP_SORT_EXPR order from the quota fold;
- concurrency limits: maxima from the limit config, usage from the limit fold.

`run_cycle` returns the `match` payloads and one `negotiation.cycle` payload whose
`rejections` say, per autocluster, why its jobs did not match, with their ids (bounded), and
whose `submitters` say why jobs that were never tried were left alone, so `poolledger why`
answers from the log alone.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.events import (Envelope, JobHistory, JobStopped, JobSubmitted, Matched,
                            NegotiationCycled, Payload)
from services.negotiator.matchmaker import negotiate
from services.negotiator.model import (CycleInput, CycleResult, GroupInput,
                                       NegotiatorConfig, SubmitterInput)
from streams.core import accountant, quotas
from streams.core.jobs import IDLE, job_key
from streams.core.ledger import Ledger
from streams.core.pool import current_ads, pool_size

__all__ = [
    "DEFAULT_NEGOTIATOR", "JobAds", "negotiator_config", "snapshot", "run_cycle",
    "cycle_payloads", "MAX_REJECTION_ENTRIES", "MAX_JOBS_PER_ENTRY", "NOT_CONSIDERED",
]

DEFAULT_NEGOTIATOR = "negotiator"
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
)


# --- job ads -----------------------------------------------------------------------------------

@dataclass
class JobAds:
    """Job ClassAds by job key (`schedd#cluster.proc`), folded from `job.submitted`.

    The ledger's demand fold keeps a job's status and weight but not its ad; the matchmaker
    needs the ad. Each stored ad carries `ScheddName` (the schedd daemon name) so matches
    name the schedd exactly as the job events do. Ads of jobs that left the queue are dropped.
    """

    ads: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, env: Envelope) -> None:
        """Fold one event (duplicates are harmless: the same ad is stored again)."""
        d = env.data
        if isinstance(d, JobSubmitted):
            self.ads[job_key(d.schedd, d.job_id)] = {**d.ad, "ScheddName": d.schedd}
        elif isinstance(d, JobStopped) and d.reason in ("completed", "removed") and d.schedd:
            self.ads.pop(job_key(d.schedd, d.job_id), None)
        elif isinstance(d, JobHistory):
            gid = d.ad.get("GlobalJobId")
            cluster, proc = d.ad.get("ClusterId"), d.ad.get("ProcId")
            if isinstance(gid, str) and gid.count("#") >= 2 and cluster is not None:
                host = gid.split("#", 1)[0]
                for schedd in (f"schedd@{host}", host):
                    self.ads.pop(job_key(schedd, f"{cluster}.{proc}"), None)

    def prune(self, live: Iterable[str]) -> None:
        """Keep only the ads of `live` job keys (jobs still in the ledger's queues)."""
        keep = set(live)
        for key in [k for k in self.ads if k not in keep]:
            del self.ads[key]


def _minimal_ad(job: Mapping[str, Any]) -> dict[str, Any]:
    """What the demand fold alone tells about a job whose ad was never seen."""
    cluster, _, proc = str(job["job_id"]).partition(".")
    ad: dict[str, Any] = {"MyType": "Job", "RequestCpus": job.get("cpus", 1.0),
                          "ScheddName": job["schedd"]}
    if cluster.isdigit() and proc.isdigit():
        ad["ClusterId"], ad["ProcId"] = int(cluster), int(proc)
    return ad


# --- configuration -----------------------------------------------------------------------------

def _knob_text(settings: Any, name: str) -> str | None:
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


def negotiator_config(settings: Any) -> NegotiatorConfig:
    """NegotiatorConfig from the knobs in force (config files plus `config.changed`)."""
    knobs = {k: t for k in _NEGOTIATOR_KNOBS if (t := _knob_text(settings, k)) is not None}
    return NegotiatorConfig.from_knobs(knobs)


# --- the snapshot ------------------------------------------------------------------------------

def _accountant_at_cycle(ledger: Ledger, now: float) -> dict[str, dict[str, Any]]:
    """Accountant records as they will be after this cycle's `negotiation.cycle` is folded.

    HTCondor expires leases and (in `htcondor` mode) updates priorities at the start of a
    cycle; the log records that as the cycle event, so the snapshot previews its effect on a
    copy instead of reading the pre-cycle state.
    """
    state = copy.deepcopy(ledger.accountant)
    probe = Envelope("negotiator:preview", NegotiationCycled.TYPE, NegotiationCycled.VERSION,
                     float(now), "negotiator", 0, NegotiationCycled("preview", 0, float(now)))
    accountant.apply(state, probe, ledger.acct_cfg)
    return accountant.view(state, now, ledger.acct_cfg)


def _submitters(ledger: Ledger, now: float, idle: Mapping[str, list[dict[str, Any]]]
                ) -> list[SubmitterInput]:
    """Every submitter with idle jobs or running claims, as the accountant sees it."""
    cfg = ledger.acct_cfg
    prios = _accountant_at_cycle(ledger, now)
    names = set(idle)
    names |= {n for n, r in prios.items() if not r["IsAccountingGroup"]
              and float(r["WeightedResourcesUsed"]) > 0}
    out = []
    for name in sorted(names):
        rec = prios.get(name)
        schedd = str(idle[name][0].get("ScheddName", "")) if idle.get(name) else ""
        if rec is None:
            factor = accountant.default_factor(name, cfg)
            out.append(SubmitterInput(name=name, eup=accountant.MIN_PRIORITY * factor,
                                      group=cfg.groups.group_of(name), priority_factor=factor,
                                      schedd=schedd))
            continue
        out.append(SubmitterInput(
            name=name, eup=float(rec["EffectivePriority"]),
            weighted_usage=float(rec["WeightedResourcesUsed"]), group=str(rec["AccountingGroup"]),
            floor=float(rec["Floor"]), ceiling=float(rec["Ceiling"]),
            priority_factor=float(rec["PriorityFactor"]), schedd=schedd))
    return out


def _groups(ledger: Ledger, subs: list[SubmitterInput], size: float
            ) -> tuple[list[GroupInput], list[str]]:
    """Group inputs and GROUP_SORT_EXPR order; none at all when GROUP_NAMES is empty."""
    qcfg = ledger.quotas.effective(ledger.quota_cfg)
    if not qcfg.group_names:
        return [], []
    current = ledger.quotas.current()
    usage: dict[str, float] = {}
    for s in subs:
        usage[s.group] = usage.get(s.group, 0.0) + s.weighted_usage
    groups = [GroupInput(name=g, quota=float(q.effective_quota), usage=usage.get(g, 0.0),
                         autoregroup=qcfg.autoregroups(g), accept_surplus=qcfg.accepts_surplus(g))
              for g, q in current.items()]
    order = [t.group for t in quotas.group_order(current, usage, qcfg, size)]
    return groups, order


def snapshot(ledger: Ledger, now: float, cycle: int, positions: Mapping[str, Any] | None = None,
             job_ads: JobAds | None = None) -> CycleInput:
    """The cycle's consistent view of the ledger at event time `now`.

    `positions` (the log positions the ledger has folded) is not part of the input but is
    what makes the snapshot reproducible; it goes into the cycle event. Without `job_ads`
    idle jobs are offered with only what the demand fold knows (RequestCpus, ids).
    """
    del positions
    slots = [rec.ad for rec in current_ads(ledger.pool, "Machine")]
    idle: dict[str, list[dict[str, Any]]] = {}
    ads = job_ads.ads if job_ads is not None else {}
    for key, job in ledger.jobs.jobs.items():
        if job["status"] != IDLE:
            continue
        ad = ads.get(key)
        idle.setdefault(job["submitter"], []).append(ad if ad is not None else _minimal_ad(job))
    subs = _submitters(ledger, now, idle)
    size = pool_size(ledger.pool)
    groups, order = _groups(ledger, subs, size)
    limits = ledger.limits
    return CycleInput(
        now=float(now), cycle=cycle, submitters=subs, slots=slots, jobs=idle, groups=groups,
        group_order=order, limit_max=limits.effective(ledger.limit_cfg).max_for,
        limit_default=ledger.limit_cfg.default, limit_usage=dict(limits.in_use))


# --- the cycle's events --------------------------------------------------------------------------

def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _ATTR_TEXT_MAX:
        return value[:_ATTR_TEXT_MAX - 3] + "..."
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _top_reason(reasons: Mapping[str, int]) -> str:
    """The reason reported for an autocluster: the one most of its jobs got."""
    return sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _rejections(result: CycleResult) -> dict[str, Any]:
    """Per autocluster `submitter#id`: reason, reasons, count, job keys (bounded), attributes."""
    out: dict[str, Any] = {}
    for r in result.rejections[:MAX_REJECTION_ENTRIES]:
        count = sum(r.reasons.values())
        out[f"{r.submitter}#{r.autocluster}"] = {
            "submitter": r.submitter, "autocluster": r.autocluster,
            "reason": _top_reason(r.reasons), "reasons": dict(sorted(r.reasons.items())),
            "count": count, "jobs": list(r.jobs[:MAX_JOBS_PER_ENTRY]),
            "attributes": {k: _short(v) for k, v in sorted(r.attributes.items())},
        }
    if len(result.rejections) > MAX_REJECTION_ENTRIES:
        out["_truncated"] = {"autoclusters": len(result.rejections) - MAX_REJECTION_ENTRIES}
    return out


def _submitter_stats(snap: CycleInput, result: CycleResult) -> dict[str, Any]:
    """condor_negotiator's per-submitter numbers plus why untried jobs stayed idle."""
    out: dict[str, Any] = {}
    for s in snap.submitters:
        st = result.submitters.get(s.name)
        if st is None:
            continue
        offered = len(snap.jobs.get(s.name, ()))
        untried = max(0, offered - st.matches - st.rejections)
        doc: dict[str, Any] = {
            "matches": st.matches, "weight": st.weight, "rejections": st.rejections,
            "limit": st.limit, "usage": st.usage_end, "idle": offered, "eup": s.eup,
            "group": s.group, "not_considered": untried}
        if untried:
            limited = st.weight + _EPS >= st.limit or (
                s.ceiling >= 0 and st.usage_end + _EPS >= s.ceiling)
            doc["stopped"] = NOT_CONSIDERED[0] if limited else NOT_CONSIDERED[1]
        out[s.name] = doc
    return out


def cycle_payloads(snap: CycleInput, result: CycleResult, negotiator: str,
                   positions: Mapping[str, Any] | None, duration: float) -> list[Payload]:
    """The `match` payloads (a carved dynamic slot is matched as its partitionable slot, which
    the startd carves itself) followed by one `negotiation.cycle`."""
    out: list[Payload] = []
    for m in result.matches:
        out.append(Matched(negotiator=negotiator, cycle=result.cycle, job_id=m.job_id,
                           schedd=m.schedd, submitter=m.submitter, group=m.group,
                           slot=m.pslot or m.slot, reason=m.reason,  # type: ignore[arg-type]
                           preempts=m.preempts))
    out.append(NegotiationCycled(
        negotiator=negotiator, cycle=result.cycle, now=result.now,
        positions=dict(positions or {}), submitters=_submitter_stats(snap, result),
        duration=duration, matches=len(result.matches), rejections=_rejections(result)))
    return out


def run_cycle(ledger: Ledger, cfg: NegotiatorConfig | None, now: float, cycle: int,
              positions: Mapping[str, Any] | None = None, *, job_ads: JobAds | None = None,
              negotiator: str = DEFAULT_NEGOTIATOR,
              clock: Callable[[], float] | None = time.perf_counter) -> list[Payload]:
    """One negotiation cycle at event time `now`: the `match` payloads, then the
    `negotiation.cycle` payload.

    `cfg` None reads the negotiator knobs from the ledger's settings (so `config.changed`
    events apply). `clock` times the cycle for the event's `duration` statistic (it never
    feeds state); None records 0.0 so that a run's log is byte-for-byte reproducible.
    """
    t0 = clock() if clock is not None else 0.0
    snap = snapshot(ledger, now, cycle, positions, job_ads)
    result = negotiate(snap, cfg if cfg is not None else negotiator_config(ledger.settings))
    duration = (clock() - t0) if clock is not None else 0.0
    return cycle_payloads(snap, result, negotiator, positions, round(duration, 6))
