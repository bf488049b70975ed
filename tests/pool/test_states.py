"""Seed 001's machine states and activities, with their timers, on the virtual clock."""
from __future__ import annotations

from typing import Any

from schemas.events import Envelope, Matched
from services.pool.sim import PoolSim
from tests.pool.helpers import sim_of, states

SLOT = "slot1@ep1.example.org"


def pool(config: dict[str, Any] | None = None, jobs: list[dict[str, Any]] | None = None,
         actions: list[dict[str, Any]] | None = None, sim: dict[str, Any] | None = None,
         users: tuple[str, ...] = ("alice",)) -> PoolSim:
    """One machine with one static slot, and `jobs` for each user in `users`."""
    job = jobs or [{"arrival": {"kind": "batch", "count": 1}, "duration": "1h"}]
    doc: dict[str, Any] = {
        "pool": {"duration": "3h"},
        "machines": [{"name": "ep1.example.org", "cpus": 1, "memory": 2048,
                      "config": {"NUM_SLOTS": 1, **(config or {})}}],
        "submitters": [{"user": u, "jobs": job} for u in users],
        "actions": actions or [],
    }
    if sim:
        doc["sim"] = sim
    return sim_of(doc)


def match(sim: PoolSim, job_id: str = "1.0", submitter: str = "alice@example.org",
          reason: str = "NoPreemption", preempts: str | None = None, slot: str = SLOT) -> list[Envelope]:
    m = Matched(negotiator="n", cycle=1, job_id=job_id, schedd="schedd@ap1.example.org",
                submitter=submitter, group="<none>", slot=slot, reason=reason,  # type: ignore[arg-type]
                preempts=preempts)
    return sim.apply_match(m, sim.now)


def rel(sim: PoolSim, events: list[Envelope]) -> list[tuple[float, str, str]]:
    return [(ts - sim.scenario.start, st, act) for ts, st, act in states(events, SLOT)]


def jobs(sim: PoolSim, events: list[Envelope]) -> list[tuple[float, str, str, str]]:
    return [(e.ts - sim.scenario.start, e.type, e.data.job_id, getattr(e.data, "reason", ""))
            for e in events if e.type in ("job.started", "job.stopped")]


def test_boot_match_claim_activate_complete_release() -> None:
    sim = pool()
    events = sim.advance_to(sim.now)
    assert rel(sim, events) == [(0, "Owner", "Idle"), (0, "Unclaimed", "Idle")]
    sim.advance_to(sim.now + 60)
    events = match(sim)
    assert rel(sim, events) == [(60, "Matched", "Idle"), (60, "Claimed", "Idle"), (60, "Claimed", "Busy")]
    busy = [e.data.ad for e in events if e.type == "ad.updated" and e.data.name == SLOT][-1]
    assert (busy["RemoteUser"], busy["RemoteOwner"], busy["JobId"], busy["JobStart"]) == \
        ("alice@example.org", "alice@example.org", "1.0", int(sim.now))
    assert busy["EnteredCurrentState"] == busy["EnteredCurrentActivity"] == int(sim.now)
    events = sim.advance_to(sim.scenario.start + 7200)
    assert rel(sim, events) == [(3660, "Claimed", "Idle"), (3660, "Preempting", "Vacating"),
                                (3660, "Owner", "Idle"), (3660, "Unclaimed", "Idle")]
    assert jobs(sim, events) == [(3660, "job.stopped", "1.0", "completed")]
    unclaimed = sim.slot_ads()[0]
    assert "RemoteUser" not in unclaimed and unclaimed["EnteredCurrentState"] == sim.scenario.start + 3660


def test_match_timeout_returns_the_slot_to_owner_then_unclaimed() -> None:
    # the schedd never claims within MATCH_TIMEOUT (default 120 s): Matched -> Owner -> Unclaimed
    sim = pool(sim={"claim_delay": 600})
    sim.advance_to(sim.now)
    events = match(sim)
    events += sim.advance_to(sim.now + 1000)
    assert rel(sim, events) == [(0, "Matched", "Idle"), (120, "Owner", "Idle"), (120, "Unclaimed", "Idle")]
    assert jobs(sim, events) == []
    assert [j.job_id for j in sim.idle_jobs()] == ["1.0"]


def test_match_timeout_is_a_knob() -> None:
    sim = pool(config={"MATCH_TIMEOUT": 30}, sim={"claim_delay": 60})
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.now + 100)
    assert rel(sim, events)[1] == (30, "Owner", "Idle")


def test_matched_slot_requirements_are_false() -> None:
    sim = pool(sim={"claim_delay": 60})
    sim.advance_to(sim.now)
    match(sim)
    assert sim.slot_ads()[0]["Requirements"] is False


def test_claim_refused_by_start_goes_matched_owner_unclaimed() -> None:
    sim = pool(config={"START": 'Owner != "bob"'}, users=("bob",))
    sim.advance_to(sim.now)
    events = match(sim, submitter="bob@example.org")
    assert rel(sim, events) == [(0, "Matched", "Idle"), (0, "Owner", "Idle"), (0, "Unclaimed", "Idle")]
    assert [j.job_id for j in sim.idle_jobs()] == ["1.0"]


PREEMPT_POLICY = {"PREEMPT": "$(KeyboardBusy)", "WANT_VACATE": True,
                  "MAXJOBRETIREMENTTIME": 3600, "MachineMaxVacateTime": 120}


def test_preempt_retires_then_vacates_then_kills() -> None:
    # owner comes back at t=1000: Claimed/Retiring; MaxJobRetirementTime 3600 since JobStart 0
    # with a 120 s vacate grant: Preempting/Vacating at 3480; a job that ignores its KillSig is
    # hard-killed when MachineMaxVacateTime runs out (3600); the claim ends in Owner.
    sim = pool(config=PREEMPT_POLICY,
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h", "vacate_time": "never"}],
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "2h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 3700)
    assert rel(sim, events) == [
        (0, "Matched", "Idle"), (0, "Claimed", "Idle"), (0, "Claimed", "Busy"),
        (1000, "Claimed", "Retiring"), (3480, "Preempting", "Vacating"),
        (3600, "Preempting", "Killing"), (3600, "Owner", "Idle"), (3600, "Unclaimed", "Idle")]
    assert jobs(sim, events) == [(0, "job.started", "1.0", ""), (3600, "job.stopped", "1.0", "vacated")]
    assert [j.job_id for j in sim.idle_jobs()] == ["1.0"]


def test_graceful_vacate_ends_without_killing() -> None:
    sim = pool(config={**PREEMPT_POLICY, "MAXJOBRETIREMENTTIME": 0},
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h", "vacate_time": 30}],
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "2h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 2000)
    assert rel(sim, events)[3:] == [(1000, "Claimed", "Retiring"), (1000, "Preempting", "Vacating"),
                                    (1030, "Owner", "Idle"), (1030, "Unclaimed", "Idle")]


def test_job_max_vacate_time_lowers_the_grant() -> None:
    sim = pool(config={**PREEMPT_POLICY, "MAXJOBRETIREMENTTIME": 0},
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h",
                      "vacate_time": "never", "job_max_vacate_time": 40}],
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "2h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 2000)
    assert (1040, "Preempting", "Killing") in rel(sim, events)


def test_want_vacate_false_kills_at_once_and_kill_cuts_vacating_short() -> None:
    sim = pool(config={**PREEMPT_POLICY, "MAXJOBRETIREMENTTIME": 0, "WANT_VACATE": False},
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h", "vacate_time": 30}],
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "2h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 2000)
    assert rel(sim, events)[3:6] == [(1000, "Claimed", "Retiring"), (1000, "Preempting", "Killing"),
                                     (1000, "Owner", "Idle")]
    sim = pool(config={**PREEMPT_POLICY, "MAXJOBRETIREMENTTIME": 0, "KILL": "$(ActivityTimer) > 10"},
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h", "vacate_time": 100}],
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "2h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 2000)
    killing = [t for t, st, act in rel(sim, events) if act == "Killing"]
    assert len(killing) == 1 and 1010 < killing[0] <= 1015  # KILL seen at the next poll (5 s)


def test_suspend_and_continue_delay_completion() -> None:
    sim = pool(config={"WANT_SUSPEND": True, "SUSPEND": "$(KeyboardBusy)",
                       "CONTINUE": "KeyboardIdle > 2 * $(MINUTE)"},
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "5m"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 9000)
    seq = rel(sim, events)
    assert seq[3] == (1000, "Claimed", "Suspended")
    resumed = seq[4]
    assert resumed[1:] == ("Claimed", "Busy") and 1420 < resumed[0] <= 1425
    suspended = resumed[0] - 1000
    assert seq[5] == (3600 + suspended, "Claimed", "Idle")  # the job needed its full hour of running
    history = [e.data.ad for e in events if e.type == "job.history"][0]
    assert history["CumulativeSuspensionTime"] == suspended
    assert history["RemoteWallClockTime"] == 3600 + suspended
    assert history["TotalSuspensions"] == 1


def test_preempt_while_suspended_retires() -> None:
    # seed 001's desktop policy: preempt after MaxSuspendTime (10 min) of suspension
    sim = pool(config={"WANT_SUSPEND": True, "SUSPEND": "$(KeyboardBusy)", "CONTINUE": "False",
                       "PREEMPT": '(Activity == "Suspended") && ($(ActivityTimer) > $(MaxSuspendTime))'},
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "1h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 3000)
    seq = rel(sim, events)
    assert seq[3] == (1000, "Claimed", "Suspended")
    assert seq[4][1:] == ("Claimed", "Retiring") and 1600 < seq[4][0] <= 1605
    assert seq[5][1:] == ("Preempting", "Killing")


def test_claim_lease_expires_when_the_schedd_goes_silent() -> None:
    # alives every ALIVE_INTERVAL (300 s) from the schedd's start: the last one before it dies
    # at 1000 is at 900; JobLeaseDuration 2400 -> the startd drops the claim at 3300.
    sim = pool(jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h"}],
               actions=[{"at": 1000, "kind": "schedd_down"}, {"at": 4000, "kind": "schedd_up"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 3500)
    assert rel(sim, events)[3:] == [(3300, "Preempting", "Killing"), (3300, "Owner", "Idle"),
                                    (3300, "Unclaimed", "Idle")]
    stopped = [e for e in events if e.type == "job.stopped"]
    assert [(e.source, e.data.reason, e.data.schedd, e.data.submitter) for e in stopped] == \
        [("startd@ep1.example.org", "evicted", "schedd@ap1.example.org", "alice@example.org")]
    assert sim.idle_jobs() == []  # the schedd is down
    events = sim.advance_to(sim.scenario.start + 4000)
    assert [j.job_id for j in sim.idle_jobs()] == ["1.0"]
    assert not [e for e in events if e.type == "job.stopped"]  # reported once, by the startd


def test_short_job_lease_lowers_the_alive_interval() -> None:
    # JobLeaseDuration 600: alives every max(10, 600/3) = 200 s -> last alive 1000, expiry 1600
    sim = pool(jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h",
                      "job_lease_duration": 600}],
               actions=[{"at": 1000, "kind": "schedd_down"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 2000)
    assert rel(sim, events)[3] == (1600, "Preempting", "Killing")


def test_schedd_back_within_the_lease_keeps_the_job() -> None:
    sim = pool(actions=[{"at": 1000, "kind": "schedd_down"}, {"at": 2000, "kind": "schedd_up"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 7000)
    assert jobs(sim, events) == [(0, "job.started", "1.0", ""), (3600, "job.stopped", "1.0", "completed")]


def test_rank_preemption_hands_the_slot_to_the_better_job() -> None:
    sim = pool(config={"RANK": 'Owner == "bob"'}, users=("alice", "bob"))
    sim.advance_to(sim.now)
    match(sim)
    assert sim.slot_ads()[0]["CurrentRank"] == 0.0
    sim.advance_to(sim.now + 100)
    events = match(sim, "2.0", "bob@example.org", reason="Rank", preempts="1.0")
    assert rel(sim, events) == [(100, "Claimed", "Retiring"), (100, "Preempting", "Killing"),
                                (100, "Claimed", "Idle"), (100, "Claimed", "Busy")]
    assert jobs(sim, events) == [(100, "job.stopped", "1.0", "preempted"), (100, "job.started", "2.0", "")]
    ad = sim.slot_ads()[0]
    assert (ad["RemoteUser"], ad["CurrentRank"]) == ("bob@example.org", 1.0)


def test_priority_preemption_waits_for_retirement() -> None:
    sim = pool(config={"MAXJOBRETIREMENTTIME": 1000, "MachineMaxVacateTime": 0},
               users=("alice", "bob"))
    sim.advance_to(sim.now)
    match(sim)
    sim.advance_to(sim.now + 100)
    events = match(sim, "2.0", "bob@example.org", reason="Priority", preempts="1.0")
    assert rel(sim, events) == [(100, "Claimed", "Retiring")]
    assert sim.slot_ads()[0]["PreemptingUser"] == "bob@example.org"
    events = sim.advance_to(sim.scenario.start + 1500)
    assert jobs(sim, events) == [(1000, "job.stopped", "1.0", "preempted"), (1000, "job.started", "2.0", "")]


def test_vacate_drain_and_cancel() -> None:
    sim = pool(jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h"}],
               actions=[{"at": 100, "kind": "drain", "machines": "ep1*"},
                        {"at": 200, "kind": "cancel_drain", "machines": "ep1*"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 300)
    assert rel(sim, events)[3:] == [(100, "Claimed", "Retiring"), (100, "Preempting", "Killing"),
                                    (100, "Drained", "Retiring"), (100, "Drained", "Idle"),
                                    (200, "Owner", "Idle"), (200, "Unclaimed", "Idle")]
    assert jobs(sim, events)[-1] == (100, "job.stopped", "1.0", "evicted")
    sim = pool(actions=[{"at": 100, "kind": "vacate", "machines": "*"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 300)
    assert jobs(sim, events)[-1] == (100, "job.stopped", "1.0", "vacated")


def test_startd_off_withdraws_every_slot() -> None:
    sim = pool(actions=[{"at": 100, "kind": "startd_off", "machines": "*", "fast": True},
                        {"at": 200, "kind": "startd_on", "machines": "*"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 150)
    assert [(e.type, e.data.name) for e in events if e.type == "ad.invalidated"] == \
        [("ad.invalidated", SLOT)]
    assert jobs(sim, events)[-1] == (100, "job.stopped", "1.0", "evicted")
    assert sim.slot_ads() == []
    sim.advance_to(sim.scenario.start + 200)
    assert [a["State"] for a in sim.slot_ads()] == ["Unclaimed"]


def test_claim_reuse_until_claim_worklife() -> None:
    sim = pool(config={"CLAIM_WORKLIFE": 1500},
               jobs=[{"arrival": {"kind": "batch", "count": 3}, "duration": "10m"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 3600)
    # 1.0 and 1.1 share the claim (second start at 600 < 1500); at 1200 the claim is
    # 1200 s old, still < 1500, so 1.2 runs too; then the claim is released.
    assert jobs(sim, events) == [
        (0, "job.started", "1.0", ""), (600, "job.stopped", "1.0", "completed"),
        (600, "job.started", "1.1", ""), (1200, "job.stopped", "1.1", "completed"),
        (1200, "job.started", "1.2", ""), (1800, "job.stopped", "1.2", "completed")]
    assert rel(sim, events)[-3:] == [(1800, "Preempting", "Vacating"), (1800, "Owner", "Idle"),
                                     (1800, "Unclaimed", "Idle")]


def test_periodic_slot_updates_every_update_interval() -> None:
    sim = pool(sim={"periodic_slot_updates": True})
    events = sim.advance_to(sim.scenario.start + 650)
    assert [t for t, _, _ in rel(sim, events)] == [0, 0, 300, 600]
    quiet = pool()
    assert [t for t, _, _ in rel(quiet, quiet.advance_to(quiet.scenario.start + 650))] == [0, 0]


def test_preempt_on_total_claim_run_time_evicts() -> None:
    # seed 001's policy expressions use the startd's time attributes: with
    # PREEMPT = TotalClaimRunTime > 20 the claim is preempted at the first poll (POLLING_INTERVAL
    # 5 s) after 20 s of running; no retirement, no vacate: killed at once.
    sim = pool(config={"PREEMPT": "TotalClaimRunTime > 20", "MAXJOBRETIREMENTTIME": 0,
                       "WANT_VACATE": False},
               jobs=[{"arrival": {"kind": "batch", "count": 1}, "duration": "10h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 100)
    seq = rel(sim, events)
    assert seq[3][1:] == ("Claimed", "Retiring") and 20 < seq[3][0] <= 25
    assert seq[4] == (seq[3][0], "Preempting", "Killing")
    assert jobs(sim, events)[1][1:] == ("job.stopped", "1.0", "vacated")


def test_time_attributes_split_running_and_suspended_time() -> None:
    # suspended from 1000 for 5 minutes of owner activity (+ up to one poll): the job's and the
    # claim's run time stop growing while suspended, their suspend time grows instead.
    sim = pool(config={"WANT_SUSPEND": True, "SUSPEND": "$(KeyboardBusy)",
                       "CONTINUE": "KeyboardIdle > 2 * $(MINUTE)"},
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "5m"}])
    start = sim.scenario.start
    sim.advance_to(sim.now)
    match(sim)
    sim.advance_to(start + 10)
    first = sim.startds["ep1.example.org"].ad(sim.startds["ep1.example.org"].all_slots()[0])
    assert (first["TotalJobRunTime"], first["TotalClaimRunTime"]) == (10, 10)
    assert "TotalJobSuspendTime" not in first and "TotalClaimSuspendTime" not in first
    sim.advance_to(start + 1200)
    startd = sim.startds["ep1.example.org"]
    ad = startd.ad(startd.all_slots()[0])
    assert ad["Activity"] == "Suspended"
    assert (ad["TotalJobRunTime"], ad["TotalClaimRunTime"]) == (1000, 1000)
    assert ad["TotalJobSuspendTime"] == ad["TotalClaimSuspendTime"] == 200
    sim.advance_to(start + 2000)
    ad = startd.ad(startd.all_slots()[0])
    assert ad["Activity"] == "Busy"
    suspended = ad["TotalJobSuspendTime"]
    assert 420 <= suspended <= 425
    assert ad["TotalJobRunTime"] == ad["TotalClaimRunTime"] == 2000 - suspended


BACKFILL = {"ENABLE_BACKFILL": True, "START_BACKFILL": "KeyboardIdle > 15 * $(MINUTE)",
            "EVICT_BACKFILL": "KeyboardIdle < $(MINUTE)"}


def test_backfill_runs_while_idle_and_leaves_for_the_owner_and_for_a_match() -> None:
    # seed 001, "Backfill State": Unclaimed -> Backfill/Idle -> Backfill/Busy (7, 26); the
    # owner returning evicts it: Backfill/Killing -> Backfill/Idle -> Owner/Idle (28-30)
    sim = pool(config=BACKFILL, actions=[{"at": 600, "kind": "owner_active", "machines": "*", "for": 30}])
    events = sim.advance_to(sim.now)
    assert rel(sim, events) == [(0, "Owner", "Idle"), (0, "Unclaimed", "Idle"),
                                (0, "Backfill", "Idle"), (0, "Backfill", "Busy")]
    events = sim.advance_to(sim.scenario.start + 600)
    assert rel(sim, events) == [(600, "Backfill", "Killing"), (600, "Backfill", "Idle"),
                                (600, "Owner", "Idle"), (600, "Unclaimed", "Idle")]
    # back to backfill once the keyboard has been idle 15 minutes (polled at UPDATE_INTERVAL)
    events = sim.advance_to(sim.scenario.start + 630 + 900 + 300)
    assert [r for r in rel(sim, events) if r[1] == "Backfill"][:2] == \
        [(1800, "Backfill", "Idle"), (1800, "Backfill", "Busy")]
    # a match kills the backfill client and the slot goes Matched, then Claimed (32)
    events = match(sim)
    assert rel(sim, events)[:4] == [(1830, "Backfill", "Killing"), (1830, "Backfill", "Idle"),
                                    (1830, "Matched", "Idle"), (1830, "Claimed", "Idle")]
    assert [e.data.job_id for e in events if e.type == "job.started"] == ["1.0"]


def test_no_backfill_unless_enabled() -> None:
    sim = pool(config={**BACKFILL, "ENABLE_BACKFILL": False})
    assert rel(sim, sim.advance_to(sim.now)) == [(0, "Owner", "Idle"), (0, "Unclaimed", "Idle")]
