"""A simulated condor_startd: slots and the machine state/activity machine of seed 001.

Each slot walks Owner -> Unclaimed -> Matched -> Claimed/Idle|Busy|Suspended|Retiring ->
Preempting/Vacating|Killing -> Owner (or Claimed/Idle for a preempting claim), plus Drained.
START, IS_OWNER, RANK, WANT_SUSPEND, SUSPEND, CONTINUE, PREEMPT, WANT_VACATE, KILL,
MAXJOBRETIREMENTTIME and MachineMaxVacateTime are evaluated with classad2 against the claim's
job; MATCH_TIMEOUT, retirement, vacating and the claim lease are timers on the virtual clock.
Every state change publishes the slot's ad (`ad.updated`, MyType "Machine").
"""
from __future__ import annotations

import functools
import math
import re
import time as _time_fmt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import classad2

from schemas import classads
from schemas.classads import Expr, as_number, evaluate_policy, expr, is_false, is_true, plain
from schemas.errors import ClassAdError
from schemas.events import AdInvalidated, AdUpdated, Envelope, JobStopped, Matched, StopReason
from schemas.settings import DaemonConfig
from services.pool.clock import Timer, VirtualClock
from services.pool.daemon import Daemon
from services.pool.errors import PoolConfigError
from services.pool.slots import MachineResources, detect, layout

#: Policy knobs the startd evaluates (and keeps in the slot's evaluation scope).
POLICY = ("START", "IS_OWNER", "RANK", "WANT_SUSPEND", "WANT_VACATE", "SUSPEND", "CONTINUE",
          "PREEMPT", "KILL", "MAXJOBRETIREMENTTIME", "MachineMaxVacateTime")
#: Preemption causes that honour retirement (MaxJobRetirementTime) before Preempting.
_RETIRING_CAUSES = {"owner", "rank", "priority", "drain", "shutdown"}
#: condor_drain's schedules -> preemption cause (graceful retires, quick vacates, fast kills)
DRAIN_CAUSES = {"graceful": "drain", "quick": "drain_quick", "fast": "drain_fast"}
#: job.stopped reason for each preemption cause (DESIGN.md's reasons, by who broke the claim).
STOP_REASON: dict[str, StopReason] = {
    "rank": "preempted", "priority": "preempted",  # a better match (negotiator)
    "owner": "vacated", "vacate": "vacated", "start": "vacated",  # startd policy / condor_vacate
    "lease": "evicted", "drain": "evicted", "drain_quick": "evicted", "drain_fast": "evicted",
    "shutdown": "evicted", "shutdown_fast": "evicted", "release": "evicted",
}
_ATTR_OF = {"Swap": "VirtualMemory"}
_MISSING = object()


@functools.lru_cache(maxsize=4096)
def _constant_value(text: str) -> Any:
    """The value of the policy expression `text` when it references nothing
    (`classads.is_constant`), else `_MISSING`."""
    e = expr(text)
    return e.tree.eval() if classads.is_constant(e) else _MISSING


VANILLA_UNIVERSE = 5


def _attr(resource: str) -> str:
    return _ATTR_OF.get(resource, resource)


def startd_attr_knobs(config: DaemonConfig, slot_id: int, slot_type: int) -> dict[str, str]:
    """Attribute name -> the knob holding its value, for the attributes a slot advertises
    from its configuration (seed 001): the names listed in STARTD_ATTRS (and the older
    STARTD_EXPRS), then SLOT_TYPE_<T>_STARTD_ATTRS, then SLOT<N>_STARTD_ATTRS; the value is
    SLOT<N>_<name>, else SLOT_TYPE_<T>_<name>, else <name>. Names with no (or an empty)
    value are left out."""
    names: dict[str, str] = {}
    for knob in ("STARTD_ATTRS", "STARTD_EXPRS", f"SLOT_TYPE_{slot_type}_STARTD_ATTRS",
                 f"SLOT{slot_id}_STARTD_ATTRS"):
        for name in re.split(r"[\s,]+", config.get(knob) or ""):
            if name:
                names.setdefault(name.lower(), name)
    out: dict[str, str] = {}
    for name in names.values():
        for knob in (f"SLOT{slot_id}_{name}", f"SLOT_TYPE_{slot_type}_{name}", name):
            if config.defined(knob):
                if (config.get(knob) or "").strip():
                    out[name] = knob
                break
    return out


class ClaimOwner(Protocol):
    """What the startd tells the schedd that holds a claim (the schedd implements it)."""

    def claim_ready(self, claim: Claim) -> None:
        """A claim that waited for a preemption is now Claimed/Idle: activate it."""

    def job_exited(self, claim: Claim) -> None:
        """The job finished on its own (the starter exited normally)."""

    def job_evicted(self, claim: Claim, reason: StopReason) -> None:
        """The job was stopped before finishing; `reason` says why."""

    def claim_closed(self, claim: Claim) -> None:
        """The claim is gone (released, preempted, lease expired, refused)."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a schedd presents when claiming: the job's ad and who it belongs to."""

    job_id: str
    schedd: str  # daemon name, e.g. schedd@ap1.example.org
    schedd_host: str
    submitter: str
    owner: str  # User, e.g. alice@example.org
    accounting_group: str | None
    job_ad: Mapping[str, Any]
    lease_duration: float


@dataclass(eq=False)
class Claim:
    """One claim on a slot: who holds it and the state of the job running under it."""

    id: str
    request: ClaimRequest
    owner: ClaimOwner
    slot: Slot
    rank: float
    claimed_at: float
    active: bool = False  # Claimed (not waiting for a preemption)
    job_start: float | None = None  # JobStart of the current activation
    running_since: float | None = None  # None while suspended or idle
    remaining: float = 0.0  # run seconds the job still needs
    suspended_total: float = 0.0
    suspended_since: float | None = None
    #: run and suspended seconds of the jobs this claim ran before the current one
    #: (TotalClaimRunTime/TotalClaimSuspendTime add the current job's)
    claim_run_total: float = 0.0
    claim_suspend_total: float = 0.0
    suspensions: int = 0
    vacate_time: float = 0.0  # seconds the job takes to exit after its soft kill signal
    exit_timer: Timer | None = None
    lease_timer: Timer | None = None
    stop_reported: bool = False
    closed: bool = False

    @property
    def job_id(self) -> str:
        """The job this claim runs (or is about to)."""
        return self.request.job_id

    @property
    def running(self) -> bool:
        """A starter is running a job under this claim (Busy, Suspended, Retiring, Vacating)."""
        return self.job_start is not None


@dataclass(eq=False)
class Slot:
    """One slot ad's worth of state: resources, state/activity, the claim(s)."""

    startd: Startd
    slot_id: int
    slot_type: int
    kind: str  # "Static" | "Partitionable" | "Dynamic"
    total: dict[str, int]
    free: dict[str, int]
    ids: dict[str, list[str]]
    name: str
    state: str = "Owner"
    activity: str = "Idle"
    entered_state: float = 0.0
    entered_activity: float = 0.0
    claim: Claim | None = None
    next_claim: Claim | None = None
    match: Matched | None = None
    match_timer: Timer | None = None
    timers: list[Timer] = field(default_factory=list)
    cause: str | None = None  # why the current claim is being preempted
    retiring: bool = False
    parent: Slot | None = None
    children: list[Slot] = field(default_factory=list)
    next_sub_id: int = 1
    gone: bool = False
    #: pslot preemption: the dynamic slots being preempted for the pslot's `next_claim`
    victims: list[Slot] = field(default_factory=list)

    def cancel_timers(self) -> None:
        """Drop the state timers (retirement, vacate); job and lease timers are the claim's."""
        for t in self.timers:
            t.cancel()
        self.timers.clear()


@dataclass(frozen=True, slots=True)
class Hardware:
    """The machine a startd runs on, as the scenario describes it."""

    cpus: int = 1
    memory: int = 1024  # MB
    disk: int = 10_000_000  # KB
    swap: int | None = None  # KB
    gpus: int | tuple[str, ...] = 0


@dataclass(eq=False)
class _EvalAd:
    """A slot's evaluation ads kept between evaluations: rebuilt when the claim or policy
    changes, otherwise only changed attributes are updated (polling stays cheap)."""

    key: tuple[Any, ...]
    my: classad2.ClassAd
    target: classad2.ClassAd | None
    last: dict[str, Any]


class Startd(Daemon):
    """The condor_startd of one execute machine (source `startd@<host>`)."""

    def __init__(self, host: str, config: DaemonConfig, hardware: Hardware, clock: VirtualClock,
                 outbox: list[Envelope], attrs: Mapping[str, Any] | None = None,
                 periodic_updates: bool = False) -> None:
        super().__init__(f"startd@{host}", clock, outbox)
        self.host = host
        self.config = config
        self.hardware = hardware
        self.attrs: dict[str, Any] = {}
        self.owner_load = 0.0
        self.keyboard_until = clock.now - config.number("DISCONNECTED_KEYBOARD_IDLE_BOOST", 1200)
        self.periodic_updates = periodic_updates
        self.slots: list[Slot] = []
        self.published: dict[str, dict[str, Any]] = {}
        self.machine: MachineResources | None = None
        self.draining = False
        self.drain_reason = ""
        self.resume_on_completion = False
        #: TotalMachineDrainingUnclaimedTime / TotalMachineDrainingBadput (cpu-seconds)
        self.drain_unclaimed = 0.0
        self.drain_badput = 0.0
        self._drain_mark = clock.now
        self._changes = 0  # state changes so far: keys the machine-wide draining estimate
        self._expected: tuple[float, int, dict[str, Any]] | None = None
        self.shutting_down: str | None = None
        self.up = False
        self.boot_time = clock.now
        self._claims = 0
        self._policy: dict[tuple[str, bool], Expr] = {}
        self._generation = 0
        self._eval: dict[tuple[str, bool], _EvalAd] = {}
        self._constant: dict[tuple[tuple[str, ...], int], bool] = {}
        self._weights: dict[tuple[Any, ...], float] = {}
        self._weight_knobs: dict[tuple[int, int], str] = {}
        self._startd_attr_cache: dict[tuple[int, int, int], dict[str, Any]] = {}
        self._poll: Timer | None = None
        self._poll_at = math.inf
        self._update_timer: Timer | None = None
        if attrs:
            self._apply_attrs(attrs)

    # ---- lifecycle -------------------------------------------------------------------

    def boot(self) -> None:
        """Start the daemon: build the slots (all Owner), publish, then evaluate IS_OWNER."""
        gpus = self.hardware.gpus
        self.machine = detect(self.config, cpus=self.hardware.cpus, memory=self.hardware.memory,
                              disk=self.hardware.disk, swap=self.hardware.swap,
                              gpus=list(gpus) if isinstance(gpus, tuple) else gpus)
        specs = layout(self.config, self.machine)
        now = self.clock.now
        self.boot_time = now
        self.up = True
        self.shutting_down = None
        self.draining = False
        self.slots = []
        for spec in specs:
            kind = "Partitionable" if spec.partitionable else "Static"
            slot = Slot(self, spec.slot_id, spec.slot_type, kind, dict(spec.resources),
                        dict(spec.resources), {r: list(v) for r, v in spec.assigned.items()},
                        f"slot{spec.slot_id}@{self.host}", entered_state=now, entered_activity=now)
            self.slots.append(slot)
        for slot in self.slots:
            self.publish(slot)
        self.evaluate_all()
        if self.periodic_updates:
            self._update_timer = self.clock.call_later(self.config.number("UPDATE_INTERVAL", 300),
                                                       self._periodic)

    def shutdown(self, fast: bool = False) -> None:
        """condor_off -startd: retire (graceful) or kill (fast) claims, then withdraw the slots."""
        if not self.up:
            return
        self.shutting_down = "shutdown_fast" if fast else "shutdown"
        for slot in list(self.all_slots()):
            if slot.claim is not None:
                self._begin_preempt(slot, self.shutting_down)
        self._finish_shutdown()

    def _finish_shutdown(self) -> None:
        if self.shutting_down is None or any(s.claim is not None for s in self.all_slots()):
            return
        for slot in list(self.all_slots()):
            if slot.match_timer:
                slot.match_timer.cancel()
            slot.cancel_timers()
            slot.gone = True
            self.withdraw(slot)
        self.slots = []
        self.up = False
        self.shutting_down = None
        for t in (self._poll, self._update_timer):
            if t:
                t.cancel()
        self._poll, self._poll_at = None, math.inf

    def all_slots(self) -> list[Slot]:
        """Every live slot: static and partitionable slots, each followed by its dynamic slots."""
        out: list[Slot] = []
        for slot in self.slots:
            out.append(slot)
            out.extend(slot.children)
        return out

    def slot(self, name: str) -> Slot | None:
        """The live slot called `name` (slot1@host, slot1_2@host)."""
        for slot in self.all_slots():
            if slot.name == name:
                return slot
        return None

    # ---- the slot ad ------------------------------------------------------------------

    def policy(self, knob: str, job: Mapping[str, Any] | None = None) -> Expr:
        """The compiled policy expression; `<KNOB>_VANILLA` wins for vanilla-universe jobs."""
        vanilla = job is not None and job.get("JobUniverse") == 5
        key = (knob, vanilla)
        hit = self._policy.get(key)
        if hit is None:
            text = self.config.get(f"{knob}_VANILLA") if vanilla else None
            if text is None:
                text = self.config.get(knob, "") or ""
            hit = expr(text if text.strip() else "UNDEFINED")
            self._policy[key] = hit
        return hit

    def ad(self, slot: Slot) -> dict[str, Any]:
        """The slot's ClassAd as Python values (Expr for expressions), as published."""
        now = self.clock.now
        assert self.machine is not None
        a: dict[str, Any] = {
            "MyType": "Machine", "TargetType": "Job", "Name": slot.name, "Machine": self.host,
            "SlotID": slot.slot_id, "SlotType": slot.kind, "SlotTypeID": slot.slot_type,
            "PartitionableSlot": slot.kind == "Partitionable",
            "State": slot.state, "Activity": slot.activity,
            "EnteredCurrentState": int(slot.entered_state),
            "EnteredCurrentActivity": int(slot.entered_activity),
            "OpSys": self.config.get("OPSYS", "LINUX"), "Arch": self.config.get("ARCH", "X86_64"),
            "UidDomain": self.config.get("UID_DOMAIN", ""),
            "FileSystemDomain": self.config.get("FILESYSTEM_DOMAIN", self.config.get("UID_DOMAIN", "")),
            "HasFileTransfer": True, "StartdIpAddr": f"<{self.host}:9618>",
            "DaemonStartTime": int(self.boot_time), "LastHeardFrom": int(now),
            "MyCurrentTime": int(now),
        }
        if slot.kind == "Dynamic":
            a["DynamicSlot"] = True  # SlotTypeID stays its pslot's (positive) type, as today's HTCondor
        else:
            self._drain_tick(now)
            a["Draining"] = bool(self.draining)
            a["TotalMachineDrainingUnclaimedTime"] = int(self.drain_unclaimed)
            a["TotalMachineDrainingBadput"] = int(self.drain_badput)
            if self.draining:
                a["DrainReason"] = self.drain_reason
        for res in self.machine.totals:
            attr = _attr(res)
            a[attr] = slot.free.get(res, 0)
            a[f"TotalSlot{attr}"] = slot.total.get(res, 0)
            a[f"Total{attr}"] = self.machine.totals[res]
            if res not in ("Disk", "Swap"):
                a[f"Detected{attr}"] = self.machine.totals[res]
            if res in self.machine.ids:
                a[f"Assigned{attr}"] = ",".join(slot.ids.get(res, []))
        cp = slot.kind == "Partitionable" and self._consumption_policy(slot)
        if slot.kind == "Partitionable":
            a["NumDynamicSlots"] = len(slot.children)
        if cp:
            # what the negotiator needs to match several jobs to this pslot in one cycle
            consumed = ("Cpus", "Memory", "Disk", *self.machine.custom)
            a["MachineResources"] = " ".join((*consumed, "Swap") if "Swap" in self.machine.totals
                                             else consumed)
            for res in consumed:
                a[f"Consumption{res}"] = self._consumption(slot, res)
        kb = max(0, int(now - self.keyboard_until))
        condor_load = 1.0 if slot.claim is not None and slot.claim.running_since is not None else 0.0
        a.update({"KeyboardIdle": kb, "ConsoleIdle": kb, "CondorLoadAvg": condor_load,
                  "LoadAvg": round(self.owner_load + condor_load, 6)})
        tm = _time_fmt.gmtime(now)
        a["ClockMin"] = tm.tm_hour * 60 + tm.tm_min
        a["ClockDay"] = (tm.tm_wday + 1) % 7
        a.update(self.startd_attrs(slot))
        a.update(self.attrs)
        a["Start"] = self.policy("START")
        a["Rank"] = self.policy("RANK")
        unavailable = slot.state in ("Matched", "Preempting", "Drained") or bool(self.draining) \
            or self.shutting_down is not None
        a["Requirements"] = False if unavailable else expr("START")
        a["MaxJobRetirementTime"] = self.policy("MAXJOBRETIREMENTTIME")
        a["MachineMaxVacateTime"] = self.policy("MachineMaxVacateTime")
        claim = slot.claim
        a["CurrentRank"] = float(claim.rank) if claim is not None else 0.0
        if claim is not None:
            r = claim.request
            a["RemoteUser"] = r.submitter
            a["RemoteOwner"] = r.owner
            if r.accounting_group:
                a["AccountingGroup"] = r.submitter
            limits = r.job_ad.get("ConcurrencyLimits")
            if limits:
                a["ConcurrencyLimits"] = limits
            a["ClientMachine"] = r.schedd_host
            a["RemoteScheddName"] = r.schedd_host
            a["PublicClaimId"] = claim.id
            if claim.job_start is not None:
                a["JobId"] = r.job_id
                a["GlobalJobId"] = r.job_ad.get("GlobalJobId", "")
                a["JobStart"] = int(claim.job_start)
                a["JobUniverse"] = r.job_ad.get("JobUniverse", 5)
            self._publish_claim_times(a, claim, now)
        nxt = slot.next_claim
        if nxt is not None:
            a["PreemptingUser"] = nxt.request.submitter
            a["PreemptingOwner"] = nxt.request.owner
            a["PreemptingRank"] = float(nxt.rank)
            if nxt.request.accounting_group:
                a["PreemptingAccountingGroup"] = nxt.request.submitter
            limits = nxt.request.job_ad.get("ConcurrencyLimits")
            if limits:
                a["PreemptingConcurrencyLimits"] = limits
        # under a consumption policy the negotiator charges the drop in SlotWeight as the
        # assets are consumed: it needs the expression, not its value
        a["SlotWeight"] = self.policy(self._weight_knob(slot)) if cp else self._slot_weight(slot)
        return a

    def _expected_draining(self, now: float) -> dict[str, Any]:
        """What draining the machine now would cost and when it would end, published in its
        static and partitionable slot ads for condor_defrag's DEFRAG_RANK (ResMgr's
        compute_draining_attrs: a graceful drain loses each job's run time up to the end of
        its retirement, a quick one the run time so far). Only in the published ad: it
        evaluates the policy, which itself reads the slot ad."""
        if self._expected is not None and self._expected[:2] == (now, self._changes):
            return self._expected[2]
        graceful_badput = quick_badput = 0.0
        graceful_end = quick_end = 0.0
        for slot in self.all_slots():
            claim = slot.claim
            if claim is None or claim.job_start is None:
                continue
            cpus = float(slot.total.get("Cpus", 1))
            ran = self._job_times(claim, now)[0]
            left = self._retirement_left(slot)
            vacate = self._vacate_grant(slot, left)
            graceful_badput += cpus * (ran + left)
            quick_badput += cpus * ran
            graceful_end = max(graceful_end, left + vacate)
            quick_end = max(quick_end, vacate)
        a: dict[str, Any] = {"ExpectedMachineGracefulDrainingBadput": int(graceful_badput),
                             "ExpectedMachineQuickDrainingBadput": int(quick_badput),
                             "ExpectedMachineGracefulDrainingCompletion": int(now + graceful_end),
                             "ExpectedMachineQuickDrainingCompletion": int(now + quick_end)}
        self._expected = (now, self._changes, a)
        return a

    def _drain_tick(self, now: float) -> None:
        """Add the cpu-seconds left unclaimed by draining since the last tick."""
        if self.draining and self.machine is not None and now > self._drain_mark:
            claimed = sum(float(s.total.get("Cpus", 0)) for s in self.all_slots()
                          if s.claim is not None and s.kind != "Partitionable")
            idle = max(0.0, float(self.machine.totals.get("Cpus", 0)) - claimed)
            self.drain_unclaimed += idle * (now - self._drain_mark)
        self._drain_mark = now

    @staticmethod
    def _job_times(claim: Claim, now: float) -> tuple[float, float]:
        """(run, suspended) seconds of the claim's current job so far; (0, 0) without one."""
        if claim.job_start is None:
            return 0.0, 0.0
        suspended = claim.suspended_total + (now - claim.suspended_since
                                             if claim.suspended_since is not None else 0.0)
        return max(0.0, now - claim.job_start - suspended), suspended

    def _publish_claim_times(self, a: dict[str, Any], claim: Claim, now: float) -> None:
        """TotalJobRunTime/TotalJobSuspendTime (the current job) and TotalClaimRunTime/
        TotalClaimSuspendTime (every job of the claim), in whole seconds, each only once
        positive, as HTCondor's startd publishes them; computed at `now`, so policy
        expressions evaluated at each poll see them grow."""
        run, suspended = self._job_times(claim, now)
        for attr, value in (("TotalJobRunTime", run), ("TotalJobSuspendTime", suspended),
                            ("TotalClaimRunTime", claim.claim_run_total + run),
                            ("TotalClaimSuspendTime", claim.claim_suspend_total + suspended)):
            if int(value) > 0:
                a[attr] = int(value)

    def startd_attrs(self, slot: Slot) -> dict[str, Any]:
        """The admin's attributes for `slot` (`startd_attr_knobs`): a constant is published as
        its value, anything else as the expression."""
        key = (slot.slot_id, slot.slot_type, self._generation)
        hit = self._startd_attr_cache.get(key)
        if hit is not None:
            return hit
        hit = {}
        for name, knob in startd_attr_knobs(self.config, slot.slot_id, slot.slot_type).items():
            try:
                e = expr(self.config.get(knob) or "")
            except ClassAdError as exc:
                raise PoolConfigError(exc.reason, knob=knob) from None
            value = evaluate_policy(e, {}, None, self.clock.now) if classads.is_constant(e) else e
            hit[name] = e if isinstance(value, classad2.Value) else value
        self._startd_attr_cache[key] = hit
        return hit

    def _weight_knob(self, slot: Slot) -> str:
        """SLOT_TYPE_<N>_SLOT_WEIGHT for a slot of type N (its dynamic slots too) when
        defined, else SLOT_WEIGHT."""
        key = (self._generation, slot.slot_type)
        hit = self._weight_knobs.get(key)
        if hit is None:
            knob = f"SLOT_TYPE_{slot.slot_type}_SLOT_WEIGHT"
            hit = knob if slot.slot_type > 0 and self.config.defined(knob) else "SLOT_WEIGHT"
            self._weight_knobs[key] = hit
        return hit

    def _slot_weight(self, slot: Slot) -> float:
        """SLOT_WEIGHT over the slot's resources (the only attributes it may use, seed 001)."""
        res = {_attr(r): n for r, n in slot.free.items()}
        knob = self._weight_knob(slot)
        key = (self._generation, knob, tuple(sorted(res.items())))
        hit = self._weights.get(key)
        if hit is None:
            hit = as_number(evaluate_policy(self.policy(knob), res, None, self.clock.now),
                            float(slot.free.get("Cpus", 1)))
            self._weights[key] = hit
        return hit

    def _scope(self, slot: Slot) -> dict[str, Any]:
        """The slot ad plus the policy expressions, which other expressions may reference."""
        a = self.ad(slot)
        job = slot.claim.request.job_ad if slot.claim else None
        for knob in POLICY:
            a[knob] = self.policy(knob, job)
        return a

    def eval(self, slot: Slot, knob: str, with_job: bool = True) -> Any:
        """Evaluate a policy knob for `slot`, against its claim's job unless `with_job` is False.
        A knob that references nothing (MAXJOBRETIREMENTTIME = 0, MachineMaxVacateTime =
        10 * 60, ...) is answered without building the slot's ads: the draining costs every
        published static slot ad carries read two per claimed slot."""
        claim = slot.claim if with_job else None
        job = claim.request.job_ad if claim is not None else None
        e = self.policy(knob, job)
        value = _constant_value(e.text)
        if value is not _MISSING:
            return value
        my, target = self._eval_ads(slot, claim)
        return e.tree.eval(my, target)

    def _eval_ads(self, slot: Slot, claim: Claim | None) -> tuple[classad2.ClassAd, classad2.ClassAd | None]:
        """MY (slot over job: HTCondor's TARGET fallback) and TARGET ads for `slot` now."""
        job = claim.request.job_ad if claim is not None else None
        key = (id(claim), claim.request.job_id if claim else None, claim.job_start if claim else None,
               id(slot.next_claim), self._generation)
        scope = self._scope(slot)
        cache = self._eval.get((slot.name, claim is not None))
        if cache is None or cache.key != key or any(k not in scope for k in cache.last):
            merged = {k: plain(v) for k, v in job.items()} if job is not None else {}
            merged.update((k, plain(v)) for k, v in scope.items())
            target = classad2.ClassAd({k: plain(v) for k, v in job.items()}) if job is not None else None
            cache = _EvalAd(key, classad2.ClassAd(merged), target, scope)
            self._eval[(slot.name, claim is not None)] = cache
        else:
            last = cache.last
            for k, v in scope.items():
                old = last.get(k, _MISSING)
                if old is not v and (type(old) is not type(v) or old != v):
                    cache.my[k] = plain(v)
            cache.last = scope
        now = int(self.clock.now)
        cache.my["CurrentTime"] = now
        if cache.target is not None:
            cache.target["CurrentTime"] = now
        return cache.my, cache.target

    def publish(self, slot: Slot) -> None:
        """Send the slot's ad to the collector (`ad.updated`); remember it as published."""
        attrs = self.ad(slot)
        if slot.kind != "Dynamic":
            attrs.update(self._expected_draining(self.clock.now))
        ad = classads.attrs_to_json(attrs)
        self.published[slot.name] = ad
        self.emit(AdUpdated(ad_type="Machine", name=slot.name, ad=ad))

    def withdraw(self, slot: Slot) -> None:
        """Remove the slot's ad from the collector (`ad.invalidated`)."""
        self.published.pop(slot.name, None)
        self._eval.pop((slot.name, True), None)
        self._eval.pop((slot.name, False), None)
        self.emit(AdInvalidated(ad_type="Machine", name=slot.name))

    def publish_all(self) -> None:
        """Send every live slot's ad (reconfig, periodic UPDATE_INTERVAL)."""
        for slot in self.all_slots():
            self.publish(slot)

    def _periodic(self) -> None:
        if not self.up:
            return
        self.publish_all()
        self._update_timer = self.clock.call_later(self.config.number("UPDATE_INTERVAL", 300),
                                                   self._periodic)

    def _set(self, slot: Slot, state: str, activity: str) -> None:
        """Enter a state/activity, record when, and publish."""
        now = self.clock.now
        self._drain_tick(now)
        self._changes += 1
        if state != slot.state:
            slot.entered_state = now
        if state != slot.state or activity != slot.activity:
            slot.entered_activity = now
        slot.state, slot.activity = state, activity
        self.publish(slot)
        self._arm_poll()

    # ---- machine changes ---------------------------------------------------------------

    def _apply_attrs(self, attrs: Mapping[str, Any]) -> None:
        for k, v in attrs.items():
            if k.lower() in ("keyboardidle", "consoleidle"):
                self.keyboard_until = self.clock.now - float(v)
            elif k.lower() == "loadavg":
                self.owner_load = float(v)
            elif isinstance(v, str) and v.startswith("/Expr(") and v.endswith(")/"):
                self.attrs[k] = expr(v[6:-2])  # HTCondor's JSON form of an expression
            else:
                self.attrs[k] = v

    def set_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Machine attributes changed (owner activity, load); KeyboardIdle/LoadAvg are the owner's."""
        self._apply_attrs(attrs)
        if self.up:
            self.evaluate_all()

    def owner_active(self, until: float) -> None:
        """The owner uses the keyboard until `until` (KeyboardIdle is 0 until then, then grows)."""
        self.keyboard_until = max(self.keyboard_until, until)
        if self.up:
            self.evaluate_all()

    def reconfig(self, knob: str, value: str) -> None:
        """condor_reconfig after a `config.changed`: new policy applies; slot layout does not."""
        self.config.set(knob, value)
        self._policy.clear()
        self._generation += 1
        if self.up:
            self.publish_all()
            self.evaluate_all()

    # ---- policy evaluation -------------------------------------------------------------

    def _policy_constant(self, knobs: tuple[str, ...]) -> bool:
        key = (knobs, self._generation)
        hit = self._constant.get(key)
        if hit is None:
            vanilla = {"JobUniverse": VANILLA_UNIVERSE}
            hit = all(classads.is_constant(self.policy(k)) and classads.is_constant(self.policy(k, vanilla))
                      for k in knobs)
            self._constant[key] = hit
        return hit

    def _arm_poll(self) -> None:
        """Poll only when some policy can change with time: POLLING_INTERVAL while claimed
        (or running backfill), UPDATE_INTERVAL otherwise (seed 001)."""
        if not self.up:
            return
        claimed = any(s.state in ("Claimed", "Preempting", "Backfill") for s in self.all_slots())
        knobs: tuple[str, ...] = \
            ("START", "IS_OWNER", "WANT_SUSPEND", "SUSPEND", "CONTINUE", "PREEMPT", "KILL") \
            if claimed else ("START", "IS_OWNER")
        if self.config.boolean("ENABLE_BACKFILL", False):
            knobs += ("START_BACKFILL", "EVICT_BACKFILL")
        if self._policy_constant(knobs):
            return
        interval = self.config.number("POLLING_INTERVAL" if claimed else "UPDATE_INTERVAL",
                                      5 if claimed else 300)
        at = self.clock.now + interval
        if self._poll is not None and not self._poll.cancelled and self._poll_at <= at:
            return
        if self._poll is not None:
            self._poll.cancel()
        self._poll_at = at
        self._poll = self.clock.schedule(at, self._on_poll)

    def _on_poll(self) -> None:
        self._poll, self._poll_at = None, math.inf
        self.evaluate_all()
        self._arm_poll()

    def evaluate_all(self) -> None:
        """Evaluate every slot's policy until nothing changes (Owner -> Unclaimed cascades)."""
        for slot in list(self.all_slots()):
            for _ in range(8):
                if slot.gone or not self._evaluate(slot):
                    break
        self._arm_poll()

    def _evaluate(self, slot: Slot) -> bool:
        """One policy step for `slot`; True when its state or activity changed."""
        if self.shutting_down or slot.state == "Drained":
            return False
        st, act = slot.state, slot.activity
        if slot.kind == "Partitionable" and st in ("Owner", "Unclaimed"):
            owner = is_true(self.eval(slot, "IS_OWNER", False))
            want = "Owner" if owner else "Unclaimed"
            if want != st:
                self._set(slot, want, "Idle")
                return True
            return False
        if st == "Owner":
            if not is_true(self.eval(slot, "IS_OWNER", False)):
                self._set(slot, "Unclaimed", "Idle")
                return True
        elif st == "Unclaimed":
            if is_true(self.eval(slot, "IS_OWNER", False)):
                self._set(slot, "Owner", "Idle")
                return True
            if self._backfill_wanted(slot):
                self._set(slot, "Backfill", "Idle")  # transition 7
                self._set(slot, "Backfill", "Busy")  # 26: the backfill client is running
                return True
        elif st == "Backfill":
            if is_true(self.eval(slot, "IS_OWNER", False)) or is_true(self.eval(slot, "EVICT_BACKFILL", False)) \
                    or not self.config.boolean("ENABLE_BACKFILL", False):
                self._end_backfill(slot)
                self._set(slot, "Owner", "Idle")  # 30
                return True
        elif st == "Matched":
            if is_false(self.eval(slot, "START", False)):
                self._drop_match(slot)
                return True
        elif st == "Claimed" and slot.claim is not None:
            if act == "Idle":
                if is_false(self.eval(slot, "START")):
                    self._begin_preempt(slot, "start")
                    return True
            elif act == "Busy":
                if is_true(self.eval(slot, "WANT_SUSPEND")):
                    if is_true(self.eval(slot, "SUSPEND")):
                        self._suspend(slot)
                        return True
                elif is_true(self.eval(slot, "PREEMPT")):
                    self._begin_preempt(slot, "owner")
                    return True
            elif act == "Suspended":
                if is_true(self.eval(slot, "CONTINUE")):
                    self._continue(slot)
                    return True
                if not slot.retiring and is_true(self.eval(slot, "PREEMPT")):
                    self._begin_preempt(slot, "owner")
                    return True
            elif act == "Retiring":
                if is_true(self.eval(slot, "WANT_SUSPEND")) and is_true(self.eval(slot, "SUSPEND")):
                    self._suspend(slot)
                    return True
        elif st == "Preempting" and act == "Vacating" and slot.claim is not None \
                and slot.claim.running:
            if is_true(self.eval(slot, "KILL")):
                self._kill(slot)
                return True
        return (slot.state, slot.activity) != (st, act)

    # ---- backfill (seed 001, "Backfill State") -------------------------------------------

    def _backfill_wanted(self, slot: Slot) -> bool:
        """ENABLE_BACKFILL and START_BACKFILL (and not EVICT_BACKFILL, which would throw it
        straight out again) on an Unclaimed static slot that is not draining."""
        return slot.kind == "Static" and not self.draining \
            and self.config.boolean("ENABLE_BACKFILL", False) \
            and is_true(self.eval(slot, "START_BACKFILL", False)) \
            and not is_true(self.eval(slot, "EVICT_BACKFILL", False))

    def _end_backfill(self, slot: Slot) -> None:
        """Kill the backfill client (Backfill/Killing) and wait for it (Backfill/Idle); the
        caller moves on to Owner, Matched or Claimed (transitions 28-32)."""
        if slot.state == "Backfill":
            self._set(slot, "Backfill", "Killing")
            self._set(slot, "Backfill", "Idle")

    # ---- matching and claiming ---------------------------------------------------------

    def match(self, slot_name: str, match: Matched) -> bool:
        """The negotiator's match notification: Unclaimed/Owner -> Matched, MATCH_TIMEOUT armed."""
        slot = self.slot(slot_name)
        if slot is None or slot.kind == "Partitionable" \
                or slot.state not in ("Unclaimed", "Owner", "Backfill") \
                or self.draining or self.shutting_down:
            return False
        self._end_backfill(slot)
        slot.match = match
        self._set(slot, "Matched", "Idle")
        slot.match_timer = self.clock.call_later(self.config.number("MATCH_TIMEOUT", 120),
                                                 lambda: self._match_timeout(slot))
        return True

    def _match_timeout(self, slot: Slot) -> None:
        if slot.state == "Matched" and not slot.gone:
            self._drop_match(slot)
            self.evaluate_all()

    def _drop_match(self, slot: Slot) -> None:
        """Matched -> Owner (MATCH_TIMEOUT, START false, or a failed claim attempt)."""
        if slot.match_timer:
            slot.match_timer.cancel()
        slot.match, slot.match_timer = None, None
        self._set(slot, "Owner", "Idle")

    def _new_claim(self, slot: Slot, request: ClaimRequest, owner: ClaimOwner) -> Claim:
        self._claims += 1
        rank = as_number(evaluate_policy(self.policy("RANK", request.job_ad), self._scope(slot),
                                  request.job_ad, self.clock.now), 0.0)
        return Claim(f"<{self.host}:9618>#{int(self.boot_time)}#{self._claims}", request, owner,
                     slot, rank, self.clock.now)

    def _accepts(self, slot: Slot, request: ClaimRequest) -> bool:
        """START against the job (UNDEFINED refuses), as the startd checks a claim request."""
        return is_true(evaluate_policy(self.policy("START", request.job_ad), self._scope(slot),
                                request.job_ad, self.clock.now))

    def claim(self, slot_name: str, request: ClaimRequest, owner: ClaimOwner,
              match: Matched | None = None) -> Claim | None:
        """A schedd claims `slot_name` for a job, after the negotiator's match.

        Unclaimed/Owner/Matched static slots become Claimed/Idle; a partitionable slot carves a
        dynamic slot of the job's (MODIFY_REQUEST_EXPR-quantized) request; a Claimed slot with
        a preempting match keeps the claim waiting (`active` False) until the current job has
        retired and been vacated. None when the slot refuses (START false, no room, gone).
        """
        slot = self.slot(slot_name)
        if slot is None or not self.up or self.draining or self.shutting_down:
            return None
        if slot.kind == "Partitionable":
            return self._claim_partitionable(slot, request, owner, match)
        preempting = match is not None and bool(match.preempts)
        if slot.state in ("Unclaimed", "Owner", "Matched", "Backfill"):
            if not self._accepts(slot, request):
                if slot.state == "Matched":
                    self._drop_match(slot)
                    self.evaluate_all()
                return None
            self._end_backfill(slot)  # transition 31
            if slot.match_timer:
                slot.match_timer.cancel()
            slot.match, slot.match_timer = None, None
            claim = self._new_claim(slot, request, owner)
            claim.active = True
            slot.claim = claim
            self._set(slot, "Claimed", "Idle")
            return claim
        if slot.state == "Claimed" and preempting and slot.next_claim is None and slot.cause is None \
                and slot.claim is not None and slot.claim.request.job_id != request.job_id:
            if not self._accepts(slot, request):
                return None
            claim = self._new_claim(slot, request, owner)
            slot.next_claim = claim
            assert match is not None
            cause = "rank" if match.reason == "Rank" else "priority"
            self._begin_preempt(slot, cause)
            return claim
        return None

    def _claim_partitionable(self, pslot: Slot, request: ClaimRequest, owner: ClaimOwner,
                             match: Matched | None = None) -> Claim | None:
        if pslot.state not in ("Unclaimed", "Owner") or not self._accepts(pslot, request):
            return None
        assert self.machine is not None
        want = self._dynamic_size(pslot, request.job_ad)
        if "Swap" in pslot.free:
            want["Swap"] = 0
        if all(want.get(r, 0) <= pslot.free.get(r, 0) for r in want):
            claim = self._new_claim(pslot, request, owner)
            self._carve(pslot, want, claim)
            return claim
        if match is None or not match.preempts or pslot.next_claim is not None:
            return None
        return self._preempt_for(pslot, want, request, owner, match)

    def _preempt_for(self, pslot: Slot, want: Mapping[str, int], request: ClaimRequest,
                     owner: ClaimOwner, match: Matched) -> Claim | None:
        """Pslot preemption (the negotiator matched the pslot preempting dynamic slots): its
        running dynamic slots, lowest CurrentRank first, until their resources and the free
        ones hold the job; they are preempted and the claim waits for them to be gone."""
        free = dict(pslot.free)
        victims: list[Slot] = []
        for d in sorted(pslot.children, key=lambda c: (c.claim.rank if c.claim else 0.0, c.name)):
            if d.claim is None or d.state != "Claimed" or d.cause is not None or d.next_claim:
                continue
            victims.append(d)
            for res, n in d.total.items():
                free[res] = free.get(res, 0) + n
            if all(want.get(r, 0) <= free.get(r, 0) for r in want):
                break
        else:
            return None
        claim = self._new_claim(pslot, request, owner)
        pslot.next_claim = claim
        pslot.victims = list(victims)  # each leaves this list as it goes (_victim_gone)
        cause = "rank" if match.reason == "Rank" else "priority"
        for d in victims:
            self._begin_preempt(d, cause)
        return claim

    def _carve(self, pslot: Slot, want: Mapping[str, int], claim: Claim) -> None:
        """Carve a dynamic slot of `want` from `pslot` for `claim` (Claimed/Idle)."""
        sub = pslot.next_sub_id
        pslot.next_sub_id += 1
        ids: dict[str, list[str]] = {}
        for res, pool_ids in pslot.ids.items():
            n = want.get(res, 0)
            ids[res] = pool_ids[:n]
            del pool_ids[:n]
        for res, n in want.items():
            pslot.free[res] = pslot.free.get(res, 0) - n
        now = self.clock.now
        dslot = Slot(self, pslot.slot_id, pslot.slot_type, "Dynamic", dict(want), dict(want), ids,
                     f"slot{pslot.slot_id}_{sub}@{self.host}", state="Claimed", activity="Idle",
                     entered_state=now, entered_activity=now, parent=pslot)
        pslot.children.append(dslot)
        self.publish(pslot)
        claim.slot = dslot
        claim.active = True
        claim.claimed_at = now
        dslot.claim = claim
        self.publish(dslot)
        self._arm_poll()

    def _victim_gone(self, pslot: Slot, dslot: Slot) -> None:
        """A dynamic slot preempted for the pslot's waiting claim is gone: once all are, the
        claim gets its dynamic slot and the schedd hears (claim_ready)."""
        if dslot not in pslot.victims:
            return
        pslot.victims.remove(dslot)
        nxt = pslot.next_claim
        if pslot.victims or nxt is None:
            return
        pslot.next_claim = None
        want = self._dynamic_size(pslot, nxt.request.job_ad)
        if "Swap" in pslot.free:
            want["Swap"] = 0
        if nxt.closed or self.draining or self.shutting_down or \
                any(want.get(r, 0) > pslot.free.get(r, 0) for r in want):
            self._close(nxt)
            return
        self._carve(pslot, want, nxt)
        self.clock.call_later(0, lambda: nxt.owner.claim_ready(nxt))

    def _consumption_policy(self, pslot: Slot) -> bool:
        knob = f"SLOT_TYPE_{pslot.slot_type}_CONSUMPTION_POLICY"
        return self.config.boolean(knob if self.config.defined(knob) else "CONSUMPTION_POLICY", False)

    def _consumption(self, pslot: Slot, res: str) -> Expr:
        """CONSUMPTION_<RES> of `pslot` (its slot type's first), else HTCondor's default: the
        knob table's for cpus, memory and disk (param_info.in), the job's request (0 when it
        has none) for a custom resource (Resource.cpp)."""
        default = f"ifthenelse(target.Request{res} =?= undefined, 0, target.Request{res})"
        return expr(self.config.get(f"SLOT_TYPE_{pslot.slot_type}_CONSUMPTION_{res.upper()}")
                    or self.config.get(f"CONSUMPTION_{res.upper()}") or default)

    def _dynamic_size(self, pslot: Slot, job: Mapping[str, Any]) -> dict[str, int]:
        """What a dynamic slot gets: CONSUMPTION_<RES> (slot MY, job TARGET) under a consumption
        policy, else the job's request through MODIFY_REQUEST_EXPR_REQUEST<RES> (seed 001)."""
        assert self.machine is not None
        now = self.clock.now
        slot_ad = self.ad(pslot)
        consumption = self._consumption_policy(pslot)
        lowered = {k.lower(): v for k, v in job.items()}  # ClassAd names ignore case
        want: dict[str, int] = {}
        for res in ("Cpus", "Memory", "Disk", *self.machine.custom):
            if consumption:
                value = evaluate_policy(self._consumption(pslot, res), slot_ad, job, now)
            elif res in ("Cpus", "Memory", "Disk"):
                e = expr(self.config.get(f"MODIFY_REQUEST_EXPR_REQUEST{res.upper()}") or f"Request{res}")
                value = evaluate_policy(e, job, slot_ad, now)
            else:
                value = lowered.get(f"request{res.lower()}", 0)
                if isinstance(value, Expr):
                    value = evaluate_policy(value, job, slot_ad, now)
            want[res] = int(math.ceil(as_number(value, 1.0 if res == "Cpus" else 0.0)))
        return want

    def activate(self, claim: Claim, runtime: float, vacate_time: float = 0.0) -> bool:
        """The schedd activates its claim (spawns a starter): Claimed/Idle -> Claimed/Busy."""
        slot = claim.slot
        if slot.claim is not claim or slot.state != "Claimed" or slot.activity != "Idle" \
                or claim.closed:
            return False
        now = self.clock.now
        claim.job_start = now
        claim.suspended_total = 0.0
        claim.suspended_since = None
        claim.suspensions = 0
        claim.remaining = max(0.0, float(runtime))
        claim.vacate_time = float(vacate_time)
        claim.stop_reported = False
        claim.running_since = now
        claim.exit_timer = self.clock.call_later(claim.remaining, lambda: self._job_done(claim))
        self._set(slot, "Claimed", "Busy")
        return True

    def accepts_more_jobs(self, claim: Claim) -> bool:
        """CLAIM_WORKLIFE: after that many seconds a claim takes no further jobs (-1: forever)."""
        worklife = self.config.number("CLAIM_WORKLIFE", 1200)
        return worklife < 0 or self.clock.now - claim.claimed_at < worklife

    def deactivate(self, claim: Claim, reason: StopReason) -> None:
        """The schedd stops the job but keeps the claim (condor_rm, condor_hold)."""
        slot = claim.slot
        if slot.claim is not claim or not claim.running or slot.state != "Claimed":
            return
        self._pause(claim)
        slot.cancel_timers()
        self._stop_job(claim)
        claim.owner.job_evicted(claim, reason)
        if slot.claim is claim and slot.state == "Claimed":
            self._set(slot, "Claimed", "Idle")

    def release(self, claim: Claim) -> None:
        """The schedd has no more work for the claim: Claimed/Idle -> Preempting -> Owner."""
        slot = claim.slot
        if slot.next_claim is claim:
            slot.next_claim = None
            claim.closed = True
            self._unretire(slot)
            return
        if slot.claim is not claim or slot.gone:
            return
        if claim.running:
            self._begin_preempt(slot, "release")
        elif slot.state == "Claimed":
            self._begin_preempt(slot, "release")

    def vacate(self, fast: bool = False) -> None:
        """condor_vacate: every claim is evicted right away (no retirement); a Matched slot
        gives up its match and goes to Owner."""
        for slot in list(self.all_slots()):
            if slot.claim is not None and slot.state == "Claimed":
                self._begin_preempt(slot, "vacate" if not fast else "shutdown_fast")
            elif slot.state == "Matched":
                self._drop_match(slot)
            elif slot.state == "Backfill":
                self._end_backfill(slot)
                self._set(slot, "Owner", "Idle")  # transition 30 (condor_vacate)
        self.evaluate_all()

    # ---- running jobs -----------------------------------------------------------------

    def _pause(self, claim: Claim) -> None:
        now = self.clock.now
        if claim.running_since is not None:
            claim.remaining = max(0.0, claim.remaining - (now - claim.running_since))
            claim.running_since = None
        if claim.exit_timer:
            claim.exit_timer.cancel()
            claim.exit_timer = None

    def _resume(self, claim: Claim) -> None:
        now = self.clock.now
        if claim.suspended_since is not None:
            claim.suspended_total += now - claim.suspended_since
            claim.suspended_since = None
        if claim.running_since is None and claim.running:
            claim.running_since = now
            claim.exit_timer = self.clock.call_later(claim.remaining, lambda: self._job_done(claim))

    def _stop_job(self, claim: Claim) -> None:
        """The starter is gone: no job under the claim any more; its times join the claim's."""
        self._pause(claim)
        run, suspended = self._job_times(claim, self.clock.now)
        claim.claim_run_total += run
        claim.claim_suspend_total += suspended
        if claim.suspended_since is not None:
            claim.suspended_total += self.clock.now - claim.suspended_since
        claim.job_start = None
        claim.running_since = None
        claim.suspended_since = None

    def _suspend(self, slot: Slot) -> None:
        assert slot.claim is not None
        self._pause(slot.claim)
        slot.claim.suspended_since = self.clock.now
        slot.claim.suspensions += 1
        slot.cancel_timers()  # retirement does not run while suspended
        self._set(slot, "Claimed", "Suspended")

    def _continue(self, slot: Slot) -> None:
        assert slot.claim is not None
        self._resume(slot.claim)
        if slot.retiring:
            self._set(slot, "Claimed", "Retiring")
            self._plan_retirement(slot)
        else:
            self._set(slot, "Claimed", "Busy")

    def _job_done(self, claim: Claim) -> None:
        """The job exited on its own."""
        slot = claim.slot
        if slot.claim is not claim or not claim.running:
            return
        self._stop_job(claim)
        if slot.state == "Claimed" and slot.activity in ("Busy",) and not slot.retiring:
            self._set(slot, "Claimed", "Idle")
            claim.owner.job_exited(claim)
            return
        claim.owner.job_exited(claim)
        if slot.state == "Claimed":  # retiring or suspended-in-retirement: now preempt
            slot.cancel_timers()
            self._enter_preempting(slot)
        elif slot.state == "Preempting":
            slot.cancel_timers()
            self._preempt_done(slot)

    # ---- preemption ---------------------------------------------------------------------

    def preempt(self, slot_name: str, cause: str = "owner") -> None:
        """Start preempting the claim on `slot_name` (a cause from STOP_REASON)."""
        slot = self.slot(slot_name)
        if slot is not None and slot.claim is not None:
            self._begin_preempt(slot, cause)

    def _begin_preempt(self, slot: Slot, cause: str) -> None:
        claim = slot.claim
        if claim is None or slot.state == "Preempting":
            return
        if slot.retiring or (slot.cause is not None and slot.state == "Claimed"):
            if cause in _RETIRING_CAUSES:
                return  # already on its way out; retirement is not restarted
        slot.cause = cause
        if not claim.running:
            self._enter_preempting(slot)
            return
        if cause in _RETIRING_CAUSES:
            slot.retiring = True
            if slot.activity == "Suspended":
                self._resume(claim)
            self._set(slot, "Claimed", "Retiring")
            self._plan_retirement(slot)
        else:
            self._enter_preempting(slot)

    def _unretire(self, slot: Slot) -> None:
        """The preempting claim went away: a slot retiring only for it resumes Claimed/Busy
        (seed 001, transition 19); owner preemption and shutdown never unretire."""
        if slot.state == "Claimed" and slot.activity == "Retiring" and slot.cause in ("rank", "priority"):
            slot.cancel_timers()
            slot.retiring = False
            slot.cause = None
            self._set(slot, "Claimed", "Busy")
        else:
            self.publish(slot)

    def _retirement_left(self, slot: Slot) -> float:
        claim = slot.claim
        assert claim is not None and claim.job_start is not None
        job = claim.request.job_ad
        mjrt = as_number(self.eval(slot, "MAXJOBRETIREMENTTIME"), 0.0)
        own = job.get("MaxJobRetirementTime")
        if own is not None:
            value = (evaluate_policy(own, job, self._scope(slot), self.clock.now)
                     if isinstance(own, Expr) else own)
            mjrt = min(mjrt, as_number(value, mjrt))
        if self.shutting_down == "shutdown_fast":
            mjrt = 0.0
        suspended = claim.suspended_total + (self.clock.now - claim.suspended_since
                                             if claim.suspended_since is not None else 0.0)
        ran = self.clock.now - claim.job_start - suspended
        return max(0.0, mjrt - ran)

    def _vacate_grant(self, slot: Slot, retire_left: float) -> float:
        """MachineMaxVacateTime, lowered by JobMaxVacateTime, or raised by it up to the
        retirement time the job has left (seed 001)."""
        claim = slot.claim
        assert claim is not None
        v = max(0.0, as_number(self.eval(slot, "MachineMaxVacateTime"), 600.0))
        jv_raw = claim.request.job_ad.get("JobMaxVacateTime")
        if jv_raw is not None:
            jv = as_number(evaluate_policy(jv_raw, claim.request.job_ad, self._scope(slot), self.clock.now)
                           if isinstance(jv_raw, Expr) else jv_raw, v)
            v = jv if jv <= v else min(jv, max(v, retire_left))
        return v

    def _plan_retirement(self, slot: Slot) -> None:
        """Enter Preempting X seconds before retirement ends, X being the vacate grant."""
        slot.cancel_timers()
        left = self._retirement_left(slot)
        grant = self._vacate_grant(slot, left)
        delay = max(0.0, left - grant)
        if delay <= 0:
            self._enter_preempting(slot)
        else:
            slot.timers.append(self.clock.call_later(delay, lambda: self._retired(slot)))

    def _retired(self, slot: Slot) -> None:
        if slot.state == "Claimed" and slot.activity == "Retiring":
            slot.timers.clear()
            self._enter_preempting(slot)

    def _enter_preempting(self, slot: Slot) -> None:
        """Preempting: Vacating (soft kill, WANT_VACATE) or Killing; no starter -> done at once."""
        claim = slot.claim
        assert claim is not None
        slot.cancel_timers()
        slot.retiring = False
        if not claim.running:
            self._set(slot, "Preempting", "Vacating")
            self._preempt_done(slot)
            return
        if claim.suspended_since is not None:
            self._resume(claim)  # a suspended job is woken to receive its signal
        fast = slot.cause in ("shutdown_fast", "drain_fast")
        if not fast and is_true(self.eval(slot, "WANT_VACATE")):
            grant = self._vacate_grant(slot, 0.0)
            self._set(slot, "Preempting", "Vacating")
            if claim.vacate_time <= grant:
                slot.timers.append(self.clock.call_later(claim.vacate_time,
                                                         lambda: self._vacated(slot, claim)))
            else:
                slot.timers.append(self.clock.call_later(grant, lambda: self._kill(slot)))
        else:
            self._kill(slot)

    def _vacated(self, slot: Slot, claim: Claim) -> None:
        """The job exited after its soft kill signal (KillSig) within the vacate time."""
        if slot.claim is claim and slot.state == "Preempting" and claim.running:
            self._evicted(slot)

    def _kill(self, slot: Slot) -> None:
        """Preempting/Killing: hard kill; the simulated starter dies at once (KILLING_TIMEOUT
        is never needed)."""
        slot.cancel_timers()
        self._set(slot, "Preempting", "Killing")
        if slot.claim is not None and slot.claim.running:
            self._evicted(slot)
        else:
            self._preempt_done(slot)

    def _evicted(self, slot: Slot) -> None:
        claim = slot.claim
        assert claim is not None
        if slot.cause in ("drain", "drain_quick", "drain_fast"):
            self.drain_badput += float(slot.total.get("Cpus", 1)) * self._job_times(claim, self.clock.now)[0]
        self._stop_job(claim)
        reason = STOP_REASON.get(slot.cause or "vacate", "evicted")
        claim.owner.job_evicted(claim, reason)
        self._preempt_done(slot)

    def _preempt_done(self, slot: Slot) -> None:
        """The claim is broken: to Claimed/Idle for a preempting claim, else Owner (or Drained,
        or the dynamic slot goes away)."""
        old = slot.claim
        slot.cancel_timers()
        slot.claim = None
        slot.cause = None
        slot.retiring = False
        if old is not None:
            self._close(old)
        nxt = slot.next_claim
        if nxt is not None and not nxt.closed and not self.shutting_down and not self.draining:
            slot.next_claim = None
            slot.claim = nxt
            nxt.active = True
            nxt.claimed_at = self.clock.now
            self._set(slot, "Claimed", "Idle")
            self.clock.call_later(0, lambda: nxt.owner.claim_ready(nxt))  # the schedd hears next
            return
        if nxt is not None:
            slot.next_claim = None
            self._close(nxt)
        if slot.kind == "Dynamic":
            self._delete_dslot(slot)
        elif self.shutting_down:
            self._finish_shutdown()
            return
        elif self.draining:
            self._set(slot, "Drained", "Retiring")
        else:
            self._set(slot, "Owner", "Idle")
            self.evaluate_all()
        if self.draining:
            self._check_drained()
        if self.shutting_down:
            self._finish_shutdown()

    def _close(self, claim: Claim) -> None:
        if claim.closed:
            return
        claim.closed = True
        for t in (claim.exit_timer, claim.lease_timer):
            if t:
                t.cancel()
        claim.owner.claim_closed(claim)

    def _delete_dslot(self, dslot: Slot) -> None:
        """A dynamic slot's claim ended: its resources go back to the partitionable slot."""
        pslot = dslot.parent
        assert pslot is not None
        dslot.gone = True
        pslot.children.remove(dslot)
        for res, n in dslot.total.items():
            pslot.free[res] = pslot.free.get(res, 0) + n
        for res, ids in dslot.ids.items():
            pslot.ids.setdefault(res, []).extend(ids)
            pslot.ids[res].sort(key=lambda x: (len(x), x))
        self.withdraw(dslot)
        if not self.shutting_down:
            self.publish(pslot)
        self._victim_gone(pslot, dslot)

    # ---- claim leases ---------------------------------------------------------------------

    def alives_stopped(self, claim: Claim, last_alive: float) -> None:
        """The schedd went silent: the claim lease runs out `lease_duration` after the last
        keep-alive unless alives resume."""
        if claim.closed:
            return
        if claim.lease_timer:
            claim.lease_timer.cancel()
        at = max(self.clock.now, last_alive + claim.request.lease_duration)
        claim.lease_timer = self.clock.schedule(at, lambda: self._lease_expired(claim))

    def alives_resumed(self, claim: Claim) -> None:
        """Keep-alives arrive again: the lease is renewed."""
        if claim.lease_timer:
            claim.lease_timer.cancel()
            claim.lease_timer = None

    def _lease_expired(self, claim: Claim) -> None:
        """The claim lease passed with no keep-alive: drop the claim and evict its job."""
        slot = claim.slot
        claim.lease_timer = None
        if slot.next_claim is claim:
            slot.next_claim = None
            self._close(claim)
            self._unretire(slot)
            return
        if slot.claim is not claim or claim.closed:
            return
        if claim.running and not claim.stop_reported:
            r = claim.request
            self.emit(JobStopped(job_id=r.job_id, slot=slot.name, reason="evicted",
                                 schedd=r.schedd, submitter=r.submitter))
            claim.stop_reported = True
        slot.cause = None
        slot.retiring = False
        self._begin_preempt(slot, "lease")

    # ---- draining ---------------------------------------------------------------------------

    def drain(self, graceful: bool = True, *, schedule: str | None = None, reason: str = "",
              resume_on_completion: bool = False) -> bool:
        """condor_drain: no new jobs; running ones retire (graceful), are vacated without
        retirement (quick) or killed (fast). `schedule` (graceful/quick/fast) overrides
        `graceful`; with `resume_on_completion` the machine leaves Drained by itself once
        every slot has drained (condor_defrag's requests). False when refused (already
        draining, or down)."""
        if not self.up or self.draining:
            return False
        how = schedule or ("graceful" if graceful else "fast")
        self._drain_tick(self.clock.now)
        self.draining = True
        self.drain_reason = reason or "by command"
        self.resume_on_completion = resume_on_completion
        for slot in list(self.all_slots()):
            if slot.claim is not None:
                self._begin_preempt(slot, DRAIN_CAUSES[how])
            elif slot.kind != "Dynamic" and slot.state != "Drained":
                self._end_backfill(slot)
                if slot.state == "Matched" and slot.match_timer:
                    slot.match_timer.cancel()
                    slot.match, slot.match_timer = None, None
                self._set(slot, "Drained", "Retiring")
        self._check_drained()
        return True

    def _check_drained(self) -> None:
        slots = self.all_slots()
        if self.draining and all(s.state == "Drained" for s in slots):
            for s in slots:
                if s.activity != "Idle":
                    self._set(s, "Drained", "Idle")
            if self.resume_on_completion:
                self.cancel_drain()

    def cancel_drain(self) -> None:
        """Draining canceled or finalized: drained slots return to Owner, then policy applies."""
        if not self.draining:
            return
        self._drain_tick(self.clock.now)
        self.draining = False
        self.drain_reason = ""
        for slot in self.all_slots():
            if slot.state == "Drained":
                self._set(slot, "Owner", "Idle")
        self.evaluate_all()
