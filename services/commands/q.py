"""`poolledger q`: condor_q over the job queues the log folds to.

Why the ledger's folds and not the last `job.submitted` of each job: the queue fold
(streams.core.jobs) knows which jobs are still queued and whether each is idle, running
(on which slot) or held, and the job-ad fold (streams.core.jobads) keeps each queued job's ad
as submitted; the outcome fold says since when it is in its state. Together they give the ad
condor_q would fetch from the schedd at the log's last event, with JobStatus,
EnteredCurrentStatus, RemoteHost and JobCurrentStartDate brought up to date. On the
configured log it starts from the newest usable snapshot and folds only the tail, as
`status` does (`fold_log`).

The layouts are condor_q's (src/condor_q.V6/queue.cpp): the batch summary by default, one
line a job with -nobatch, -run, -hold and -idle, the totals alone with -totals, the ads with
-l, attributes with -af; -constraint filters with a ClassAd expression; positional arguments
restrict to a cluster, a cluster.proc or an owner. -better-analyze is `poolledger why`.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from schemas.classads import ad_from_json, compile_expr, evaluate
from schemas.config import SettingsLike
from schemas.errors import ClassAdError
from services.commands import add_log_source, fold_log
from services.commands.status import _value
from streams.core.jobs import HELD, IDLE, RUNNING
from streams.core.ledger import Ledger
from streams.replay import ReplayError

#: condor_q's JobStatus codes and their one-letter ST column (PRINTAS JOB_STATUS)
JOB_STATUS = {IDLE: 1, RUNNING: 2, HELD: 5}
ST = {1: "I", 2: "R", 3: "X", 4: "C", 5: "H", 6: ">", 7: "S"}


def register(sub: Any) -> None:
    p = sub.add_parser("q", help="condor_q: the jobs in the queues, as the log folds them",
                       description="Print the job queues as of the log's last event, in "
                                   "condor_q's layouts (batches by default).")
    p.add_argument("restrict", nargs="*", metavar="cluster|cluster.proc|owner",
                   help="only these clusters, jobs or owners")
    view = p.add_mutually_exclusive_group()
    view.add_argument("-nobatch", action="store_true", help="one line per job")
    view.add_argument("-run", action="store_true", help="running jobs and their slots")
    view.add_argument("-hold", "-held", dest="hold", action="store_true",
                      help="held jobs and why they are held")
    view.add_argument("-idle", action="store_true", help="idle jobs and what they request")
    view.add_argument("-totals", action="store_true", help="only the totals")
    view.add_argument("-l", "-long", dest="long", action="store_true", help="whole job ads")
    view.add_argument("-af", "-autoformat", dest="af", nargs="+", metavar="ATTR",
                      help="only these attributes (expressions), space-separated, one job a line")
    view.add_argument("-better-analyze", "-analyze", dest="analyze", action="store_true",
                      help="why the named jobs do not run: `poolledger why JOB_ID`")
    p.add_argument("-constraint", metavar="EXPR", help="only jobs for which EXPR is true")
    add_log_source(p)
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A queued job as condor_q shows it: its schedd and its ad brought up to date."""

    schedd: str
    ad: dict[str, Any]

    @property
    def cluster(self) -> int:
        return _int(self.ad.get("ClusterId"))

    @property
    def proc(self) -> int:
        return _int(self.ad.get("ProcId"))

    @property
    def status(self) -> int:
        return _int(self.ad.get("JobStatus"))


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def queued_jobs(ledger: Ledger) -> list[QueuedJob]:
    """Every queued job of the ledger, by schedd then cluster.proc, with the queue's view of
    it written into its ad (JobStatus, EnteredCurrentStatus, RemoteHost, JobCurrentStartDate,
    ServerTime), as the schedd's own ad would hold them."""
    now = ledger.collector_now() or ledger.now or 0.0
    since: dict[str, float] = {}
    out: list[QueuedJob] = []
    for key, rec in ledger.job_records():
        found = ledger.job_ad(key)
        schedd = str(rec.get("schedd", ""))
        ad: dict[str, Any] = dict(found[1]) if found is not None else {}
        if found is None:  # a job started with no submission on the log (imports): its ids
            cluster, _, proc = str(rec.get("job_id", "")).partition(".")
            ad.update(ClusterId=_int(_number(cluster)), ProcId=_int(_number(proc)),
                      Owner=str(rec.get("submitter", "")).split("@")[0])
        job_id = str(rec.get("job_id", ""))
        if job_id not in since:
            for k, life in ledger.job_outcomes(job_id):
                since[k] = life.since
        status = JOB_STATUS.get(str(rec.get("status")), 1)
        ad["JobStatus"] = status
        if key in since:
            ad["EnteredCurrentStatus"] = int(since[key])
        if status == 2 and rec.get("slot"):
            ad["RemoteHost"] = str(rec["slot"])
            if key in since:
                ad["JobCurrentStartDate"] = int(since[key])
        ad["ServerTime"] = int(now)
        out.append(QueuedJob(schedd, ad))
    out.sort(key=lambda j: (j.schedd, j.cluster, j.proc))
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _restricted(jobs: list[QueuedJob], words: Sequence[str]) -> list[QueuedJob]:
    """condor_q's restriction list: `cluster`, `cluster.proc` or an owner name."""
    if not words:
        return jobs
    keep = []
    for job in jobs:
        for w in words:
            cluster, dot, proc = w.partition(".")
            if cluster.isdigit() and (not dot or proc.isdigit()):
                if job.cluster == int(cluster) and (not dot or job.proc == int(proc)):
                    break
            elif job.ad.get("Owner") == w or str(job.ad.get("User", "")).split("@")[0] == w:
                break
        else:
            continue
        keep.append(job)
    return keep


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    if args.analyze:
        return _analyze(args, settings)
    for flag, text in [("-constraint", args.constraint)] + [("-af", a) for a in args.af or []]:
        if text is None:
            continue
        try:
            compile_expr(text)
        except ClassAdError as exc:
            print(f"poolledger q: {flag} {text!r}: {exc}", file=sys.stderr)
            return 2
    try:
        ledger = fold_log(args, settings, needs=None)[0].ledger
    except ReplayError as exc:
        print(f"poolledger q: {exc}", file=sys.stderr)
        return 1
    everyone = queued_jobs(ledger)
    now = float(ledger.collector_now() or ledger.now or 0.0)
    jobs = _restricted(everyone, args.restrict)
    if args.constraint is not None:
        jobs = [j for j in jobs if evaluate(args.constraint, j.ad, now=now) is True]
    if args.run:
        jobs = [j for j in jobs if j.status == 2]
    elif args.hold:
        jobs = [j for j in jobs if j.status == 5]
    elif args.idle:
        jobs = [j for j in jobs if j.status == 1]
    if args.long:
        print("\n".join(ad_from_json(j.ad).printOld() for j in jobs), end="")
        return 0
    if args.af:
        for j in jobs:
            print(" ".join(_value(j.ad, a, now) for a in args.af))
        return 0
    print("\n".join(layout(args, jobs, everyone, now)))
    return 0


def _analyze(args: argparse.Namespace, settings: SettingsLike) -> int:
    """condor_q -better-analyze JOB_ID...: the negotiation cycles' reasons, which is what
    `poolledger why` tells from the log."""
    from services.commands import why

    ids = [w for w in args.restrict if w.replace(".", "", 1).isdigit()]
    if not ids:
        print("poolledger q: -better-analyze needs a job id (cluster.proc); it is "
              "`poolledger why JOB_ID`", file=sys.stderr)
        return 2
    status = 0
    for job_id in ids:
        job = job_id if "." in job_id else f"{job_id}.0"
        print(f"-- poolledger why {job} (condor_q -better-analyze from the log):")
        ns = argparse.Namespace(**{**vars(args), "job_id": job, "schedd": None,
                                   "command": "why"})
        status = max(status, int(why.run(ns, settings)))
    return status


# --- layouts -----------------------------------------------------------------------------------

def _qdate(value: Any) -> str:
    """PRINTAS QDATE: month/day hour:minute (UTC)."""
    if not isinstance(value, (int, float)) or value <= 0:
        return "??"
    t = datetime.fromtimestamp(value, timezone.utc)
    return f"{t.month:2d}/{t.day:02d} {t.hour:02d}:{t.minute:02d}"


def _runtime(seconds: float) -> str:
    """PRINTAS CPU_TIME: days+hh:mm:ss."""
    s = max(0, int(seconds))
    return f"{s // 86400}+{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_time(ad: Mapping[str, Any], now: float) -> float:
    """The job's wall time: its earlier runs' RemoteWallClockTime plus the current run."""
    total = ad.get("RemoteWallClockTime", 0.0)
    total = float(total) if isinstance(total, (int, float)) else 0.0
    start = ad.get("JobCurrentStartDate")
    if ad.get("JobStatus") == 2 and isinstance(start, (int, float)):
        total += max(0.0, now - float(start))
    return total


def _size(ad: Mapping[str, Any]) -> str:
    """PRINTAS MEMORY_USAGE: ImageSize (KiB) in MiB."""
    size = ad.get("ImageSize", 0)
    return f"{float(size) / 1024.0:.1f}" if isinstance(size, (int, float)) else "0.0"


def _cmd(ad: Mapping[str, Any]) -> str:
    """PRINTAS JOB_DESCRIPTION: the executable's base name and its arguments."""
    cmd = str(ad.get("Cmd", "")).rsplit("/", 1)[-1]
    args = ad.get("Args", ad.get("Arguments", ""))
    return f"{cmd} {args}".strip() if isinstance(args, str) else cmd


def _job(j: QueuedJob) -> str:
    return f"{j.cluster:4d}.{j.proc:<3d}"


def _owner(j: QueuedJob) -> str:
    """OWNER: WIDTH -14, as condor_q pads it."""
    return f"{str(j.ad.get('Owner', '??')):<14}"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return " ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header)] + [line(r) for r in rows]


def layout(args: argparse.Namespace, jobs: list[QueuedJob], everyone: list[QueuedJob],
           now: float) -> list[str]:
    """condor_q's output: per schedd its header and rows, then the totals."""
    out: list[str] = []
    if not args.totals:
        for schedd in sorted({j.schedd for j in jobs}):
            mine = [j for j in jobs if j.schedd == schedd]
            out += ["", f"-- Schedd: {schedd} @ {_stamp(now)}"] + _rows(args, mine, now)
    out += [""] + totals(jobs, everyone)
    return out


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime("%m/%d/%y %H:%M:%S")


def _rows(args: argparse.Namespace, jobs: list[QueuedJob], now: float) -> list[str]:
    if args.run:
        return _table([" ID", "OWNER", "  SUBMITTED", "    RUN_TIME", "HOST(S)"],
                      [[_job(j), _owner(j), _qdate(j.ad.get("QDate")),
                        _runtime(run_time(j.ad, now)), str(j.ad.get("RemoteHost", "??"))]
                       for j in jobs], {3})
    if args.hold:
        return _table([" ID", "OWNER", "HELD_SINCE", "HOLD_REASON"],
                      [[_job(j), _owner(j),
                        _qdate(j.ad.get("EnteredCurrentStatus")),
                        str(j.ad.get("HoldReason", "held (job.stopped: held)"))]
                       for j in jobs], set())
    if args.idle:
        return _table([" ID", "OWNER", "UNIVERSE", "CPUS", "MEMORY", "STARTS", "LAST_HOST"],
                      [[_job(j), _owner(j), _universe(j.ad),
                        f"{_int(j.ad.get('RequestCpus')):4d}",
                        f"{_int(j.ad.get('RequestMemory')):6d}",
                        f"{_int(j.ad.get('NumShadowStarts')):6d}",
                        str(j.ad.get("LastRemoteHost", ""))] for j in jobs], {3, 4, 5})
    if args.nobatch:
        return _table([" ID", "OWNER", "  SUBMITTED", "    RUN_TIME", "ST", "PRI", "SIZE",
                       "CMD"],
                      [[_job(j), _owner(j), _qdate(j.ad.get("QDate")),
                        _runtime(run_time(j.ad, now)), ST.get(j.status, "?"),
                        str(_int(j.ad.get("JobPrio"))), _size(j.ad), _cmd(j.ad)]
                       for j in jobs], {3, 5, 6})
    return _batches(jobs)


def _universe(ad: Mapping[str, Any]) -> str:
    names = {5: "vanilla", 7: "scheduler", 9: "grid", 10: "java", 11: "parallel", 12: "local",
             13: "vm", 1: "standard"}
    return names.get(_int(ad.get("JobUniverse")), "?")


def _batches(jobs: list[QueuedJob]) -> list[str]:
    """The default view: one row per owner and batch (JobBatchName, else the cluster)."""
    batches: dict[tuple[str, str], list[QueuedJob]] = {}
    for j in jobs:
        name = j.ad.get("JobBatchName")
        label = name if isinstance(name, str) and name else f"ID: {j.cluster}"
        batches.setdefault((str(j.ad.get("Owner", "??")), label), []).append(j)
    rows = []
    for (owner, label), members in batches.items():
        count = {s: sum(1 for m in members if m.status == s) for s in (1, 2, 5)}
        ids = sorted((m.cluster, m.proc) for m in members)
        first, last = ids[0], ids[-1]
        span = (f"{first[0]}.{first[1]}" if first == last else
                f"{first[0]}.{first[1]}-{last[1]}" if first[0] == last[0] else
                f"{first[0]}.{first[1]} ... {last[0]}.{last[1]}")
        rows.append([owner, label, _qdate(min(_int(m.ad.get("QDate")) for m in members)), "_",
                     str(count[2] or "_"), str(count[1] or "_"), str(count[5] or "_"),
                     str(len(members)), span])
    return _table(["OWNER", "BATCH_NAME", "   SUBMITTED", "DONE", "RUN", "IDLE", "HOLD", "TOTAL",
                   "JOB_IDS"], rows, {3, 4, 5, 6, 7})


def totals(jobs: list[QueuedJob], everyone: list[QueuedJob]) -> list[str]:
    """condor_q's summary: the query's jobs by state, then every user's."""
    def line(label: str, js: list[QueuedJob]) -> str:
        n = {s: sum(1 for j in js if j.status == s) for s in (1, 2, 5, 7)}
        return (f"{label}: {len(js)} jobs; 0 completed, 0 removed, {n[1]} idle, {n[2]} running, "
                f"{n[5]} held, {n[7]} suspended")

    return [line("Total for query", jobs), line("Total for all users", everyone)]
