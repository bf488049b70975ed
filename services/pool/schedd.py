"""A simulated condor_schedd: the job queue, claims, job starts and stops, and job history.

Jobs carry the attributes condor_submit writes (Owner, User, AccountingGroup, JobPrio,
Requirements, Rank, Request*, ConcurrencyLimits, JobLeaseDuration, KillSig, ...). The schedd
claims matched slots, activates them (`job.started`), reuses a claim for the submitter's next
runnable job until CLAIM_WORKLIFE, releases it otherwise, and writes the final job ClassAd
(`job.history`) when a job leaves the queue. Scheduler and Submitter ads go out every
SCHEDD_INTERVAL. While the schedd is down its claims stop receiving keep-alives (the startds'
claim leases run out) and what the startds report waits for it to come back.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas import classads
from schemas.classads import expr
from schemas.events import (AdInvalidated, AdUpdated, Envelope, JobHistory, JobStarted,
                            JobStopped, JobSubmitted, Matched, StopReason)
from schemas.settings import DaemonConfig
from services.pool import crontab
from services.pool.clock import Timer, VirtualClock
from services.pool.daemon import Daemon
from services.pool.startd import Claim, ClaimRequest, Startd
from services.pool.submit_policy import (SubmitRejectedError, check_cluster, job_transforms,
                                         submit_requirements, transform_cluster)

IDLE, RUNNING, REMOVED, COMPLETED, HELD = 1, 2, 3, 4, 5
VANILLA = 5


def submitter_name(owner: str, uid_domain: str, group: str | None = None,
                   group_user: str | None = None, nice_user: bool = False) -> tuple[str | None, str]:
    """(AccountingGroup, submitter) as HTCondor names them.

    `accounting_group = g` (+ `accounting_group_user = u`, default the owner) gives
    AccountingGroup "g.u" and submitter "g.u@UID_DOMAIN"; `nice_user` puts the job in the
    nice-user group ("nice-user.u@UID_DOMAIN"); otherwise the submitter is "owner@UID_DOMAIN".
    """
    user = group_user or owner
    if nice_user:
        group_name: str | None = f"nice-user.{user}"
    elif group:
        group_name = f"{group}.{user}"
    else:
        group_name = None
    return group_name, f"{group_name or owner}@{uid_domain}"


@dataclass(frozen=True, slots=True)
class JobDescription:
    """One submit description, resolved (what condor_submit would turn into job ads)."""

    owner: str
    accounting_group: str | None = None
    accounting_group_user: str | None = None
    nice_user: bool = False
    request_cpus: int = 1
    request_memory: int = 128  # MB
    request_disk: int = 1024  # KB
    request: Mapping[str, int] = field(default_factory=dict)  # request_<custom>
    requirements: str | None = None
    rank: str | None = None
    priority: int = 0
    concurrency_limits: str | None = None
    max_retirement_time: float | None = None
    job_max_vacate_time: float | None = None
    job_lease_duration: float | None = 2400.0
    kill_sig: str = "SIGTERM"
    cmd: str = "/bin/sleep"
    args: str = ""
    iwd: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)  # +Attr = value
    vacate_time: float = 0.0  # simulated: seconds the job needs to exit after KillSig
    exit_code: int = 0
    on_exit_remove: bool = True  # False: the job goes back to Idle after each run (seed 003)
    cron: Mapping[str, str] = field(default_factory=dict)  # cron_<field> without the prefix
    deferral_time: str | None = None  # a ClassAd expression (`QDate + 60`) or an epoch time
    deferral_window: float | None = None  # deferral_window / cron_window (seconds)
    deferral_prep_time: float | None = None  # deferral_prep_time / cron_prep_time (seconds)
    cpu_efficiency: float | None = None  # simulated: CPU seconds per core-second running


@dataclass(eq=False)
class Job:
    """A job in the queue: its live ClassAd plus what the simulation knows about it."""

    cluster: int
    proc: int
    ad: dict[str, Any]
    submitter: str
    duration: float
    vacate_time: float
    exit_code: int
    claim: Claim | None = None
    pending: bool = False  # matched, claim requested, not yet running
    _view: tuple[tuple[Any, ...], JobView] | None = None
    cpu_efficiency: float | None = None  # None: the ad reports no CPU time

    def view(self, schedd: str) -> JobView:
        """The negotiator's view (JSON ad), cached while the ad's fingerprint is unchanged."""
        ad = self.ad
        key = (len(ad), ad["JobStatus"], ad["EnteredCurrentStatus"], ad["NumJobMatches"],
               ad["NumHolds"], ad["JobPrio"])
        if self._view is None or self._view[0] != key:
            self._view = (key, JobView(self.job_id, schedd, self.submitter, classads.attrs_to_json(ad)))
        return self._view[1]

    @property
    def job_id(self) -> str:
        """"cluster.proc", as the event contract names jobs."""
        return f"{self.cluster}.{self.proc}"

    @property
    def status(self) -> int:
        """JobStatus (1 idle, 2 running, 3 removed, 4 completed, 5 held)."""
        return int(self.ad["JobStatus"])

    @property
    def idle(self) -> bool:
        """Idle and not already being claimed: something the negotiator may match."""
        return self.status == IDLE and not self.pending


@dataclass(frozen=True, slots=True)
class JobView:
    """An idle job as the negotiator sees it: identity, routing and the job ad (JSON form)."""

    job_id: str
    schedd: str
    submitter: str
    ad: dict[str, Any]


class StartdDirectory(Protocol):
    """How a schedd finds the startd of a slot (the pool's address book)."""

    def startd_for(self, slot: str) -> Startd | None:
        """The startd publishing `slot`, if any."""


class Schedd(Daemon):
    """The condor_schedd of one access point (source and name `schedd@<host>`)."""

    def __init__(self, host: str, config: DaemonConfig, clock: VirtualClock, outbox: list[Envelope],
                 directory: StartdDirectory, claim_delay: float = 0.0) -> None:
        super().__init__(f"schedd@{host}", clock, outbox)
        self.host = host
        self.config = config
        self.directory = directory
        self.claim_delay = claim_delay
        self.jobs: dict[str, Job] = {}
        self.next_cluster = 1
        self.up = False
        self.start_time = clock.now
        self.alive_interval = config.number("ALIVE_INTERVAL", 300)
        self.alive_anchor = clock.now
        self._claims: dict[int, Job] = {}  # id(claim) -> job it serves
        self._deferred: list[Callable[[], None]] = []
        self._submitters: set[str] = set()
        self._timer: Timer | None = None
        # the schedd's job statistics as its Scheduler ad publishes them (lifetime counts, and
        # the starts within the last STATISTICS_WINDOW_SECONDS for RecentJobsStarted)
        self.job_stats = {"JobsSubmitted": 0, "JobsStarted": 0, "JobsCompleted": 0}
        self._recent_starts: deque[float] = deque()
        self.rejections: list[tuple[float, SubmitRejectedError]] = []
        self.submit_warnings: dict[int, list[str]] = {}

    @property
    def uid_domain(self) -> str:
        """UID_DOMAIN: the domain of every submitter name."""
        return self.config.get("UID_DOMAIN", "example.org") or "example.org"

    # ---- lifecycle -----------------------------------------------------------------------

    def boot(self) -> None:
        """Start (or restart) the daemon: publish ads and arm the SCHEDD_INTERVAL timer."""
        self.up = True
        self.start_time = self.clock.now
        self.alive_anchor = self.clock.now
        self.publish()
        self._arm()

    def _arm(self) -> None:
        if self._timer:
            self._timer.cancel()
        self._timer = self.clock.call_later(self.config.number("SCHEDD_INTERVAL", 300), self._periodic)

    def _periodic(self) -> None:
        self._timer = None
        if self.up:
            self.publish()
            self._arm()

    def go_down(self) -> None:
        """The schedd stops (crash, condor_off): keep-alives stop, claim leases start to run."""
        if not self.up:
            return
        self.up = False
        if self._timer:
            self._timer.cancel()
            self._timer = None
        now = self.clock.now
        ticks = int((now - self.alive_anchor) // self.alive_interval) if self.alive_interval > 0 else 0
        last_tick = self.alive_anchor + ticks * self.alive_interval
        for job in self.jobs.values():
            if job.claim is not None:
                startd = job.claim.slot.startd
                startd.alives_stopped(job.claim, max(last_tick, job.claim.claimed_at))

    def come_up(self) -> None:
        """The schedd is back: alives resume on surviving claims; queued reports are handled."""
        if self.up:
            return
        self.up = True
        self.alive_anchor = self.clock.now
        for job in list(self.jobs.values()):
            if job.claim is not None:
                job.claim.slot.startd.alives_resumed(job.claim)
        deferred, self._deferred = self._deferred, []
        for call in deferred:
            call()
        self.publish()
        self._arm()

    # ---- submission -------------------------------------------------------------------------

    def submit(self, desc: JobDescription, durations: list[float]) -> list[Job]:
        """condor_submit: one cluster with a proc per duration (`queue N`). The submit
        requirements see every job ad first: one failing job rejects the whole cluster
        (SubmitRejectedError); warnings are kept in `submit_warnings[cluster]`."""
        now = self.clock.now
        cluster = self.next_cluster
        group, submitter = submitter_name(desc.owner, self.uid_domain, desc.accounting_group,
                                          desc.accounting_group_user, desc.nice_user)
        ads = [self._job_ad(desc, cluster, proc, group, now) for proc in range(len(durations))]
        transforms = job_transforms(self.config)
        if transforms:
            transform_cluster(transforms, ads, now)
        requirements = submit_requirements(self.config)
        try:
            warnings = check_cluster(requirements, self.scheduler_ad(), ads, now) if requirements else []
        except SubmitRejectedError as exc:
            self.rejections.append((now, exc))  # never entered the queue: kept for the user
            raise
        self.next_cluster += 1
        self.submit_warnings[cluster] = warnings
        jobs = []
        for proc, (ad, duration) in enumerate(zip(ads, durations)):
            if transforms and isinstance(ad.get("AccountingGroup"), str):
                submitter = f"{ad['AccountingGroup']}@{self.uid_domain}"  # a transform chose it
            job = Job(cluster, proc, ad, submitter, float(duration), desc.vacate_time, desc.exit_code,
                      cpu_efficiency=desc.cpu_efficiency)
            self._schedule_cron(job, now)
            self.jobs[job.job_id] = job
            jobs.append(job)
            self.emit(JobSubmitted(job_id=job.job_id, schedd=self.source, submitter=submitter,
                                   ad=classads.attrs_to_json(ad)))
            self.job_stats["JobsSubmitted"] += 1
        if submitter not in self._submitters and self.up:
            self._publish_submitter(submitter)
        return jobs

    def _job_ad(self, d: JobDescription, cluster: int, proc: int, group: str | None,
                now: float) -> dict[str, Any]:
        uid = self.uid_domain
        clauses = [f"(TARGET.Arch == \"{self.config.get('ARCH', 'X86_64')}\")",
                   f"(TARGET.OpSys == \"{self.config.get('OPSYS', 'LINUX')}\")",
                   "(TARGET.Disk >= RequestDisk)", "(TARGET.Memory >= RequestMemory)",
                   "(TARGET.Cpus >= RequestCpus)"]
        clauses += [f"(TARGET.{name} >= Request{name})" for name in d.request]
        clauses.append("(TARGET.HasFileTransfer)")
        requirements = " && ".join(clauses)
        if d.requirements:
            requirements = f"({d.requirements}) && {requirements}"
        iwd = d.iwd or f"/home/{d.owner}"
        ad: dict[str, Any] = {
            "MyType": "Job", "TargetType": "Machine",
            "ClusterId": cluster, "ProcId": proc,
            "GlobalJobId": f"{self.host}#{cluster}.{proc}#{int(now)}",
            "Owner": d.owner, "User": f"{d.owner}@{uid}",
            "JobUniverse": VANILLA, "Cmd": d.cmd, "Args": d.args, "Iwd": iwd,
            "In": "/dev/null", "Out": f"{iwd}/job.{cluster}.{proc}.out",
            "Err": f"{iwd}/job.{cluster}.{proc}.err",
            "QDate": int(now), "EnteredCurrentStatus": int(now), "JobStatus": IDLE,
            "LastJobStatus": 0, "JobPrio": int(d.priority),
            "RequestCpus": int(d.request_cpus), "RequestMemory": int(d.request_memory),
            "RequestDisk": int(d.request_disk),
            "Requirements": expr(requirements),
            "Rank": expr(d.rank) if d.rank else 0.0,
            "KillSig": d.kill_sig, "NiceUser": bool(d.nice_user),
            "NumJobStarts": 0, "JobRunCount": 0, "NumShadowStarts": 0, "NumJobMatches": 0,
            "NumRestarts": 0, "NumSystemHolds": 0, "NumHolds": 0,
            "RemoteWallClockTime": 0.0, "CumulativeSuspensionTime": 0, "CumulativeSlotTime": 0.0,
            "CommittedTime": 0, "CommittedSlotTime": 0.0, "CommittedSuspensionTime": 0,
            "TotalSuspensions": 0, "ExitBySignal": False,
            "MinHosts": 1, "MaxHosts": 1, "CurrentHosts": 0, "CoreSize": 0,
            "ImageSize": 1000, "DiskUsage": 1000, "ExecutableSize": 1000,
            "ShouldTransferFiles": "IF_NEEDED", "WhenToTransferOutput": "ON_EXIT",
            "OnExitRemove": True, "OnExitHold": False, "PeriodicHold": False,
            "PeriodicRelease": False, "PeriodicRemove": False, "LeaveJobInQueue": False,
            "JobNotification": 0, "TransferIn": False, "WantCheckpoint": False,
            "MyJobSubmitHost": f"<{self.host}:9618>",
        }
        for name, amount in d.request.items():
            ad[f"Request{name}"] = int(amount)
        if group:
            ad["AccountingGroup"] = group
            ad["AcctGroup"] = group.rsplit(".", 1)[0]
            ad["AcctGroupUser"] = group.rsplit(".", 1)[1]
        if d.concurrency_limits:
            ad["ConcurrencyLimits"] = d.concurrency_limits
        if d.job_lease_duration:
            ad["JobLeaseDuration"] = int(d.job_lease_duration)
        if d.max_retirement_time is not None:
            ad["MaxJobRetirementTime"] = d.max_retirement_time
        elif d.nice_user:
            ad["MaxJobRetirementTime"] = 0  # seed 001: nice_user jobs default to no retirement
        if d.job_max_vacate_time is not None:
            ad["JobMaxVacateTime"] = d.job_max_vacate_time
        for k, v in d.attrs.items():
            ad[k] = expr(v[6:-2]) if isinstance(v, str) and v.startswith("/Expr(") and v.endswith(")/") else v
        if not d.on_exit_remove:
            ad["OnExitRemove"] = False
        for name, text in d.cron.items():
            ad[crontab.FIELDS[name][0]] = str(text)
        if d.deferral_time is not None:
            e = expr(d.deferral_time)
            ad["DeferralTime"] = e if not classads.is_constant(e) else \
                classads.evaluate_policy(e, {}, None, now)
        if d.deferral_window is not None:
            ad["DeferralWindow"] = int(d.deferral_window)
        if d.deferral_prep_time is not None:
            ad["DeferralPrepTime"] = int(d.deferral_prep_time)
        return ad

    # ---- the negotiator's view ---------------------------------------------------------

    def idle_jobs(self) -> list[JobView]:
        """Idle jobs, in the order this schedd offers them: by submitter, then JobPrio (higher
        first), then QDate and job id."""
        if not self.up:
            return []
        now = self.clock.now
        jobs = sorted((j for j in self.jobs.values() if j.idle and self._due(j, now)),
                      key=lambda j: (j.submitter, -int(j.ad["JobPrio"]), j.ad["QDate"], j.cluster, j.proc))
        return [j.view(self.source) for j in jobs]

    def _limits(self) -> tuple[int, int]:
        """MAX_JOBS_RUNNING and MAX_JOBS_PER_OWNER (HTCondor's defaults 10000 and 100000)."""
        return (int(self.config.number("MAX_JOBS_RUNNING", 10000)),
                int(self.config.number("MAX_JOBS_PER_OWNER", 100000)))

    def _room(self) -> tuple[int, dict[str, int]] | None:
        """How many more jobs may start: in all, and per owner (running or being claimed
        count); None when the limits cannot bind (fewer jobs in the queue than either)."""
        total, per_owner = self._limits()
        if len(self.jobs) <= min(total, per_owner):
            return None
        active: dict[str, int] = {}
        for j in self.jobs.values():
            if j.status == RUNNING or j.pending:
                active[str(j.ad["Owner"])] = active.get(str(j.ad["Owner"]), 0) + 1
        return total - sum(active.values()), {o: per_owner - n for o, n in active.items()}

    # ---- matches and claims -------------------------------------------------------------

    def on_match(self, match: Matched, startd: Startd) -> None:
        """The negotiator told us about a match: claim the slot for the job (or another
        runnable job of the same submitter when that one is no longer idle)."""
        if not self.up:
            return
        job = self.jobs.get(match.job_id)
        if job is None or not job.idle:
            job = next((j for j in self._runnable(match.submitter)), None)
        if job is None:
            return
        room = self._room()
        if room is not None and (room[0] <= 0 or room[1].get(str(job.ad["Owner"]), self._limits()[1]) <= 0):
            return  # MAX_JOBS_RUNNING / MAX_JOBS_PER_OWNER reached: no claim, the match lapses
        job.pending = True
        matched_at = self.clock.now
        if self.claim_delay > 0:
            self.clock.call_later(self.claim_delay, lambda: self._claim(job, startd, match, matched_at))
        else:
            self._claim(job, startd, match, matched_at)

    def _runnable(self, submitter: str) -> list[Job]:
        now = self.clock.now
        return sorted((j for j in self.jobs.values()
                       if j.idle and j.submitter == submitter and self._due(j, now)),
                      key=lambda j: (-int(j.ad["JobPrio"]), j.ad["QDate"], j.cluster, j.proc))

    # ---- job deferral and CronTab (seed 003) --------------------------------------------

    def _deferral_time(self, job: Job) -> float | None:
        """The job's DeferralTime (an expression such as `QDate + 60`), None without one."""
        value = job.ad.get("DeferralTime")
        if value is None:
            return None
        if isinstance(value, classads.Expr):
            value = classads.evaluate_policy(value, job.ad, None, self.clock.now)
        return classads.as_number(value, math.nan)

    def _due(self, job: Job, now: float) -> bool:
        """Whether a deferred job may be matched now: the seed's
        `(time() + SCHEDD_INTERVAL) >= (DeferralTime - DeferralPrepTime)`."""
        if "DeferralTime" not in job.ad:
            return True
        deferral = self._deferral_time(job)
        if deferral is None or math.isnan(deferral):
            return True  # an unusable DeferralTime is the starter's to refuse (held)
        prep = float(job.ad.get("DeferralPrepTime", 0) or 0)
        return now + self.config.number("SCHEDD_INTERVAL", 300) >= deferral - prep

    def _schedule_cron(self, job: Job, now: float) -> None:
        """A CronTab job's next DeferralTime, computed when it enters (or re-enters) the queue."""
        fields = {f: str(job.ad[attr]) for f, (attr, _, _) in crontab.FIELDS.items() if attr in job.ad}
        if fields:
            job.ad["DeferralTime"] = crontab.CronTab.parse(fields).next_run(now)

    def _missed_deferral(self, job: Job, claim: Claim) -> float | None:
        """Seconds the job must wait on its claim before executing (0 without a deferral);
        None when it arrived later than DeferralTime + DeferralWindow: then it is held, or,
        for a CronTab job, stays Idle until its next scheduled time."""
        deferral = self._deferral_time(job)
        if deferral is None:
            return 0.0
        now = self.clock.now
        window = float(job.ad.get("DeferralWindow", 0) or 0)
        if not math.isnan(deferral) and now - deferral <= window:
            return max(0.0, deferral - now)
        if any(attr in job.ad for attr, _, _ in crontab.FIELDS.values()):
            self._schedule_cron(job, now)  # a CronTab job waits for its next time (seed 003)
            return None
        ad = job.ad
        ad["LastJobStatus"] = ad["JobStatus"]
        ad["JobStatus"] = HELD
        ad["EnteredCurrentStatus"] = int(now)
        ad["HoldReason"] = "Job missed deferred execution time"
        ad["HoldReasonCode"] = 20  # CONDOR_HOLD_CODE::MissedDeferredExecutionTime
        ad["HoldReasonSubCode"] = 0
        ad["NumHolds"] = int(ad["NumHolds"]) + 1
        self.emit(JobStopped(job_id=job.job_id, slot=claim.slot.name, reason="held",
                             schedd=self.source, submitter=job.submitter))
        return None

    def _request(self, job: Job) -> ClaimRequest:
        lease = float(job.ad.get("JobLeaseDuration") or 0)
        if lease <= 0:
            lease = self.config.number("MAX_CLAIM_ALIVES_MISSED", 6) * self.alive_interval
        return ClaimRequest(job_id=job.job_id, schedd=self.source, schedd_host=self.host,
                            submitter=job.submitter, owner=str(job.ad["User"]),
                            accounting_group=job.ad.get("AccountingGroup"), job_ad=job.ad,
                            lease_duration=lease)

    def _claim(self, job: Job, startd: Startd, match: Matched, matched_at: float) -> None:
        """Send the claim request; a match older than MATCH_TIMEOUT is stale (the startd has
        given it up and its claim id with it)."""
        stale = self.clock.now - matched_at > self.config.number("MATCH_TIMEOUT", 120)
        if not self.up or job.status != IDLE or job.claim is not None or stale:
            job.pending = False
            return
        claim = startd.claim(match.slot, self._request(job), self, match)
        if claim is None:
            job.pending = False
            return
        job.claim = claim
        self._claims[id(claim)] = job
        job.ad["NumJobMatches"] = int(job.ad["NumJobMatches"]) + 1
        job.ad["LastMatchTime"] = int(self.clock.now)
        if claim.active:
            self._activate(job, claim)

    def _activate(self, job: Job, claim: Claim) -> None:
        """Spawn the job on the claim (Claimed/Idle -> Busy) and say so (`job.started`). A
        deferred job holds the claim, Running, until its DeferralTime; one that arrives
        after DeferralTime + DeferralWindow is held instead (seed 003)."""
        startd = claim.slot.startd
        wait = self._missed_deferral(job, claim)
        if wait is None:
            self._unclaim(job)
            startd.release(claim)
            return
        if not startd.activate(claim, wait + job.duration, job.vacate_time):
            self._unclaim(job)
            startd.release(claim)
            return
        now = int(self.clock.now)
        lease = float(job.ad.get("JobLeaseDuration") or 0)
        if lease > 0:
            self.alive_interval = min(self.alive_interval, max(10.0, lease / 3))
        slot = claim.slot
        slot_ad = startd.ad(slot)
        resources = {k: slot_ad[k] for k in ("Cpus", "Memory", "Disk")}
        assert startd.machine is not None
        for res in startd.machine.custom:
            if slot.free.get(res):
                resources[res] = slot.free[res]
        ad = job.ad
        ad["LastJobStatus"] = ad["JobStatus"]
        ad["JobStatus"] = RUNNING
        ad["EnteredCurrentStatus"] = now
        ad.setdefault("JobStartDate", now)
        ad["JobCurrentStartDate"] = now
        ad["JobCurrentStartExecutingDate"] = int(now + wait)
        ad["NumJobStarts"] = int(ad["NumJobStarts"]) + 1
        ad["JobRunCount"] = int(ad["JobRunCount"]) + 1
        ad["NumShadowStarts"] = int(ad["NumShadowStarts"]) + 1
        ad["RemoteHost"] = slot.name
        ad["StartdPrincipal"] = f"execute-side@matchsession/{startd.host}"
        ad["CurrentHosts"] = 1
        for k, v in resources.items():
            ad[k] = v
            ad[f"{k}Provisioned"] = v
        ad["MachineAttrSlotWeight0"] = slot_ad["SlotWeight"]
        job.pending = False
        self.emit(JobStarted(job_id=job.job_id, schedd=self.source, submitter=job.submitter,
                             slot=slot.name, slot_weight=float(slot_ad["SlotWeight"]),
                             resources=resources,
                             concurrency_limits=str(ad.get("ConcurrencyLimits", ""))))
        self.job_stats["JobsStarted"] += 1
        self._recent_starts.append(self.clock.now)

    def _unclaim(self, job: Job) -> None:
        if job.claim is not None:
            self._claims.pop(id(job.claim), None)
        job.claim = None
        job.pending = False

    # ---- ClaimOwner: what the startds report --------------------------------------------

    def _later(self, call: Callable[[], None]) -> bool:
        """While down, reports wait for the schedd to come back (the shadow reconnects)."""
        if self.up:
            return False
        self._deferred.append(call)
        return True

    def claim_ready(self, claim: Claim) -> None:
        """A claim that waited for a preemption is ours: start its job."""
        if self._later(lambda: self.claim_ready(claim)):
            return
        job = self._claims.get(id(claim))
        if job is not None and job.claim is claim and job.status == RUNNING:
            return  # already activated when the claim request returned
        if job is None or job.status != IDLE or claim.closed:
            claim.slot.startd.release(claim)
            return
        self._activate(job, claim)

    def job_exited(self, claim: Claim) -> None:
        """The job completed: it leaves the queue (history), the claim is reused or released."""
        exit_time = self.clock.now
        if self._later(lambda: self._completed(claim, exit_time)):
            return
        self._completed(claim, exit_time)

    def _completed(self, claim: Claim, exit_time: float) -> None:
        job = self._claims.get(id(claim))
        if job is None:
            return
        self._end_run(job, claim, exit_time)
        ad = job.ad
        ad["LastJobStatus"] = ad["JobStatus"]
        ad["JobStatus"] = COMPLETED
        ad["EnteredCurrentStatus"] = int(exit_time)
        ad["CompletionDate"] = int(exit_time)
        ad["ExitCode"] = job.exit_code
        ad["ExitStatus"] = job.exit_code
        ad["ExitBySignal"] = False
        ad["JobDuration"] = float(exit_time - int(ad["JobCurrentStartDate"]))
        ad["CommittedTime"] = int(ad["CommittedTime"]) + int(exit_time - int(ad["JobCurrentStartDate"]))
        ad["CommittedSlotTime"] = float(ad["CommittedSlotTime"]) + \
            (exit_time - int(ad["JobCurrentStartDate"])) * float(ad.get("MachineAttrSlotWeight0", 1))
        ad["CommittedSuspensionTime"] = int(ad["CommittedSuspensionTime"]) + int(claim.suspended_total)
        self.emit(JobStopped(job_id=job.job_id, slot=claim.slot.name, reason="completed",
                             schedd=self.source, submitter=job.submitter))
        self.job_stats["JobsCompleted"] += 1
        if ad.get("OnExitRemove", True) is False:
            # on_exit_remove = false: the job stays in the queue, Idle, keeping its id (seed 003)
            ad["LastJobStatus"] = COMPLETED
            ad["JobStatus"] = IDLE
            ad.pop("RemoteHost", None)
            self._schedule_cron(job, exit_time)
        else:
            self._leave_queue(job)
        self._unclaim(job)
        self._reuse_or_release(claim)

    def job_evicted(self, claim: Claim, reason: StopReason) -> None:
        """The job stopped early: back to Idle (or Held/Removed when we asked)."""
        now = self.clock.now
        if self._later(lambda: self._evicted(claim, reason, now)):
            return
        self._evicted(claim, reason, now)

    def _evicted(self, claim: Claim, reason: StopReason, when: float) -> None:
        job = self._claims.get(id(claim))
        if job is None:
            return
        self._end_run(job, claim, when)
        ad = job.ad
        ad["LastVacateTime"] = int(when)
        if not claim.stop_reported:
            self.emit(JobStopped(job_id=job.job_id, slot=claim.slot.name, reason=reason,
                                 schedd=self.source, submitter=job.submitter))
        if reason != "removed":
            ad.pop("RemoteHost", None)  # only a job that is running (or leaving) has one
        if reason not in ("removed", "held"):
            ad["LastJobStatus"] = ad["JobStatus"]
            ad["JobStatus"] = IDLE
            ad["EnteredCurrentStatus"] = int(when)
        self._unclaim(job)

    def claim_closed(self, claim: Claim) -> None:
        """The startd dropped the claim; a job still waiting on it becomes runnable again."""
        if self._later(lambda: self.claim_closed(claim)):
            return
        job = self._claims.pop(id(claim), None)
        if job is not None and job.claim is claim:
            job.claim = None
            job.pending = False

    def _end_run(self, job: Job, claim: Claim, when: float) -> None:
        """Fold one run into the job's totals (RemoteWallClockTime, suspension, slot time)."""
        ad = job.ad
        start = ad.get("JobCurrentStartDate")
        if start is None or ad["JobStatus"] != RUNNING:
            return
        wall = max(0.0, when - float(start))
        ad["RemoteWallClockTime"] = float(ad["RemoteWallClockTime"]) + wall
        ad["CumulativeSlotTime"] = float(ad["CumulativeSlotTime"]) + \
            wall * float(ad.get("MachineAttrSlotWeight0", 1))
        ad["CumulativeSuspensionTime"] = int(ad["CumulativeSuspensionTime"]) + int(claim.suspended_total)
        ad["TotalSuspensions"] = int(ad["TotalSuspensions"]) + claim.suspensions
        if job.cpu_efficiency is not None:  # the shadow's usage update; all of it user time
            cpu = max(0.0, wall - claim.suspended_total) * job.cpu_efficiency * \
                float(ad.get("CpusProvisioned", ad["RequestCpus"]))
            ad["RemoteUserCpu"], ad["RemoteSysCpu"] = cpu, 0.0  # the last attempt's
            ad["CumulativeRemoteUserCpu"] = float(ad.get("CumulativeRemoteUserCpu", 0.0)) + cpu
            ad["CumulativeRemoteSysCpu"] = 0.0
        ad["LastRemoteHost"] = ad.get("RemoteHost", claim.slot.name)
        ad["CurrentHosts"] = 0

    def _reuse_or_release(self, claim: Claim) -> None:
        """Run the submitter's next matching job on the same claim until CLAIM_WORKLIFE, else
        give the claim back."""
        slot = claim.slot
        startd = slot.startd
        if claim.closed or slot.claim is not claim or slot.state != "Claimed" or slot.activity != "Idle":
            return
        if self.up and startd.accepts_more_jobs(claim):
            slot_ad = startd.ad(slot)
            for job in self._runnable(claim.request.submitter):
                if classads.policy_matches(job.ad, slot_ad, self.clock.now):
                    job.pending = True
                    claim.request = self._request(job)
                    job.claim = claim
                    self._claims[id(claim)] = job
                    self._activate(job, claim)
                    return
        startd.release(claim)

    # ---- user commands ------------------------------------------------------------------

    def _select(self, owner: str | None, statuses: tuple[int, ...], limit: int | None) -> list[Job]:
        jobs = [j for j in self.jobs.values()
                if (owner is None or j.ad["Owner"] == owner) and j.status in statuses]
        jobs.sort(key=lambda j: (j.cluster, j.proc))
        return jobs[:limit] if limit is not None else jobs

    def remove(self, owner: str | None, limit: int | None = None, by: str = "") -> int:
        """condor_rm: running jobs are stopped ("removed"), every job leaves with history."""
        jobs = self._select(owner, (IDLE, RUNNING, HELD), limit)
        for job in jobs:
            self._stop_for_command(job, "removed")
            ad = job.ad
            ad["LastJobStatus"] = ad["JobStatus"]
            ad["JobStatus"] = REMOVED
            ad["EnteredCurrentStatus"] = int(self.clock.now)
            ad["CompletionDate"] = int(self.clock.now)
            ad["RemoveReason"] = f"via condor_rm (by user {by or ad['Owner']})"
            self._leave_queue(job)
        return len(jobs)

    def hold(self, owner: str | None, limit: int | None = None, by: str = "") -> int:
        """condor_hold: running jobs are stopped ("held"); jobs stay in the queue, Held."""
        jobs = self._select(owner, (IDLE, RUNNING), limit)
        for job in jobs:
            self._stop_for_command(job, "held")
            ad = job.ad
            ad["LastJobStatus"] = ad["JobStatus"]
            ad["JobStatus"] = HELD
            ad["EnteredCurrentStatus"] = int(self.clock.now)
            ad["HoldReason"] = f"via condor_hold (by user {by or ad['Owner']})"
            ad["HoldReasonCode"] = 1
            ad["HoldReasonSubCode"] = 0
            ad["NumHolds"] = int(ad["NumHolds"]) + 1
        return len(jobs)

    def release_jobs(self, owner: str | None, limit: int | None = None, by: str = "") -> int:
        """condor_release: held jobs become idle again."""
        jobs = self._select(owner, (HELD,), limit)
        for job in jobs:
            ad = job.ad
            ad["LastJobStatus"] = HELD
            ad["JobStatus"] = IDLE
            ad["EnteredCurrentStatus"] = int(self.clock.now)
            ad["ReleaseReason"] = f"via condor_release (by user {by or ad['Owner']})"
            self._schedule_cron(job, self.clock.now)  # a new DeferralTime on release (seed 003)
            for k in ("HoldReason", "HoldReasonCode", "HoldReasonSubCode"):
                ad.pop(k, None)
        return len(jobs)

    def set_prio(self, owner: str | None, value: int, limit: int | None = None) -> int:
        """condor_prio: set JobPrio of queued jobs (running ones keep running, seed 003)."""
        jobs = self._select(owner, (IDLE, RUNNING, HELD), limit)
        for job in jobs:
            job.ad["JobPrio"] = int(value)
        return len(jobs)

    def _stop_for_command(self, job: Job, reason: StopReason) -> None:
        claim = job.claim
        if claim is None:
            job.pending = False
            return
        startd = claim.slot.startd
        if claim.running and claim.slot.claim is claim:
            startd.deactivate(claim, reason)
        self._unclaim(job)
        startd.release(claim)

    def _leave_queue(self, job: Job) -> None:
        """The job leaves the queue: its final ad goes to the history (`job.history`)."""
        self.jobs.pop(job.job_id, None)
        self.emit(JobHistory(ad=classads.attrs_to_json(job.ad)))

    # ---- ads -------------------------------------------------------------------------------

    def _counts(self) -> dict[str, dict[str, float]]:
        """Per submitter its jobs by status and their weights (each queued job once: the
        schedd's ads every SCHEDD_INTERVAL walk the whole queue)."""
        counts: dict[str, dict[str, float]] = {}
        for job in self.jobs.values():
            c = counts.get(job.submitter)
            if c is None:
                c = counts[job.submitter] = {"IdleJobs": 0, "RunningJobs": 0, "HeldJobs": 0,
                                             "WeightedIdleJobs": 0.0, "WeightedRunningJobs": 0.0}
            ad = job.ad
            status = int(ad["JobStatus"])  # Job.status, read once
            if status == IDLE:
                c["IdleJobs"] += 1
                c["WeightedIdleJobs"] += float(ad["RequestCpus"])
            elif status == RUNNING:
                c["RunningJobs"] += 1
                c["WeightedRunningJobs"] += float(ad.get("MachineAttrSlotWeight0", 1))
            elif status == HELD:
                c["HeldJobs"] += 1
        return counts

    def _publish_submitter(self, submitter: str, counts: dict[str, float] | None = None) -> None:
        if counts is None:
            counts = self._counts().get(submitter, {})
        ad: dict[str, Any] = {
            "MyType": "Submitter", "Name": submitter, "ScheddName": self.host, "Machine": self.host,
            "ScheddIpAddr": f"<{self.host}:9618>", "LastHeardFrom": int(self.clock.now),
            "IdleJobs": int(counts.get("IdleJobs", 0)), "RunningJobs": int(counts.get("RunningJobs", 0)),
            "HeldJobs": int(counts.get("HeldJobs", 0)),
            "WeightedIdleJobs": float(counts.get("WeightedIdleJobs", 0.0)),
            "WeightedRunningJobs": float(counts.get("WeightedRunningJobs", 0.0)),
        }
        self._submitters.add(submitter)
        self.emit(AdUpdated(ad_type="Submitter", name=submitter, ad=ad))

    def _recent_started(self, now: float) -> int:
        """Job starts within the last STATISTICS_WINDOW_SECONDS (HTCondor's Recent* window)."""
        window = self.config.number("STATISTICS_WINDOW_SECONDS", 1200)
        while self._recent_starts and self._recent_starts[0] <= now - window:
            self._recent_starts.popleft()
        return len(self._recent_starts)

    def publish(self) -> None:
        """The Scheduler ad and one Submitter ad per submitter with jobs in the queue."""
        counts = self._counts()
        self.emit(AdUpdated(ad_type="Scheduler", name=self.host, ad=self.scheduler_ad(counts)))
        for submitter in sorted(counts):
            self._publish_submitter(submitter, counts[submitter])
        for gone in sorted(self._submitters - set(counts)):
            self._submitters.discard(gone)
            self.emit(AdInvalidated(ad_type="Submitter", name=gone))

    def scheduler_ad(self, counts: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
        """The Scheduler ad as of now (also MY when submit requirements are evaluated)."""
        if counts is None:
            counts = self._counts()
        totals = {k: sum(c[k] for c in counts.values()) for k in ("IdleJobs", "RunningJobs", "HeldJobs")}
        now = int(self.clock.now)
        return {
            "MyType": "Scheduler", "Name": self.host, "Machine": self.host,
            "ScheddIpAddr": f"<{self.host}:9618>", "DaemonStartTime": int(self.start_time),
            "LastHeardFrom": now, "MyCurrentTime": now,
            "TotalIdleJobs": int(totals["IdleJobs"]), "TotalRunningJobs": int(totals["RunningJobs"]),
            "TotalHeldJobs": int(totals["HeldJobs"]), "TotalJobAds": len(self.jobs),
            "NumUsers": len(counts), "MaxJobsRunning": int(self.config.number("MAX_JOBS_RUNNING", 10000)),
            "MaxJobsPerOwner": self._limits()[1],
            "UidDomain": self.uid_domain, "MyAddress": f"<{self.host}:9618>",
            "RecentJobsStarted": self._recent_started(now), **self.job_stats,
        }

