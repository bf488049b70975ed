"""`poolledger why JOB_ID`: why a job is (or was) not running, answered from the log alone.

Why from the log: every negotiation cycle is a `negotiation.cycle` event that lists, per
autocluster, the jobs it rejected and the reason (in HTCondor's words: "no match found",
"insufficient priority", "concurrency limit X reached", "PREEMPTION_REQUIREMENTS == False",
"submitter limit exceeded"), and per submitter why jobs it never tried stayed idle. Replaying
the job's own events (submitted, started, stopped, history, matches) places those cycles in
the job's life, so the answer is the same on any copy of the log.

On the configured log the ledger's outcome fold (`streams.core.outcomes`: per queued job the
same life, kept by every runner and stored in the snapshots) gives each queued job's life up
to the newest usable snapshot, and only the events after it are read. A job id with no queued
job at the snapshot nor any in the tail (a job that left the queue before the snapshot: the
fold keeps queued jobs only) is answered from the whole log, as without a snapshot.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from schemas.config import SettingsLike
from schemas.events import (ConfigChanged, Envelope, JobHistory, JobStarted, JobStopped,
                            JobSubmitted, Matched, NegotiationCycled)
from services.commands import add_log_source, events_topic, load_events, open_log_to_read
from streams.core.jobs import job_key
from streams.core.outcomes import STOPPED_STATUS, JobOutcomes, Outcome, untried
from streams.replay import ReplayError

#: What each of HTCondor's rejection reasons means, for the explanation line.
MEANING = {
    "no match found": "no slot satisfies the job's Requirements while also accepting the job "
                      "(slot Requirements/START)",
    "insufficient priority": "the slots that match are claimed by users whose effective "
                             "priority is better than this submitter's",
    "PREEMPTION_REQUIREMENTS == False": "the slots that match are claimed, and "
                                        "PREEMPTION_REQUIREMENTS does not allow preempting them",
    "submitter limit exceeded": "the submitter had already used its share of the pool (its pie "
                                "slice under fair share, group quota or submitter ceiling) "
                                "in that cycle",
    "no free slots left": "every usable slot was matched before the job's turn came",
}


@dataclass
class _Life:
    """One job (schedd#job_id) as the log tells it; `match` its last match (cycle, slot,
    reason, preempts, ts)."""

    key: str
    job_id: str
    schedd: str
    submitter: str
    submitted: float
    status: str = "idle"
    since: float = 0.0
    slot: str | None = None
    left: str | None = None
    match: dict[str, Any] | None = None
    cycles: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    last: Outcome | None = None
    pending: Outcome | None = None  # a cycle whose matches are still being read

    @classmethod
    def of(cls, key: str, rec: JobOutcomes) -> _Life:
        """A queued job's life as the ledger's outcome fold tells it."""
        return cls(key, rec.job_id, rec.schedd, rec.submitter, rec.submitted, rec.status,
                   rec.since, rec.slot, None, rec.match, rec.cycles, Counter(rec.outcomes),
                   rec.last, rec.pending)


def register(sub: Any) -> None:
    p = sub.add_parser("why", help="explain why a job is not running (from the log)",
                       description="Explain from the log why a job did not match: the last "
                                   "negotiation cycles that considered it and their reasons.")
    p.add_argument("job_id", metavar="JOB_ID", help="the job id, cluster.proc (e.g. 12.0)")
    p.add_argument("--schedd", help="only the job of this schedd (schedd@host or host)")
    add_log_source(p)
    p.set_defaults(func=run)


def _when(ts: float, origin: float) -> str:
    stamp = datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} UTC (+{(ts - origin) / 3600.0:.2f} h)"


def _schedd_matches(schedd: str, wanted: str | None) -> bool:
    if not wanted:
        return True
    return schedd == wanted or schedd.split("@")[-1] == wanted.split("@")[-1]


def _outcome(life: _Life, cycle: NegotiationCycled, ts: float) -> Outcome:
    """What this cycle did with the (idle) job, before its match events are read."""
    for entry in cycle.rejections.values():
        if entry.get("submitter") != life.submitter or life.key not in entry.get("jobs", ()):
            continue
        return Outcome(cycle.cycle, ts, str(entry.get("reason")), "rejected", entry)
    return untried(life.submitter, cycle, ts)


def _detail(submitter: str, out: Outcome) -> list[str]:
    """The lines under "last cycle" that say what the outcome rests on."""
    if out.kind == "matched":
        m = out.data
        return [f"to {m['slot']} ({m['reason']}"
                + (f", preempting {m['preempts']}" if m["preempts"] else "") + ")"]
    if out.kind == "absent":
        return ["the submitter had no idle jobs in this cycle's snapshot"]
    if out.kind == "untried":
        st = out.data
        return [f"the job was not reached: {st.get('matches', 0)} of the submitter's "
                f"{st.get('idle', 0)} idle jobs matched, limit {float(st.get('limit', 0)):.2f} "
                f"weighted slots, usage {float(st.get('usage', 0)):.2f}, "
                f"effective priority {float(st.get('eup', 0)):.6g}"]
    entry = out.data
    reasons = entry.get("reasons", {})
    detail = [f"autocluster {entry.get('autocluster')} of {submitter}: "
              f"{entry.get('count')} jobs rejected ("
              + ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) + ")"]
    attrs = entry.get("attributes") or {}
    if attrs:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(attrs.items())
                          if k in ("requestcpus", "requestmemory", "requestdisk",
                                   "concurrencylimits", "requirements"))
        if shown:
            detail.append(f"its significant attributes include {shown}")
    return detail


def _scan(events: Iterable[Envelope], job_id: str, schedd: str | None,
          lives: dict[str, _Life] | None = None, knobs: dict[str, str] | None = None,
          origin: float | None = None) -> tuple[list[_Life], dict[str, str], float]:
    """The lives of `job_id` (on `schedd`), the knobs `config.changed` set and the log's first
    event time, from `events`; or from the events after a snapshot, continuing its `lives`,
    `knobs` and `origin`."""
    lives = {} if lives is None else lives
    knobs = {} if knobs is None else knobs
    for env in events:
        if origin is None:
            origin = env.ts
        d = env.data
        if isinstance(d, JobSubmitted):
            if d.job_id == job_id and _schedd_matches(d.schedd, schedd):
                key = job_key(d.schedd, d.job_id)
                old = lives.get(key)
                if old is None or old.left is not None:
                    lives[key] = _Life(key, d.job_id, d.schedd, d.submitter, env.ts,
                                       since=env.ts)
            continue
        if isinstance(d, NegotiationCycled):
            for life in lives.values():
                if life.pending is not None:
                    _settle(life)
                if life.status == "idle" and life.left is None:
                    life.cycles += 1
                    life.pending = _outcome(life, d, env.ts)
            continue
        if isinstance(d, ConfigChanged):
            knobs[d.knob.upper()] = d.value
            continue
        if not lives:
            continue
        if isinstance(d, Matched):
            life_m = lives.get(job_key(d.schedd, d.job_id))
            if life_m is not None:
                data = {"slot": d.slot, "reason": d.reason, "preempts": d.preempts}
                life_m.match = {**data, "cycle": d.cycle, "ts": env.ts}
                out = life_m.pending
                if out is not None and out.cycle == d.cycle:
                    life_m.pending = Outcome(out.cycle, out.ts, "matched", "matched", data)
        elif isinstance(d, JobStarted):
            life_s = lives.get(job_key(d.schedd, d.job_id))
            if life_s is not None:
                life_s.status, life_s.since, life_s.slot = "running", env.ts, d.slot
        elif isinstance(d, JobStopped):
            for life in lives.values():
                same_schedd = not d.schedd or d.schedd == life.schedd
                if d.job_id == life.job_id and same_schedd and life.left is None:
                    life.status = STOPPED_STATUS.get(d.reason, "idle")
                    life.since = env.ts
                    if life.status in ("completed", "removed"):
                        life.left = d.reason
                    life.slot = None
        elif isinstance(d, JobHistory):
            cluster, proc = d.ad.get("ClusterId"), d.ad.get("ProcId")
            gid = str(d.ad.get("GlobalJobId", ""))
            for life in lives.values():
                if f"{cluster}.{proc}" == life.job_id and life.left is None and (
                        not gid or gid.split("#")[0] == life.schedd.split("@")[-1]):
                    status = d.ad.get("JobStatus")
                    life.left = "removed" if status == 3 else "completed"
                    life.status, life.since = life.left, env.ts
    for life in lives.values():
        if life.pending is not None:
            _settle(life)
    return list(lives.values()), knobs, origin or 0.0


def _settle(life: _Life) -> None:
    out = life.pending
    assert out is not None
    life.pending = None
    life.outcomes[out.reason] += 1
    life.last = out


def _meaning(reason: str, knobs: dict[str, str], settings: SettingsLike) -> str:
    if reason.startswith("concurrency limit ") and reason.endswith(" reached"):
        name = reason[len("concurrency limit "):-len(" reached")]
        knob = f"{name.upper()}_LIMIT"
        value = knobs.get(knob)
        if value is None:
            try:
                got = settings.get(knob)
                value = None if got is None else str(got)
            except KeyError:
                value = None
        limit = f"{knob} = {value}" if value is not None else "its maximum"
        return (f"the concurrency limit {name} was at {limit}; the job's ConcurrencyLimits "
                "would exceed it")
    if reason == "matched":
        return "the negotiator matched it"
    if reason == "not offered":
        return "the job was not in the cycle's snapshot"
    return MEANING.get(reason, reason)


def explain(life: _Life, knobs: dict[str, str], origin: float, settings: SettingsLike) -> list[str]:
    """The lines `why` prints for one job."""
    lines = [f"Job {life.job_id} on {life.schedd}, submitter {life.submitter}",
             f"  submitted {_when(life.submitted, origin)}"]
    if life.left is not None:
        lines.append(f"  {life.left} {_when(life.since, origin)}: the job has left the queue")
    elif life.status == "running":
        lines.append(f"  running on {life.slot} since {_when(life.since, origin)}")
    else:
        lines.append(f"  {life.status} since {_when(life.since, origin)}")
    if life.match is not None:
        m = life.match
        lines.append(f"  last matched in cycle {m['cycle']} at {_when(m['ts'], origin)} to "
                     f"{m['slot']} ({m['reason']}"
                     + (f", preempting {m['preempts']}" if m["preempts"] else "") + ")")
    if not life.cycles:
        lines.append("  no negotiation cycle has considered it yet")
        return lines
    summary = ", ".join(f"{r} x{n}" for r, n in life.outcomes.most_common())
    lines.append(f"  considered by {life.cycles} negotiation cycle(s) while idle: {summary}")
    last = life.last
    assert last is not None
    lines.append(f"  last cycle {last.cycle} at {_when(last.ts, origin)}: {last.reason}")
    lines += [f"    {x}" for x in _detail(life.submitter, last)]
    if life.status == "idle" and life.left is None:
        lines.append(f"  Why: {last.reason} — {_meaning(last.reason, knobs, settings)}.")
    return lines


def _from_snapshot(args: argparse.Namespace, settings: SettingsLike
                   ) -> tuple[list[_Life], dict[str, str], float] | None:
    """The lives of the job from the newest usable snapshot of the configured log and the
    events after it; None when there is no such snapshot (or it knows no queued job with that
    id and the tail none either: the job may have left the queue before it)."""
    from streams.log.events import EventLog, ensure_topics
    from streams.replay import first_time, start_of

    log = open_log_to_read(settings)
    try:
        ensure_topics(log)
        elog = EventLog(log)
        topic = events_topic(settings)
        start = start_of(elog, settings, whatif=bool(args.overrides), topic=topic,
                         warn=lambda line: print(f"poolledger why: warning: {line}",
                                                 file=sys.stderr))
        if start.ledger is None:
            return None
        seeded = {key: _Life.of(key, rec) for key, rec in start.ledger.job_outcomes(args.job_id)
                  if _schedd_matches(rec.schedd, args.schedd)}
        origin = first_time(elog, topic)
        tail = (env for _rec, env in elog.read(topic, start_positions=start.positions))
        lives, knobs, origin = _scan(tail, args.job_id, args.schedd, seeded,
                                     start.ledger.knob_overrides(), origin)
    finally:
        log.close()
    return (lives, knobs, origin) if lives else None


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    try:
        found = None if args.log_file is not None else _from_snapshot(args, settings)
        if found is None:
            found = _scan(load_events(args, settings), args.job_id, args.schedd)
        lives, knobs, origin = found
    except ReplayError as exc:
        print(f"poolledger why: {exc}", file=sys.stderr)
        return 1
    if not lives:
        where = f" on {args.schedd}" if args.schedd else ""
        print(f"poolledger why: no job {args.job_id}{where} in the log", file=sys.stderr)
        return 1
    for i, life in enumerate(sorted(lives, key=lambda x: x.key)):
        if i:
            print()
        print("\n".join(explain(life, knobs, origin, settings)))
    return 0
