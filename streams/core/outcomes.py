"""The outcome fold: what the negotiation cycles did with each queued job (`poolledger why`).

Why a fold: `why JOB_ID` places every negotiation cycle that considered a job while it was
idle in the job's life: how many, how often each reason, the last one and what it rested on.
Kept here per queued job, it is part of the ledger a snapshot restores, so `why` continues
the same bookkeeping over the log's tail only (services/commands/why.py).

Why lazy: a cycle considers every idle job, and a pool holds far more idle jobs than a cycle
event names. A job the cycle does not name (in an autocluster's rejections, or a match) gets
its submitter's outcome of that cycle ("not offered" when the submitter was not in it, else
why its untried jobs stayed idle). So a cycle costs one entry per submitter with idle jobs
(its outcome, run-length encoded by cycle ordinal) plus the jobs it names; a job catches up
from those runs only when it is named, changes state or is asked about. Its counts come out
in the order the reasons first happened to it, exactly like a tally kept cycle by cycle.

A cycle's outcome stays open until the next cycle (its matches follow it on the log and turn
it into "matched"). A job is kept from `job.submitted` until it leaves the queue (completed or
removed by `job.stopped`, or its `job.history` ad), matched to the job events as `why` does.
The fold is kept out of the ledger's canonical JSON (as the job ads are): snapshots store it.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.events import (JobHistory, JobStarted, JobStopped, JobSubmitted, Matched,
                            NegotiationCycled)

__all__ = ["IDLE", "STOPPED_STATUS", "Outcome", "JobOutcomes", "OutcomesState", "on_submitted",
           "on_started", "on_stopped", "on_history", "on_cycle", "on_matched", "untried", "view"]

IDLE: Final = "idle"
#: a job's state after `job.stopped` with this reason (anything else: idle again)
STOPPED_STATUS: Final = {"completed": "completed", "removed": "removed", "held": "held",
                         "evicted": IDLE, "preempted": IDLE, "vacated": IDLE}
_LEAVES: Final = frozenset({"completed", "removed"})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one cycle (number `cycle`, event time `ts`) did with an idle job: `reason` in
    HTCondor's words, and what it rests on (`kind`, `data`): "rejected" (the autocluster's
    rejection entry), "untried" (the submitter's statistics of the cycle), "absent" (the
    submitter was not in the cycle; data None) or "matched" (slot, reason, preempts)."""

    cycle: int
    ts: float
    reason: str
    kind: str
    data: Any

    def to_doc(self) -> list[Any]:
        return [self.cycle, self.ts, self.reason, self.kind, self.data]

    @classmethod
    def from_doc(cls, doc: list[Any]) -> Outcome:
        return cls(int(doc[0]), float(doc[1]), str(doc[2]), str(doc[3]), doc[4])


def _outcome_doc(out: Outcome | None) -> list[Any] | None:
    return None if out is None else out.to_doc()


def _outcome_of(doc: list[Any] | None) -> Outcome | None:
    return None if doc is None else Outcome.from_doc(doc)


@dataclass(slots=True)
class JobOutcomes:
    """One queued job's life as `why` tells it: submission, state and since when, the slot it
    runs on, its last match (cycle, slot, reason, preempts, ts), and the cycles that found it
    idle: how many, per reason (first-happened order), the last settled one and the open one.
    `synced` is the cycle ordinal it is caught up to."""

    job_id: str
    schedd: str
    submitter: str
    submitted: float
    status: str = IDLE
    since: float = 0.0
    slot: str | None = None
    match: dict[str, Any] | None = None
    cycles: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    last: Outcome | None = None
    pending: Outcome | None = None
    synced: int = 0

    def __init__(self, job_id: str, schedd: str, submitter: str, submitted: float,
                 status: str = IDLE, since: float = 0.0, slot: str | None = None,
                 match: dict[str, Any] | None = None, cycles: int = 0,
                 outcomes: dict[str, int] | None = None, last: Outcome | None = None,
                 pending: Outcome | None = None, synced: int = 0) -> None:
        # written out: the compiled core compiles this one, while the __init__ @dataclass
        # generates runs interpreted (one per job submission)
        self.job_id, self.schedd, self.submitter = job_id, schedd, submitter
        self.submitted, self.status, self.since, self.slot = submitted, status, since, slot
        self.match, self.cycles = match, cycles
        self.outcomes = {} if outcomes is None else outcomes
        self.last, self.pending, self.synced = last, pending, synced

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # copy and pickle rebuild through __init__: the compiled class's __new__ runs it
        return JobOutcomes, (self.job_id, self.schedd, self.submitter, self.submitted,
                             self.status, self.since, self.slot, self.match, self.cycles,
                             self.outcomes, self.last, self.pending, self.synced)

    def copy(self) -> JobOutcomes:
        return JobOutcomes(self.job_id, self.schedd, self.submitter, self.submitted, self.status,
                           self.since, self.slot, self.match, self.cycles, dict(self.outcomes),
                           self.last, self.pending, self.synced)

    def to_doc(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "schedd": self.schedd, "submitter": self.submitter,
                "submitted": self.submitted, "status": self.status, "since": self.since,
                "slot": self.slot, "match": self.match, "cycles": self.cycles,
                # pairs, not an object: the order the reasons first happened is meaningful
                "outcomes": [[r, n] for r, n in self.outcomes.items()],
                "last": _outcome_doc(self.last), "pending": _outcome_doc(self.pending),
                "synced": self.synced}

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> JobOutcomes:
        return cls(str(d["job_id"]), str(d["schedd"]), str(d["submitter"]), float(d["submitted"]),
                   str(d["status"]), float(d["since"]), d["slot"], d["match"], int(d["cycles"]),
                   {str(r): int(n) for r, n in d["outcomes"]}, _outcome_of(d["last"]),
                   _outcome_of(d["pending"]), int(d["synced"]))


@dataclass(slots=True)
class SubmitterRuns:
    """A submitter with idle jobs: how many, its outcome for the jobs a cycle did not name as
    runs (`starts[i]` the cycle ordinal where reason `reasons[i]` begins), and that outcome
    at the latest cycle."""

    idle: int = 0
    starts: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    latest: Outcome | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"idle": self.idle, "starts": self.starts, "reasons": self.reasons,
                "latest": _outcome_doc(self.latest)}

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> SubmitterRuns:
        return cls(int(d["idle"]), [int(s) for s in d["starts"]], [str(r) for r in d["reasons"]],
                   _outcome_of(d["latest"]))


@dataclass(slots=True)
class OutcomesState:
    """Cycles folded (`n`, the ordinal of the latest), queued jobs by job id then job key,
    the submitters that have idle jobs, and per negotiator its highest cycle number, the
    time of its latest cycle and the knobs the log's `config.changed` events had set then
    (its interval), which a negotiator resuming from a snapshot continues from."""

    n: int = 0
    jobs: dict[str, dict[str, JobOutcomes]] = field(default_factory=dict)
    subs: dict[str, SubmitterRuns] = field(default_factory=dict)
    negotiators: dict[str, tuple[int, float, dict[str, str]]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"n": self.n,
                "jobs": {i: {k: r.to_doc() for k, r in recs.items()}
                         for i, recs in self.jobs.items()},
                "subs": {s: r.to_doc() for s, r in self.subs.items()},
                "negotiators": {name: list(c) for name, c in self.negotiators.items()}}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> OutcomesState:
        return cls(int(doc["n"]),
                   {str(i): {str(k): JobOutcomes.from_doc(r) for k, r in recs.items()}
                    for i, recs in doc["jobs"].items()},
                   {str(s): SubmitterRuns.from_doc(r) for s, r in doc["subs"].items()},
                   {str(name): (int(c[0]), float(c[1]), {str(k): str(v) for k, v in c[2].items()})
                    for name, c in doc["negotiators"].items()})


# --- catching up -------------------------------------------------------------------------------

def _settle(rec: JobOutcomes) -> None:
    """The open outcome is final (a later cycle came): count it."""
    out = rec.pending
    if out is not None:
        rec.outcomes[out.reason] = rec.outcomes.get(out.reason, 0) + 1
        rec.last = out
        rec.pending = None


def _count_runs(rec: JobOutcomes, sub: SubmitterRuns, lo: int, hi: int) -> None:
    """Count the submitter's outcomes of cycles `lo`..`hi` (all settled) for `rec`, in order."""
    starts, reasons = sub.starts, sub.reasons
    i = max(0, bisect_right(starts, lo) - 1)
    at = lo
    while at <= hi and i < len(starts):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else hi
        n = min(end, hi) - at + 1
        if n > 0:
            reason = reasons[i]
            rec.outcomes[reason] = rec.outcomes.get(reason, 0) + n
            rec.cycles += n
            at += n
        i += 1


def _through_previous(st: OutcomesState, rec: JobOutcomes) -> None:
    """Settle every cycle before the latest for `rec`: its open outcome, then (idle) the
    submitter's outcomes of the cycles it was not named in."""
    if rec.pending is not None:
        _settle(rec)
    if rec.status == IDLE and rec.synced + 1 <= st.n - 1:
        _count_runs(rec, st.subs[rec.submitter], rec.synced + 1, st.n - 1)


def _catch_up(st: OutcomesState, rec: JobOutcomes) -> None:
    """Bring `rec` to the latest cycle: the one before settled, the latest open (idle)."""
    if rec.synced >= st.n:
        return
    _through_previous(st, rec)
    if rec.status == IDLE:
        rec.cycles += 1
        rec.pending = st.subs[rec.submitter].latest
    rec.synced = st.n


def _set_status(st: OutcomesState, rec: JobOutcomes, status: str) -> None:
    """`rec` (caught up) changes state: the idle count of its submitter follows."""
    was_idle, idle = rec.status == IDLE, status == IDLE
    rec.status = status
    if was_idle and not idle:
        sub = st.subs[rec.submitter]
        sub.idle -= 1
        if sub.idle <= 0:  # no idle job needs its runs any more
            del st.subs[rec.submitter]
    elif idle and not was_idle:
        _idle_one_more(st, rec.submitter)


def _idle_one_more(st: OutcomesState, submitter: str) -> None:
    sub = st.subs.get(submitter)
    if sub is None:
        sub = st.subs[submitter] = SubmitterRuns()
    sub.idle += 1


def _drop(st: OutcomesState, rec: JobOutcomes, key: str) -> None:
    _set_status(st, rec, "left")
    recs = st.jobs[rec.job_id]
    del recs[key]
    if not recs:
        del st.jobs[rec.job_id]


def untried(name: str, cycle: NegotiationCycled, ts: float) -> Outcome:
    """The cycle's outcome for a job of submitter `name` it did not name."""
    stats = cycle.submitters.get(name)
    if not isinstance(stats, Mapping):
        return Outcome(cycle.cycle, ts, "not offered", "absent", None)
    stopped = stats.get("stopped") or "submitter limit exceeded"
    return Outcome(cycle.cycle, ts, str(stopped), "untried", stats)


# --- the job events and the cycles -----------------------------------------------------------

def on_submitted(st: OutcomesState, d: JobSubmitted, ts: float, key: str) -> None:
    """The job of key `key` (`jobs.job_key`) is queued, idle."""
    recs = st.jobs.get(d.job_id)
    if recs is None:
        recs = st.jobs[d.job_id] = {}
    elif key in recs:
        return  # still queued: the first submission stands
    recs[key] = JobOutcomes(d.job_id, d.schedd, d.submitter, ts, since=ts, synced=st.n)
    _idle_one_more(st, d.submitter)


def _queued(st: OutcomesState, job_id: str, key: str) -> JobOutcomes | None:
    """The queued job `job_id` of job key `key` (schedd#job id), if the fold holds it."""
    recs = st.jobs.get(job_id)
    return None if recs is None else recs.get(key)


def on_started(st: OutcomesState, d: JobStarted, ts: float, key: str) -> None:
    """The job of key `key` (`jobs.job_key`) runs on its slot from `ts`."""
    rec = _queued(st, d.job_id, key)
    if rec is None:
        return
    _catch_up(st, rec)
    _set_status(st, rec, "running")
    rec.since, rec.slot = ts, d.slot


def on_stopped(st: OutcomesState, d: JobStopped, ts: float) -> None:
    recs = st.jobs.get(d.job_id)
    if recs is None:
        return
    status = STOPPED_STATUS.get(d.reason, IDLE)
    for key, rec in list(recs.items()):
        if d.schedd and d.schedd != rec.schedd:
            continue
        _catch_up(st, rec)
        rec.since, rec.slot = ts, None
        if status in _LEAVES:
            _drop(st, rec, key)
        else:
            _set_status(st, rec, status)


def on_history(st: OutcomesState, d: JobHistory, named: tuple[str, str]) -> None:
    """The job named by the history ad (ClusterId.ProcId, on the GlobalJobId's host) left.
    `named` is what `jobs.history_job` read of the ad: its job id is `cluster.proc` when
    both are integers."""
    cluster, proc = d.ad.get("ClusterId"), d.ad.get("ProcId")
    recs = st.jobs.get(named[0] if type(cluster) is int and type(proc) is int
                       else f"{cluster}.{proc}")
    if recs is None:
        return
    gid = str(d.ad.get("GlobalJobId", ""))
    for key, rec in list(recs.items()):
        if not gid or gid.split("#")[0] == rec.schedd.split("@")[-1]:
            _catch_up(st, rec)
            _drop(st, rec, key)


def on_cycle(st: OutcomesState, d: NegotiationCycled, ts: float, knobs: dict[str, str]) -> None:
    """A cycle (under the log's knob overrides `knobs`, kept, not copied: the ledger replaces
    its overrides rather than changing them): its negotiator's record,
    each submitter's outcome for its idle jobs not named, then the named ones (the first
    rejection entry of the job's own submitter that lists it)."""
    known = st.negotiators.get(d.negotiator)
    st.negotiators[d.negotiator] = (d.cycle if known is None else max(known[0], d.cycle),
                                    float(d.now), knobs)
    st.n += 1
    n = st.n
    absent = Outcome(d.cycle, ts, "not offered", "absent", None)  # shared: most submitters
    for name, sub in st.subs.items():
        out = untried(name, d, ts) if name in d.submitters else absent
        if not sub.reasons or sub.reasons[-1] != out.reason:
            sub.starts.append(n)
            sub.reasons.append(out.reason)
        sub.latest = out
    named: dict[str, tuple[JobOutcomes, Outcome]] = {}
    for entry in d.rejections.values():
        if not isinstance(entry, Mapping):
            continue
        submitter, keys = entry.get("submitter"), entry.get("jobs")
        if not isinstance(keys, (list, tuple)):
            continue
        reason: str | None = None
        for key in keys:
            if not isinstance(key, str) or key in named:
                continue
            rec = _queued(st, key[key.rfind("#") + 1:], key)
            if rec is None or rec.status != IDLE or rec.submitter != submitter:
                continue
            if reason is None:
                reason = str(entry.get("reason"))
            named[key] = (rec, Outcome(d.cycle, ts, reason, "rejected", entry))
    for rec, out in named.values():
        _through_previous(st, rec)
        rec.cycles += 1
        rec.pending = out
        rec.synced = n


def on_matched(st: OutcomesState, d: Matched, ts: float) -> None:
    """A match: the job's last match, and its open outcome of that cycle becomes "matched"."""
    rec = _queued(st, d.job_id, f"{d.schedd}#{d.job_id}")
    if rec is None:
        return
    _catch_up(st, rec)
    data = {"slot": d.slot, "reason": d.reason, "preempts": d.preempts}
    rec.match = {**data, "cycle": d.cycle, "ts": ts}
    out = rec.pending
    if out is not None and out.cycle == d.cycle:
        rec.pending = Outcome(out.cycle, out.ts, "matched", "matched", data)


def view(st: OutcomesState, job_id: str) -> list[tuple[str, JobOutcomes]]:
    """(job key, a copy caught up to the latest cycle) of each queued job with `job_id`."""
    out = []
    for key, rec in sorted(st.jobs.get(job_id, {}).items()):
        mine = rec.copy()
        _catch_up(st, mine)
        out.append((key, mine))
    return out
