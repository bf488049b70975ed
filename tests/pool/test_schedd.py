"""The schedd: submitter naming, job ads, history ads, condor_rm/hold/release, its ads."""
from __future__ import annotations

from typing import Any

from services.pool.schedd import submitter_name
from services.pool.sim import PoolSim
from tests.pool.helpers import run, sim_of
from tests.pool.test_states import jobs, match


def test_submitter_names_follow_htcondor() -> None:
    assert submitter_name("alice", "example.org") == (None, "alice@example.org")
    assert submitter_name("einstein", "example.org", "group_physics") == \
        ("group_physics.einstein", "group_physics.einstein@example.org")
    assert submitter_name("einstein", "example.org", "group_physics.hep", "albert") == \
        ("group_physics.hep.albert", "group_physics.hep.albert@example.org")
    assert submitter_name("carol", "example.org", nice_user=True) == \
        ("nice-user.carol", "nice-user.carol@example.org")


def grouped_pool() -> PoolSim:
    one = [{"arrival": {"kind": "batch", "count": 1}, "duration": "30m"}]
    return sim_of({
        "pool": {"uid_domain": "cs.wisc.edu", "duration": "2h"},
        "machines": [{"name": "ep{n}.cs.wisc.edu", "count": 3, "cpus": 1, "config": {"NUM_SLOTS": 1}}],
        "submitters": [
            {"user": "einstein", "group": "group_physics", "jobs": one},
            {"user": "bohr", "group": "group_physics", "group_user": "niels", "jobs": one},
            {"user": "carol", "nice_user": True, "jobs": one},
        ]})


def test_accounting_groups_and_nice_user_everywhere() -> None:
    sim = grouped_pool()
    events = sim.advance_to(sim.now)
    submitted = {e.data.job_id: e.data for e in events if e.type == "job.submitted"}
    assert {j: s.submitter for j, s in submitted.items()} == {
        "1.0": "group_physics.einstein@cs.wisc.edu",
        "2.0": "group_physics.niels@cs.wisc.edu",
        "3.0": "nice-user.carol@cs.wisc.edu"}
    ad = submitted["2.0"].ad
    assert (ad["Owner"], ad["User"], ad["AccountingGroup"], ad["AcctGroup"], ad["AcctGroupUser"]) == \
        ("bohr", "bohr@cs.wisc.edu", "group_physics.niels", "group_physics", "niels")
    carol = submitted["3.0"].ad
    assert (carol["NiceUser"], carol["AccountingGroup"], carol["MaxJobRetirementTime"]) == \
        (True, "nice-user.carol", 0)
    assert [(v.job_id, v.submitter) for v in sim.idle_jobs()] == [
        ("1.0", "group_physics.einstein@cs.wisc.edu"), ("2.0", "group_physics.niels@cs.wisc.edu"),
        ("3.0", "nice-user.carol@cs.wisc.edu")]
    events = run(sim, until=sim.now + 60)
    started = {e.data.job_id: e.data for e in events if e.type == "job.started"}
    assert started["2.0"].submitter == "group_physics.niels@cs.wisc.edu"
    slots = {a.get("JobId"): a for a in sim.slot_ads()}
    assert (slots["2.0"]["RemoteUser"], slots["2.0"]["RemoteOwner"], slots["2.0"]["AccountingGroup"]) == \
        ("group_physics.niels@cs.wisc.edu", "bohr@cs.wisc.edu", "group_physics.niels@cs.wisc.edu")
    submitters = {e.data.name: e.data.ad for e in events + sim.advance_to(sim.now + 300)
                  if e.type == "ad.updated" and e.data.ad_type == "Submitter"}
    assert submitters["nice-user.carol@cs.wisc.edu"]["RunningJobs"] == 1
    assert submitters["group_physics.einstein@cs.wisc.edu"]["ScheddName"] == "ap1.example.org"


REQUIRED_HISTORY = {
    "GlobalJobId", "ClusterId", "ProcId", "Owner", "User", "AccountingGroup", "QDate",
    "JobStartDate", "JobCurrentStartDate", "CompletionDate", "EnteredCurrentStatus", "JobStatus",
    "ExitCode", "RemoteWallClockTime", "RemoteHost", "LastRemoteHost", "RequestCpus",
    "RequestMemory", "RequestDisk", "Cpus", "Memory", "Disk", "NumJobStarts", "JobUniverse", "Cmd",
    "Iwd", "JobPrio", "Requirements", "Rank", "ConcurrencyLimits", "LastMatchTime", "KillSig",
    "CumulativeSuspensionTime", "LastJobStatus", "ExitBySignal", "JobRunCount",
}


def test_history_ad_is_complete_and_right() -> None:
    sim = sim_of({
        "pool": {"start": 1763800000, "duration": "3h"},
        "machines": [{"name": "ep7.example.org", "cpus": 4, "memory": 8192, "config": {"NUM_SLOTS": 2}}],
        "submitters": [{"user": "einstein", "group": "group_physics", "jobs": [{
            "arrival": {"kind": "batch", "at": 100, "count": 1}, "duration": "1h",
            "request_cpus": 2, "request_memory": 2048, "priority": 7, "exit_code": 3,
            "concurrency_limits": "xsw,fileserver:3", "rank": "Memory", "requirements": "TARGET.Cpus >= 2",
            "cmd": "/usr/bin/simulate", "args": "--fast"}]}]})
    sim.advance_to(sim.scenario.start + 160)
    match(sim, "1.0", "group_physics.einstein@example.org", slot="slot1@ep7.example.org")
    events = sim.advance_to(sim.scenario.start + 7200)
    (history,) = [e.data.ad for e in events if e.type == "job.history"]
    assert REQUIRED_HISTORY <= set(history)
    t0 = 1763800000
    assert history["GlobalJobId"] == f"ap1.example.org#1.0#{t0 + 100}"
    assert (history["ClusterId"], history["ProcId"], history["Owner"], history["User"]) == \
        (1, 0, "einstein", "einstein@example.org")
    assert history["AccountingGroup"] == "group_physics.einstein"
    assert (history["QDate"], history["JobStartDate"], history["JobCurrentStartDate"]) == \
        (t0 + 100, t0 + 160, t0 + 160)
    assert history["CompletionDate"] == history["EnteredCurrentStatus"] == t0 + 160 + 3600
    assert (history["JobStatus"], history["LastJobStatus"], history["ExitCode"]) == (4, 2, 3)
    assert history["RemoteWallClockTime"] == 3600.0
    assert history["RemoteHost"] == history["LastRemoteHost"] == "slot1@ep7.example.org"
    assert (history["RequestCpus"], history["RequestMemory"], history["Cpus"], history["Memory"]) == \
        (2, 2048, 2, 4096)
    assert (history["NumJobStarts"], history["JobUniverse"], history["Cmd"], history["Iwd"]) == \
        (1, 5, "/usr/bin/simulate", "/home/einstein")
    assert history["JobPrio"] == 7 and history["ConcurrencyLimits"] == "xsw,fileserver:3"
    assert history["Rank"] == "/Expr(Memory)/"
    assert history["Requirements"].startswith("/Expr((TARGET.Cpus >= 2) && (TARGET.Arch == \"X86_64\")")
    (stopped,) = [e.data for e in events if e.type == "job.stopped"]
    assert (stopped.reason, stopped.schedd, stopped.submitter, stopped.slot) == \
        ("completed", "schedd@ap1.example.org", "group_physics.einstein@example.org", "slot1@ep7.example.org")


def test_evicted_job_runs_again_and_history_counts_both_runs() -> None:
    sim = sim_of({
        "pool": {"duration": "4h"},
        "machines": [{"name": "ep1.example.org", "cpus": 1, "config": {"NUM_SLOTS": 1}}],
        "submitters": [{"user": "alice", "jobs": [{"arrival": {"kind": "batch", "count": 1},
                                                   "duration": "1h"}]}],
        "actions": [{"at": 600, "kind": "vacate", "machines": "*"}]})
    sim.advance_to(sim.now)
    match(sim)
    sim.advance_to(sim.scenario.start + 900)
    events = match(sim) + sim.advance_to(sim.scenario.start + 9000)
    (history,) = [e.data.ad for e in events if e.type == "job.history"]
    assert history["NumJobStarts"] == 2
    assert history["JobStartDate"] == sim.scenario.start
    assert history["JobCurrentStartDate"] == sim.scenario.start + 900
    assert history["RemoteWallClockTime"] == 600 + 3600
    assert history["LastVacateTime"] == sim.scenario.start + 600
    assert history["CommittedTime"] == 3600


def condor_rm_pool(actions: list[dict[str, Any]]) -> PoolSim:
    return sim_of({
        "pool": {"duration": "2h"},
        "machines": [{"name": "ep1.example.org", "cpus": 1, "config": {"NUM_SLOTS": 1}}],
        "submitters": [{"user": "alice", "jobs": [{"arrival": {"kind": "batch", "count": 2},
                                                   "duration": "1h"}]}],
        "actions": actions})


def test_condor_rm_stops_the_running_job_and_writes_history() -> None:
    sim = condor_rm_pool([{"at": 600, "kind": "remove", "user": "alice"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 700)
    assert jobs(sim, events)[1:] == [(600, "job.stopped", "1.0", "removed")]
    histories = [e.data.ad for e in events if e.type == "job.history"]
    assert [(h["ProcId"], h["JobStatus"], h["LastJobStatus"]) for h in histories] == [(0, 3, 2), (1, 3, 1)]
    assert histories[0]["RemoveReason"] == "via condor_rm (by user alice)"
    assert histories[0]["RemoteWallClockTime"] == 600.0
    assert sim.slot_ads()[0]["State"] == "Unclaimed"


def test_condor_hold_and_release() -> None:
    sim = condor_rm_pool([{"at": 600, "kind": "hold", "user": "alice", "count": 1},
                          {"at": 900, "kind": "release", "user": "alice"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 700)
    assert jobs(sim, events)[1:] == [(600, "job.stopped", "1.0", "held")]
    assert not [e for e in events if e.type == "job.history"]
    assert [j.job_id for j in sim.idle_jobs()] == ["1.1"]
    sim.advance_to(sim.scenario.start + 900)
    assert [j.job_id for j in sim.idle_jobs()] == ["1.0", "1.1"]


def test_scheduler_ad_is_published_every_schedd_interval() -> None:
    sim = condor_rm_pool([])
    events = sim.advance_to(sim.now + 650)
    ads = [(e.ts - sim.scenario.start, e.data.ad["TotalIdleJobs"]) for e in events
           if e.type == "ad.updated" and e.data.ad_type == "Scheduler"]
    assert ads == [(0, 0), (300, 2), (600, 2)]


def test_condor_prio_reorders_the_idle_queue() -> None:
    sim = condor_rm_pool([{"at": 10, "kind": "prio", "user": "alice", "value": -5, "count": 1}])
    sim.advance_to(sim.now)
    assert [(j.job_id, j.ad["JobPrio"]) for j in sim.idle_jobs()] == [("1.0", 0), ("1.1", 0)]
    sim.advance_to(sim.now + 10)
    assert [(j.job_id, j.ad["JobPrio"]) for j in sim.idle_jobs()] == [("1.1", 0), ("1.0", -5)]
