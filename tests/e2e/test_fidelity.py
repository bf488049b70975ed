"""HTCondor behaviours a whole pool shows (issue 15): startd RANK preemption by a submitter at
its fair share, and a consumption policy matching several jobs to one pslot per cycle."""
from __future__ import annotations

from pathlib import Path

from tests.e2e.helpers import batch, events, machines, run, running_by


def test_startd_rank_preempts_for_a_submitter_at_its_fair_share(tmp_path: Path) -> None:
    # Two one-slot machines, each user running one 10-hour job (their fair share of 1; alice
    # has another idle, so both stay in the pie and both are at their limit). At 30 min bob submits a TimeSensitive job; ep01's RANK prefers such jobs (and only ep01
    # takes them). HTCondor lets bob, at his pie limit, still preempt for startd RANK in the
    # first pie spin: the job runs within a cycle instead of waiting 10 hours.
    one_slot = {"cpus": 1, "memory": 4096, "disk": 10_000_000}
    doc = {"machines": [
        {"name": "ep01.example.org", **one_slot,
         "config": {"NUM_SLOTS": 1, "RANK": "TARGET.TimeSensitive =?= True"}},
        {"name": "ep02.example.org", **one_slot,
         "config": {"NUM_SLOTS": 1, "START": "TARGET.TimeSensitive =!= True"}}],
        "submitters": [
            {"user": "alice", "jobs": [batch(2, "10h")]},
            {"user": "bob", "jobs": [batch(1, "10h"),
                                     batch(1, "1h", at="30m", attrs={"TimeSensitive": True})]}]}
    run(tmp_path, doc, hours=2)
    evs = list(events(tmp_path))
    rank = [e for e in evs if e.type == "match" and e.data.reason == "Rank"]
    assert len(rank) == 1 and rank[0].data.submitter == "bob@example.org"
    assert rank[0].data.slot == "slot1@ep01.example.org"
    ts_start = [e.ts for e in evs if e.type == "job.started" and e.data.job_id == "3.0"]
    assert ts_start and ts_start[0] - evs[0].ts < 3600  # not after a 10-hour job


def test_consumption_policy_matches_a_whole_pslot_in_one_cycle(tmp_path: Path) -> None:
    # seed 001's consumption policy on an 8-core partitionable slot: the negotiator matches all
    # eight 1-core jobs to it in its first cycle, each dynamic slot sized by the policy
    # (RequestMemory 1000 -> quantize(..., {128}) = 1024), with its pslot's SlotTypeID.
    doc = {"machines": [{"name": "ep7.example.org", "cpus": 8, "memory": 16384,
                         "config": {"SLOT_TYPE_1": "cpus=8", "NUM_SLOTS_TYPE_1": 1,
                                    "SLOT_TYPE_1_PARTITIONABLE": True,
                                    "CONSUMPTION_POLICY": True}}],
           "submitters": [{"user": "alice", "jobs": [batch(8, "1h", request_memory=1000)]}]}
    run(tmp_path, doc, hours=0.5)
    evs = list(events(tmp_path))
    matches = [e.data for e in evs if e.type == "match"]
    assert len(matches) == 8 and len({m.cycle for m in matches}) == 1
    started = [e.data for e in evs if e.type == "job.started"]
    assert len(started) == 8
    assert {s.resources["Memory"] for s in started} == {1024}
    dslots = {e.data.name: e.data.ad for e in evs if e.type == "ad.updated"
              and e.data.ad.get("DynamicSlot") is True}
    assert len(dslots) == 8 and {a["SlotTypeID"] for a in dslots.values()} == {1}


def test_consumption_policy_left_out_memory_is_consumed_by_htcondors_default(tmp_path: Path) -> None:
    # CONSUMPTION_POLICY with only CONSUMPTION_CPUS on an 8-core, 3000 MB pslot: the negotiator
    # consumes memory by param_info.in's quantize(target.RequestMemory, {128}), so four 1-core
    # 1000 MB jobs take 1024 MB each and only two fit (3 * 1024 > 3000); by nothing, all four would
    doc = {"machines": [{"name": "ep7.example.org", "cpus": 8, "memory": 3000,
                         "config": {"SLOT_TYPE_1": "cpus=8", "NUM_SLOTS_TYPE_1": 1,
                                    "SLOT_TYPE_1_PARTITIONABLE": True, "CONSUMPTION_POLICY": True,
                                    "CONSUMPTION_CPUS": "quantize(target.RequestCpus, {1})"}}],
           "submitters": [{"user": "alice", "jobs": [batch(4, "10h", request_memory=1000)]}]}
    run(tmp_path, doc, hours=0.5)
    evs = list(events(tmp_path))
    assert len([e for e in evs if e.type == "match"]) == 2
    started = [e.data for e in evs if e.type == "job.started"]
    assert [s.resources["Memory"] for s in started] == [1024, 1024]


def test_max_jobs_running_8_on_12_cores_runs_8_and_keeps_4_idle(tmp_path: Path) -> None:
    doc = {"config": {"MAX_JOBS_RUNNING": 8},
           "machines": machines(12),
           "submitters": [{"user": "alice", "jobs": [batch(6, "10h")]},
                          {"user": "bob", "jobs": [batch(6, "10h")]}]}
    run(tmp_path, doc, hours=1)
    evs = list(events(tmp_path))
    peak, timeline = running_by(evs, lambda d: "all")
    assert peak["all"] == 8 and timeline[-1][1]["all"] == 8
    # the negotiator stops asking the schedd once it can start no more: 8 matches, not 12
    assert len([e for e in evs if e.type == "match"]) == 8
    schedd = [e.data.ad for e in evs if e.type == "ad.updated" and e.data.ad_type == "Scheduler"][-1]
    assert (schedd["TotalRunningJobs"], schedd["TotalIdleJobs"], schedd["MaxJobsRunning"]) == (8, 4, 8)


def test_max_jobs_per_owner_caps_each_owner(tmp_path: Path) -> None:
    doc = {"config": {"MAX_JOBS_PER_OWNER": 3},
           "machines": machines(12),
           "submitters": [{"user": "alice", "jobs": [batch(6, "10h")]},
                          {"user": "bob", "jobs": [batch(6, "10h")]}]}
    run(tmp_path, doc, hours=1)
    peak, _ = running_by(list(events(tmp_path)), lambda d: d.submitter)
    assert peak == {"alice@example.org": 3, "bob@example.org": 3}


def test_pslot_preemption_runs_a_large_job_on_a_fragmented_machine(tmp_path: Path) -> None:
    # seed 001: alice's eight 1-core jobs fill an 8-core partitionable slot; bob's 4-core job,
    # which the machine's RANK prefers, fits no dynamic slot. With ALLOW_PSLOT_PREEMPTION the
    # negotiator matches it to the pslot preempting four dynamic slots, which the startd
    # preempts; the job then runs in a 4-core dynamic slot while alice keeps four.
    doc = {"config": {"ALLOW_PSLOT_PREEMPTION": True},
           "machines": [{"name": "ep7.example.org", "cpus": 8, "memory": 16384,
                         "config": {"SLOT_TYPE_1": "cpus=8", "NUM_SLOTS_TYPE_1": 1,
                                    "SLOT_TYPE_1_PARTITIONABLE": True,
                                    "RANK": "TARGET.Big =?= True"}}],
           "submitters": [
               {"user": "alice", "jobs": [batch(8, "10h", request_memory=1024)]},
               {"user": "bob", "jobs": [batch(1, "1h", at="30m", request_cpus=4,
                                              request_memory=4096,
                                              attrs={"Big": True, "WantPslotPreemption": True})]}]}
    run(tmp_path, doc, hours=2)
    evs = list(events(tmp_path))
    [m] = [e.data for e in evs if e.type == "match" and e.data.submitter == "bob@example.org"]
    assert (m.slot, m.reason) == ("slot1@ep7.example.org", "Rank")
    stopped = [e.data for e in evs if e.type == "job.stopped" and e.data.submitter == "alice@example.org"]
    assert len(stopped) == 4
    [started] = [e.data for e in evs if e.type == "job.started" and e.data.job_id == "2.0"]
    assert started.resources["Cpus"] == 4 and started.slot.startswith("slot1_")
