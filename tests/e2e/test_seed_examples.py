"""The seeds' worked examples end to end: the pool, the ledger and the negotiator on one
embedded log, each asserted from the events in the log (and the ledger).

- seed 001, "The RANK Expression": coltrane/tyner/garrison/jones preempt outsiders on their
  group's machines, and garrison preempts jones on bass (RANK 10 against 1);
- seed 001, "Dynamic Provisioning": a 10-CPU / 10240 MB partitionable slot, a 3-CPU 1024 MB
  job leaves 7 CPUs and 9216 MB, and a second job is carved in the same cycle;
- seed 000, surplus: hep/lep accept surplus, physics does not — the subgroups exceed their
  own quotas only within physics' 20;
- seed 001, "Machine States": Unclaimed -> Matched -> Claimed/Idle -> Claimed/Busy, then
  PREEMPT -> Claimed/Retiring -> Preempting/Vacating -> Preempting/Killing after
  MachineMaxVacateTime; and MATCH_TIMEOUT taking a never-claimed match back to Owner.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.events import Envelope, JobStarted
from tests.e2e.helpers import batch, events, machines, run, running_by
from tests.pool.helpers import states

MINUTE = 60.0


def _of(evs: list[Envelope], kind: str) -> list[Any]:
    return [e.data for e in evs if e.type == kind]


def _user(d: Any) -> str:
    return d.submitter.partition("@")[0]


# --- seed 001: the RANK expression -----------------------------------------------------------

QUARTET_OR = 'Owner == "coltrane" || Owner == "tyner" || Owner == "garrison" || Owner == "jones"'
BASS_RANK = ('(Owner == "coltrane") + (Owner == "tyner") + ((Owner == "garrison") * 10) '
             '+ (Owner == "jones")')


def _rank_doc(host: str, rank: str, arrivals: list[tuple[str, str | int]]) -> dict[str, Any]:
    """One single-slot machine `host` with `rank`; each (user, at) submits one long job."""
    return {"machines": [{**machines(1, name=host)[0], "config": {"NUM_SLOTS": 1, "RANK": rank}}],
            "submitters": [{"user": u, "jobs": [batch(1, "10h", at=at)]} for u, at in arrivals]}


def test_coltrane_preempts_an_outsider_on_tenorsax(tmp_path: Path) -> None:
    """RANK = Owner == "coltrane" || ...: the outsider miles runs until coltrane submits; then
    a Rank match preempts miles and coltrane's job starts on the same slot."""
    doc = _rank_doc("tenorsax.example.org", QUARTET_OR, [("miles", 0), ("coltrane", "10m")])
    run(tmp_path, doc, hours=0.5)
    evs = list(events(tmp_path))
    slot = "slot1@tenorsax.example.org"
    matches = _of(evs, "match")
    assert [(_user(m), m.reason) for m in matches] == [("miles", "NoPreemption"),
                                                       ("coltrane", "Rank")]
    miles_job = matches[0].job_id
    # `preempts` names the claim's user, as the negotiator logs "preempting <RemoteUser>"
    assert matches[1].preempts == "miles@example.org" and matches[1].slot == slot
    stopped = _of(evs, "job.stopped")
    assert [(s.job_id, s.reason) for s in stopped] == [(miles_job, "preempted")]
    started = [(_user(s), s.slot) for s in _of(evs, "job.started")]
    assert started == [("miles", slot), ("coltrane", slot)]
    stop_ts = next(e.ts for e in evs if e.type == "job.stopped")
    start_ts = [e.ts for e in evs if e.type == "job.started"][1]
    assert stop_ts <= start_ts
    last = [e.data.ad for e in evs if e.type == "ad.updated" and e.data.name == slot][-1]
    assert last["RemoteUser"] == "coltrane@example.org" and last["CurrentRank"] == 1.0


def test_garrison_preempts_jones_on_bass(tmp_path: Path) -> None:
    """bass's RANK: an outsider 0, jones 1, garrison 10, coltrane 1. jones preempts the
    outsider; garrison preempts jones; coltrane (1 < 10) does not preempt garrison."""
    doc = _rank_doc("bass.example.org", BASS_RANK,
                    [("miles", 0), ("jones", "10m"), ("garrison", "20m"), ("coltrane", "30m")])
    _loop, result = run(tmp_path, doc, hours=1)
    evs = list(events(tmp_path))
    matches = _of(evs, "match")
    assert [(_user(m), m.reason) for m in matches] == [
        ("miles", "NoPreemption"), ("jones", "Rank"), ("garrison", "Rank")]
    job = {_user(m): m.job_id for m in matches}
    assert [m.preempts for m in matches] == [None, "miles@example.org", "jones@example.org"]
    assert [(s.job_id, s.reason) for s in _of(evs, "job.stopped")] == [
        (job["miles"], "preempted"), (job["jones"], "preempted")]
    assert [_user(s) for s in _of(evs, "job.started")] == ["miles", "jones", "garrison"]
    ads = [e.data.ad for e in evs if e.type == "ad.updated" and e.data.name == "slot1@bass.example.org"]
    assert ads[-1]["RemoteUser"] == "garrison@example.org" and ads[-1]["CurrentRank"] == 10.0
    # coltrane's job stays idle: no match, ever
    assert "coltrane" not in {_user(m) for m in matches}
    # the ledger, folded from the log, charges the slot to garrison alone at the end
    used = {u: rec["ResourcesUsed"] for u, rec in result.ledger.priorities(result.end).items()
            if not rec["IsAccountingGroup"]}
    assert used == {"miles@example.org": 0, "jones@example.org": 0, "garrison@example.org": 1}


# --- seed 001: partitionable and dynamic slots -----------------------------------------------

def test_partitionable_slot_example(tmp_path: Path) -> None:
    """10 CPUs / 10240 MB in one partitionable slot; two 3-CPU 1024 MB jobs are both carved in
    the first cycle: the slot advertises 7 CPUs / 9216 MB, then 4 / 8192."""
    doc = {"machines": [{"name": "ep7.example.org", "count": 1, "cpus": 10, "memory": 10240,
                         "disk": 1_000_000,
                         "config": {"SLOT_TYPE_1": "100%", "NUM_SLOTS_TYPE_1": 1,
                                    "SLOT_TYPE_1_PARTITIONABLE": True}}],
           "submitters": [{"user": "alice", "jobs": [
               batch(2, "1h", request_cpus=3, request_memory=1024, request_disk=10240)]}]}
    run(tmp_path, doc, hours=0.25)
    evs = list(events(tmp_path))
    pslot = "slot1@ep7.example.org"
    matches = _of(evs, "match")
    assert [(m.cycle, m.slot) for m in matches] == [(1, pslot), (1, pslot)]
    started = _of(evs, "job.started")
    assert [s.slot for s in started] == ["slot1_1@ep7.example.org", "slot1_2@ep7.example.org"]
    assert all(s.resources == {"Cpus": 3, "Memory": 1024, "Disk": 10240} for s in started)
    assert all(s.slot_weight == 3.0 for s in started)
    pads = [e.data.ad for e in evs if e.type == "ad.updated" and e.data.name == pslot]
    left = [(a["Cpus"], a["Memory"]) for a in pads]
    assert left[0] == (10, 10240)
    assert (7, 9216) in left and (4, 8192) in left
    assert left.index((7, 9216)) < left.index((4, 8192))
    # the partitionable slot always looks unclaimed; the dynamic slots run the jobs
    assert all(a["PartitionableSlot"] is True for a in pads)
    assert all(a["State"] == "Unclaimed" for a in pads[left.index((7, 9216)):])
    assert pads[-1]["NumDynamicSlots"] == 2 and pads[-1]["TotalSlotCpus"] == 10


# --- seed 000: surplus within the parent -----------------------------------------------------

def _group(d: JobStarted) -> str:
    local = d.submitter.rpartition("@")[0]
    return local.rpartition(".")[0] or "<none>"


def test_surplus_lets_subgroups_exceed_quota_only_within_their_parent(tmp_path: Path) -> None:
    """Seed 000's quotas (physics 20 = hep 15 + lep 5, chemistry 10) on 40 slots; surplus on
    hep and lep, not on physics. hep takes lep's unused quota (17 > 15) but physics' 20 caps
    hep + lep although 15 slots stay free; chemistry, without surplus, stays at 10."""
    doc = {"config": {"GROUP_NAMES": "group_physics, group_physics.hep, group_physics.lep, "
                                     "group_chemistry",
                      "GROUP_QUOTA_group_physics": 20, "GROUP_QUOTA_group_physics.hep": 15,
                      "GROUP_QUOTA_group_physics.lep": 5, "GROUP_QUOTA_group_chemistry": 10,
                      "GROUP_ACCEPT_SURPLUS": False,
                      "GROUP_ACCEPT_SURPLUS_group_physics": False,
                      "GROUP_ACCEPT_SURPLUS_group_physics.lep": True,
                      "GROUP_ACCEPT_SURPLUS_group_physics.hep": True,
                      "NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION": False},
           "machines": machines(10, 4, name="node{n:02d}.example.org"),
           "submitters": [
               {"user": "higgs", "group": "group_physics.hep", "jobs": [batch(100, "3h")]},
               {"user": "lep1", "group": "group_physics.lep", "jobs": [batch(3, "3h")]},
               {"user": "curie", "group": "group_chemistry", "jobs": [batch(100, "3h")]}]}
    run(tmp_path, doc, hours=1)
    evs = list(events(tmp_path))
    peak, timeline = running_by(evs, _group)
    assert peak == {"group_physics.hep": 17, "group_physics.lep": 3, "group_chemistry": 10}
    for _ts, counts in timeline:
        physics = counts.get("group_physics.hep", 0) + counts.get("group_physics.lep", 0)
        assert physics <= 20
        assert counts.get("group_chemistry", 0) <= 10
    # the pool was not full: the cap is physics' quota, not a lack of slots
    assert sum(timeline[-1][1].values()) == 30


# --- seed 001: states, activities and their timers -------------------------------------------

SLOT = "slot1@ep01.example.org"
TIMERS = {"MATCH_TIMEOUT": 120, "MAXJOBRETIREMENTTIME": 900, "MachineMaxVacateTime": 120}
CLAIM_DELAY = 30.0
OWNER_BACK = 600.0


def _one_slot(config: dict[str, Any], job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    m = machines(1)[0]
    return {"machines": [{**m, "config": {"NUM_SLOTS": 1, **config}}],
            "submitters": [{"user": "alice", "jobs": [job]}], **extra}


def _changes(evs: list[Envelope], t0: float) -> list[tuple[float, str, str]]:
    """The slot's (seconds since t0, State, Activity) changes; periodic refreshes dropped."""
    out: list[tuple[float, str, str]] = []
    for ts, st, act in states(evs, SLOT):
        if not out or out[-1][1:] != (st, act):
            out.append((ts - t0, st, act))
    return out


def test_state_transitions_with_their_timers(tmp_path: Path) -> None:
    """Matched until the schedd claims (claim delay 30 s), Claimed/Idle -> Busy; the owner
    returns at 10 min and PREEMPT (KeyboardBusy) turns true: Claimed/Retiring until
    MAXJOBRETIREMENTTIME (900 s of run time) less the MachineMaxVacateTime grant (120 s),
    then Preempting/Vacating; the job ignores its soft kill, so MachineMaxVacateTime later it
    is Preempting/Killing, and the claim ends in Owner -> Unclaimed. START is KeyboardNotBusy,
    so nothing is matched again while the owner is at the keyboard."""
    config = {"PREEMPT": "$(KeyboardBusy)", "WANT_VACATE": True, "START": "$(KeyboardNotBusy)",
              **TIMERS}
    doc = _one_slot(config, batch(1, "10h", vacate_time="never"),
                    sim={"claim_delay": CLAIM_DELAY},
                    actions=[{"at": OWNER_BACK, "kind": "owner_active", "machines": "*",
                              "for": "2h"}])
    _loop, result = run(tmp_path, doc, hours=0.5)
    evs = list(events(tmp_path))
    t0 = next(e.ts for e in evs if e.type == "match")
    assert t0 == result.start  # the first cycle
    seq = _changes(evs, t0)
    i = next(i for i, s in enumerate(seq) if s[1] == "Matched")
    assert i >= 1 and seq[i - 1][1:] == ("Unclaimed", "Idle") and seq[i - 1][0] <= 0  # boot
    started = CLAIM_DELAY
    retire_end = started + TIMERS["MAXJOBRETIREMENTTIME"]
    assert seq[i:] == [
        (0.0, "Matched", "Idle"),
        (CLAIM_DELAY, "Claimed", "Idle"), (CLAIM_DELAY, "Claimed", "Busy"),
        (OWNER_BACK, "Claimed", "Retiring"),
        (retire_end - TIMERS["MachineMaxVacateTime"], "Preempting", "Vacating"),
        (retire_end, "Preempting", "Killing"),
        (retire_end, "Owner", "Idle"), (retire_end, "Unclaimed", "Idle")]
    # the timers as differences between transitions
    at = {(st, act): t for t, st, act in seq[i:]}
    assert at[("Preempting", "Killing")] - at[("Preempting", "Vacating")] == \
        TIMERS["MachineMaxVacateTime"]
    assert at[("Preempting", "Killing")] - at[("Claimed", "Busy")] == TIMERS["MAXJOBRETIREMENTTIME"]
    # the ads carry the same times (EnteredCurrentState/Activity)
    ads = [e.data.ad for e in evs if e.type == "ad.updated" and e.data.name == SLOT]
    vacating = next(a for a in ads if a["Activity"] == "Vacating")
    assert vacating["EnteredCurrentState"] == int(t0 + at[("Preempting", "Vacating")])
    job = [(e.ts - t0, e.type, getattr(e.data, "reason", "")) for e in evs
           if e.type in ("job.started", "job.stopped")]
    assert job == [(CLAIM_DELAY, "job.started", ""), (retire_end, "job.stopped", "vacated")]
    assert len(_of(evs, "match")) == 1


def test_match_timeout_returns_an_unclaimed_match_to_owner(tmp_path: Path) -> None:
    """The schedd takes longer to claim (200 s) than MATCH_TIMEOUT (45 s): Matched -> Owner
    -> Unclaimed 45 s after each match; the late claim is refused and the job stays idle."""
    doc = _one_slot({"MATCH_TIMEOUT": 45}, batch(1, "1h"), sim={"claim_delay": 200})
    run(tmp_path, doc, hours=0.05)
    evs = list(events(tmp_path))
    matches = [e.ts for e in evs if e.type == "match"]
    t0 = matches[0]
    seq = _changes(evs, t0)
    first = seq[next(i for i, s in enumerate(seq) if s[1] == "Matched"):][:3]
    assert first == [(0.0, "Matched", "Idle"), (45.0, "Owner", "Idle"), (45.0, "Unclaimed", "Idle")]
    assert len(matches) >= 2 and matches[1] - t0 == 60.0  # matched again the next cycle
    assert _of(evs, "job.started") == []
