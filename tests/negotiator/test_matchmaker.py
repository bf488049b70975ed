"""Negotiation policy: pie spin, floors, ceilings, job order, sorting, preemption, limits,
partitionable slots, groups. Every scenario runs on both evaluation paths (column fast path
and classad2 only) and both must agree."""
from __future__ import annotations

import gc
from typing import Any

import pytest

from services.negotiator import (
    CycleInput,
    CycleResult,
    GroupInput,
    NegotiatorConfig,
    SubmitterInput,
    negotiate,
    to_payloads,
)
from streams.gcpolicy import FOLD_THRESHOLD
from tests.negotiator.ads import job, jobs, slot


def run(snap: CycleInput, cfg: NegotiatorConfig | None = None) -> CycleResult:
    """Negotiate on the fast path and on classad2 alone; they must give the same matches."""
    cfg = cfg or NegotiatorConfig()
    fast = negotiate(snap, cfg)
    slow = negotiate(snap, NegotiatorConfig(**{**cfg.__dict__, "fast_path": False}))
    assert fast.matches == slow.matches
    assert fast.rejections == slow.rejections
    return fast


def cycle(subs: list[SubmitterInput], slots: list[dict[str, Any]],
          idle: dict[str, list[dict[str, Any]]], **kw: Any) -> CycleInput:
    return CycleInput(now=1_700_000_000.0, cycle=7, submitters=subs, slots=slots, jobs=idle, **kw)


def test_pie_shares_follow_inverse_eup_4_2_1() -> None:
    subs = [SubmitterInput("a@d", 5.0), SubmitterInput("b@d", 10.0), SubmitterInput("c@d", 20.0)]
    idle = {s.name: jobs(k + 1, 100) for k, s in enumerate(subs)}
    res = run(cycle(subs, [slot(i) for i in range(70)], idle))
    assert res.count_by_submitter() == {"a@d": 40, "b@d": 20, "c@d": 10}
    assert res.pool_size == 70


def test_leftover_pie_is_respun_to_remaining_submitters() -> None:
    subs = [SubmitterInput("a@d", 5.0), SubmitterInput("b@d", 10.0)]
    idle = {"a@d": jobs(1, 3), "b@d": jobs(2, 100)}
    res = run(cycle(subs, [slot(i) for i in range(30)], idle))
    assert res.count_by_submitter() == {"a@d": 3, "b@d": 27}
    assert res.counters["spins"] >= 2


def test_unmatchable_high_priority_job_does_not_block_lower_priority() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": [
        job(1, 0, JobPrio=10, Requirements="/Expr(TARGET.Memory > 1000000000)/"),
        job(2, 0, JobPrio=9),
    ]}
    res = run(cycle(subs, [slot(1)], idle))
    assert [m.job_id for m in res.matches] == ["2.0"]
    [rej] = res.rejections
    assert rej.example_job == "1.0" and rej.reasons == {"no match found": 1}


def test_job_order_prio_then_qdate_then_id() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": [job(5, 0, QDate=50), job(3, 1, QDate=10), job(3, 0, QDate=10),
                    job(9, 0, JobPrio=-1, QDate=1), job(8, 0, JobPrio=2, QDate=99)]}
    res = run(cycle(subs, [slot(i) for i in range(5)], idle))
    assert [m.job_id for m in res.matches] == ["8.0", "3.0", "3.1", "5.0", "9.0"]


def test_rejected_cluster_skips_its_other_procs_unless_negotiate_all() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    big = "/Expr(TARGET.Memory >= RequestMemory)/"
    idle = {"u@d": [job(1, 0, RequestMemory=999999, Requirements=big), job(1, 1), job(2, 0)]}
    res = run(cycle(subs, [slot(i) for i in range(5)], idle))
    assert [m.job_id for m in res.matches] == ["2.0"]
    res = run(cycle(subs, [slot(i) for i in range(5)], idle),
              NegotiatorConfig(negotiate_all_jobs_in_cluster=True))
    assert sorted(m.job_id for m in res.matches) == ["1.1", "2.0"]


def test_below_floor_submitter_is_served_first() -> None:
    subs = [SubmitterInput("good@d", 1.0), SubmitterInput("poor@d", 100.0, floor=5)]
    idle = {"good@d": jobs(1, 50), "poor@d": jobs(2, 50)}
    res = run(cycle(subs, [slot(i) for i in range(10)], idle))
    assert [m.submitter for m in res.matches[:5]] == ["poor@d"] * 5
    assert res.submitters["poor@d"].floor_matches == 5
    assert res.count_by_submitter()["good@d"] == 5
    no_floor = run(cycle([subs[0], SubmitterInput("poor@d", 100.0)], [slot(i) for i in range(10)],
                         idle))
    assert no_floor.count_by_submitter()["poor@d"] < 5


def test_ceiling_caps_a_submitter() -> None:
    subs = [SubmitterInput("a@d", 1.0, weighted_usage=1.0, ceiling=4)]
    running = slot(99, State="Claimed", Activity="Busy", RemoteUser="a@d", RemoteOwner="a@d")
    res = run(cycle(subs, [slot(i) for i in range(10)] + [running], {"a@d": jobs(1, 50)}))
    assert res.count_by_submitter() == {"a@d": 3}


def test_nice_user_only_gets_what_others_leave() -> None:
    nice = SubmitterInput("nice-user.bob@d", 0.5 * 1e10)
    subs = [SubmitterInput("alice@d", 0.5), nice]
    res = run(cycle(subs, [slot(i) for i in range(50)],
                    {"alice@d": jobs(1, 30), nice.name: jobs(2, 100)}))
    assert res.count_by_submitter() == {"alice@d": 30, nice.name: 20}
    res = run(cycle(subs, [slot(i) for i in range(50)],
                    {"alice@d": jobs(1, 100), nice.name: jobs(2, 100)}))
    assert res.count_by_submitter() == {"alice@d": 50}


def pslot(**kw: Any) -> dict[str, Any]:
    d = slot(1, Name="slot1@big.example.org", Machine="big.example.org", Cpus=10,
             Memory=10240, Disk=100_000_000, PartitionableSlot=True, SlotType="Partitionable",
             START="/Expr(TARGET.RequestCpus <= MY.Cpus && TARGET.RequestMemory <= MY.Memory)/")
    d.update(kw)
    return d


def test_partitionable_slot_carving_seed_example() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": [job(1, 0, RequestCpus=3, RequestMemory=1024, RequestDisk=10240)]}
    res = run(cycle(subs, [pslot()], idle))
    [m] = res.matches
    assert m.slot == "slot1_1@big.example.org" and m.pslot == "slot1@big.example.org"
    assert m.weight == 3
    [d] = res.dynamic_slots
    assert (d.cpus, d.memory, d.disk) == (3, 1024, 10240)
    assert (d.pslot_cpus_left, d.pslot_memory_left, d.pslot_disk_left) == (7, 9216, 100_000_000 - 10240)


def test_partitionable_slot_takes_several_matches_per_cycle() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": jobs(1, 5, RequestCpus=3, RequestMemory=1024, RequestDisk=10240)}
    res = run(cycle(subs, [pslot()], idle))
    assert [m.slot for m in res.matches] == [f"slot1_{k}@big.example.org" for k in (1, 2, 3)]
    assert res.dynamic_slots[-1].pslot_cpus_left == 1
    assert res.dynamic_slots[-1].pslot_memory_left == 10240 - 3 * 1024
    assert res.rejections[0].reasons == {"no match found": 2}


def test_request_is_not_rounded_without_a_consumption_policy() -> None:
    # HTCondor's negotiator takes RequestMemory as it is: a 1 MB job fits a 100 MB pslot
    # (the startd's MODIFY_REQUEST_EXPR sizes the dynamic slot when it is claimed).
    subs = [SubmitterInput("u@d", 1.0)]
    res = run(cycle(subs, [pslot(Memory=100)], {"u@d": [job(1, RequestMemory=1, RequestDisk=1)]}))
    [d] = res.dynamic_slots
    assert (d.memory, d.disk, d.pslot_memory_left) == (1, 1, 99)


#: A pslot with HTCondor's default consumption policy (seed 001's CONSUMPTION_<RES>).
CP_DEFAULTS = {"MachineResources": "Cpus Memory Disk Swap",
               "ConsumptionCpus": "/Expr(quantize(target.RequestCpus, {1}))/",
               "ConsumptionMemory": "/Expr(quantize(target.RequestMemory, {128}))/",
               "ConsumptionDisk": "/Expr(quantize(target.RequestDisk, {1024}))/",
               "SlotWeight": "/Expr(Cpus)/"}


def test_consumption_policy_quantizes_and_requirements_see_what_is_consumed() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    res = run(cycle(subs, [pslot(**CP_DEFAULTS)],
                    {"u@d": [job(1, RequestMemory=1000, RequestDisk=1)]}))
    [d] = res.dynamic_slots
    assert (d.cpus, d.memory, d.disk, d.weight) == (1, 1024, 1024, 1.0)
    assert (d.pslot_cpus_left, d.pslot_memory_left) == (9, 10240 - 1024)
    # The job's Requirements (TARGET.Memory >= RequestMemory) see RequestMemory = 128, what
    # the policy consumes: a 100 MB request does not fit a 100 MB pslot under the policy ...
    tiny = {"u@d": [job(1, RequestMemory=100)]}
    res = run(cycle(subs, [pslot(Memory=100, **CP_DEFAULTS)], tiny))
    assert res.matches == () and res.rejections[0].reasons == {"no match found": 1}
    # ... and a consumption of nothing at all never matches (HTCondor needs one positive asset)
    zero = {**CP_DEFAULTS, "ConsumptionCpus": 0, "ConsumptionMemory": 0, "ConsumptionDisk": 0}
    res = run(cycle(subs, [pslot(**zero)], {"u@d": [job(1)]}))
    assert res.matches == ()


def test_consumption_policy_match_costs_the_drop_in_slot_weight() -> None:
    # SLOT_WEIGHT = floor(Memory / 25) on a 200 MB pslot (weight 8): a job consuming 50 MB
    # costs 2, whatever its Cpus; four such jobs fill the pslot in one cycle.
    cp = {**CP_DEFAULTS, "ConsumptionMemory": "/Expr(target.RequestMemory)/",
          "SlotWeight": "/Expr(floor(Memory / 25))/"}
    subs = [SubmitterInput("u@d", 1.0)]
    res = run(cycle(subs, [pslot(Memory=200, **cp)], {"u@d": jobs(1, 5, RequestMemory=50)}))
    assert [m.weight for m in res.matches] == [2.0, 2.0, 2.0, 2.0]
    assert res.submitters["u@d"].weight == 8.0
    assert res.dynamic_slots[-1].pslot_memory_left == 0


def test_consumption_policy_cclim_acctgrp_one_cycle() -> None:
    # HTCondor's job_cp_cclim_acctgrp: one 8-core pslot with a consumption policy and
    # SLOT_WEIGHT floor(Memory/25), group quotas a 1, b 2, c 3, YYZ_LIMIT = 2 on c's jobs:
    # one negotiation cycle matches 1 a, 2 b, 2 c, all on the same pslot.
    cp = {**CP_DEFAULTS, "ConsumptionMemory": "/Expr(target.RequestMemory)/",
          "SlotWeight": "/Expr(floor(Memory / 25))/"}
    subs = [SubmitterInput(f"{g}.u@d", 1.0, group=g) for g in ("a", "b", "c")]
    groups = [GroupInput("a", 1.0), GroupInput("b", 2.0), GroupInput("c", 3.0)]
    idle = {"a.u@d": jobs(1, 4, RequestMemory=25), "b.u@d": jobs(2, 4, RequestMemory=25),
            "c.u@d": jobs(3, 4, RequestMemory=25, ConcurrencyLimits="yyz")}
    res = run(cycle(subs, [pslot(Cpus=8, Memory=200, **cp)], idle, groups=groups,
                    limit_max={"yyz": 2.0}))
    assert res.count_by_submitter() == {"a.u@d": 1, "b.u@d": 2, "c.u@d": 2}
    assert {m.pslot for m in res.matches} == {"slot1@big.example.org"}


def test_seed_sorting_example_slot5_slot3_slot2() -> None:
    # (pre, job rank, post): PRE_JOB_RANK dominates the job's own Rank, POST breaks ties.
    values = {1: (10, 2, 1), 2: (10, 2, 5), 3: (10, 3, 0), 4: (0, 9, 9), 5: (20, 0, 0)}
    slots = [slot(i, PreVal=p, RankVal=r, PostVal=q) for i, (p, r, q) in values.items()]
    cfg = NegotiatorConfig(negotiator_pre_job_rank="MY.PreVal",
                           negotiator_post_job_rank="MY.PostVal")
    subs = [SubmitterInput("u@d", 1.0)]
    res = run(cycle(subs, slots, {"u@d": jobs(1, 3, Rank="/Expr(TARGET.RankVal)/")}), cfg)
    assert [m.slot.split("@")[0] for m in res.matches] == ["slot5", "slot3", "slot2"]


def test_default_ranks_prefer_unclaimed_then_fewer_cpus_less_memory() -> None:
    slots = [slot(1, Memory=8192), slot(2, Memory=2048), slot(3, Memory=2048, Cpus=2)]
    res = run(cycle([SubmitterInput("u@d", 1.0)], slots, {"u@d": jobs(1, 1)}))
    assert res.matches[0].slot.startswith("slot2@")


BASS_RANK = ('/Expr((Owner == "coltrane") + (Owner == "tyner") + ((Owner == "garrison") * 10)'
             ' + (Owner == "jones"))/')


def bass(owner: str, current_rank: float, remote_prio: float | None = None) -> dict[str, Any]:
    d = slot(1, Name="slot1@bass.example.org", Machine="bass.example.org", State="Claimed",
             Activity="Busy", RemoteUser=f"{owner}@d", RemoteOwner=f"{owner}@d",
             CurrentRank=current_rank, Rank=BASS_RANK)
    if remote_prio is not None:
        d["RemoteUserPrio"] = remote_prio
    return d


def test_rank_preemption_coltrane_quartet() -> None:
    # bass runs an outsider's job (CurrentRank 0): Elvin Jones' job ranks 1 and preempts it.
    subs = [SubmitterInput("jones@d", 10.0), SubmitterInput("miles@d", 1.0, weighted_usage=1.0)]
    res = run(cycle(subs, [bass("miles", 0.0)], {"jones@d": jobs(1, 1, Owner="jones")}))
    [m] = res.matches
    assert (m.reason, m.preempts, m.slot) == ("Rank", "miles@d", "slot1@bass.example.org")
    # Later Jimmy Garrison's job ranks 10 > 1 and preempts Jones.
    subs = [SubmitterInput("garrison@d", 10.0), SubmitterInput("jones@d", 1.0, weighted_usage=1)]
    res = run(cycle(subs, [bass("jones", 1.0)], {"garrison@d": jobs(2, 1, Owner="garrison")}))
    assert [(m.reason, m.preempts) for m in res.matches] == [("Rank", "jones@d")]
    # An outsider ranks 0 < 1 on bass: never preempts Jones, whatever its priority.
    subs = [SubmitterInput("miles@d", 0.5), SubmitterInput("jones@d", 100.0, weighted_usage=1)]
    cfg = NegotiatorConfig(preemption_requirements="True")
    res = run(cycle(subs, [bass("jones", 1.0)], {"miles@d": jobs(3, 1, Owner="miles")}), cfg)
    assert res.matches == ()
    assert res.rejections[0].reasons == {"no match found": 1}
    # Between outsiders (rank 0 = 0) only priority preemption is possible: off by default.
    subs = [SubmitterInput("davis@d", 0.5), SubmitterInput("miles@d", 100.0, weighted_usage=1)]
    res = run(cycle(subs, [bass("miles", 0.0)], {"davis@d": jobs(4, 1, Owner="davis")}))
    assert res.matches == ()
    assert res.rejections[0].reasons == {"PREEMPTION_REQUIREMENTS == False": 1}


def test_priority_preemption_needs_preemption_requirements_and_better_eup() -> None:
    running = slot(1, State="Claimed", Activity="Busy", RemoteUser="hog@d", RemoteOwner="hog@d")
    subs = [SubmitterInput("new@d", 0.5), SubmitterInput("hog@d", 500.0, weighted_usage=1.0)]
    cfg = NegotiatorConfig(preemption_requirements="MY.RemoteUserPrio > SubmitterUserPrio * 1.2")
    res = run(cycle(subs, [running], {"new@d": jobs(1, 1)}), cfg)
    assert [(m.reason, m.preempts) for m in res.matches] == [("Priority", "hog@d")]
    worse = [SubmitterInput("new@d", 900.0), SubmitterInput("hog@d", 500.0, weighted_usage=1.0)]
    res = run(cycle(worse, [running], {"new@d": jobs(1, 1)}), cfg)
    assert res.rejections[0].reasons == {"insufficient priority": 1}
    res = run(cycle(subs, [running], {"new@d": jobs(1, 1)}),
              NegotiatorConfig(preemption_requirements="True", negotiator_consider_preemption=False))
    assert res.matches == ()


def test_concurrency_limit_xsw_3_never_exceeded() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": [job(c, ConcurrencyLimits="XSW") for c in range(1, 11)]}
    res = run(cycle(subs, [slot(i) for i in range(10)], idle, limit_max={"xsw": 3}))
    assert len(res.matches) == 3
    # the first refused job rejects its autocluster; the other six are skipped with it
    assert res.rejections[0].reasons == {"concurrency limit xsw reached": 7}
    running = slot(50, State="Claimed", Activity="Busy", RemoteUser="x@d", ConcurrencyLimits="xsw")
    res = run(cycle(subs, [slot(i) for i in range(10)] + [running], idle, limit_max={"xsw": 3}))
    assert len(res.matches) == 2
    res = run(cycle(subs, [slot(i) for i in range(10)], idle, limit_max={"xsw": 3},
                    limit_usage={"xsw": 3.0}))
    assert res.matches == ()


def test_concurrency_limit_units_and_set_defaults() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    idle = {"u@d": [job(c, ConcurrencyLimits="large.license:2") for c in range(1, 6)]}
    res = run(cycle(subs, [slot(i) for i in range(10)], idle, limit_prefix_default={"large": 5}))
    assert len(res.matches) == 2


def test_concurrency_limits_expr_evaluated_against_the_slot() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    slots = [slot(i, NETWORK="NETWORK_A" if i < 5 else "NETWORK_B") for i in range(10)]
    idle = {"u@d": [job(c, ConcurrencyLimits="/Expr(TARGET.NETWORK)/") for c in range(1, 11)]}
    res = run(cycle(subs, slots, idle, limit_max={"network_a": 2, "network_b": 3}),
              NegotiatorConfig(negotiate_all_jobs_in_cluster=True))
    nets = [m.slot for m in res.matches]
    assert len(nets) == 5
    assert sum(1 for m in res.matches if int(m.slot.split("@")[0][4:]) < 5) == 2


def test_group_quotas_20_10_respected() -> None:
    subs = [SubmitterInput("group_physics.einstein@d", 1.0, group="group_physics"),
            SubmitterInput("group_chemistry.curie@d", 1.0, group="group_chemistry")]
    groups = [GroupInput("group_physics", 20), GroupInput("group_chemistry", 10)]
    idle = {s.name: jobs(k + 1, 50) for k, s in enumerate(subs)}
    res = run(cycle(subs, [slot(i) for i in range(40)], idle, groups=groups))
    assert res.count_by_submitter() == {"group_physics.einstein@d": 20,
                                        "group_chemistry.curie@d": 10}
    assert {m.group for m in res.matches} == {"group_physics", "group_chemistry"}


def test_group_usage_counts_against_quota() -> None:
    subs = [SubmitterInput("g.u@d", 1.0, group="g", weighted_usage=8.0)]
    res = run(cycle(subs, [slot(i) for i in range(40)], {"g.u@d": jobs(1, 50)},
                    groups=[GroupInput("g", 10, usage=8.0)]))
    assert len(res.matches) == 2


def test_hgq_negfail_unmatchable_subgroup_surplus_goes_to_sibling() -> None:
    groups = [GroupInput("a", 20), GroupInput("b", 20),
              GroupInput("a.a", 10, accept_surplus=True), GroupInput("a.b", 10, accept_surplus=True),
              GroupInput("b.a", 10, accept_surplus=True), GroupInput("b.b", 10, accept_surplus=True)]
    subs = [SubmitterInput(f"{g}.user@d", 1.0, group=g) for g in ("a.a", "a.b", "b.a", "b.b")]
    never = "/Expr(TARGET.Memory > 1000000000)/"
    idle = {"a.a.user@d": jobs(1, 40), "a.b.user@d": jobs(2, 40, Requirements=never),
            "b.a.user@d": jobs(3, 5), "b.b.user@d": jobs(4, 5)}
    res = run(cycle(subs, [slot(i) for i in range(40)], idle, groups=groups))
    assert res.count_by_submitter() == {"a.a.user@d": 20, "b.a.user@d": 5, "b.b.user@d": 5}


def test_autoregroup_basic_van() -> None:
    groups = [GroupInput("a", 1, autoregroup=True), GroupInput("b", 1, autoregroup=True)]
    subs = [SubmitterInput("a.user@d", 1.0, group="a"), SubmitterInput("b.user@d", 1.0, group="b")]
    idle = {"a.user@d": jobs(1, 10), "b.user@d": jobs(2, 10)}
    res = run(cycle(subs, [slot(i) for i in range(4)], idle, groups=groups,
                    group_order=("b", "a")))
    assert res.count_by_submitter() == {"a.user@d": 2, "b.user@d": 2}
    assert [m.group for m in res.matches[:2]] == ["b", "a"]
    assert {m.group for m in res.matches[2:]} == {"<none>"}


def test_negotiator_slot_constraint_and_claimed_idle_skipped() -> None:
    slots = [slot(i, Pool="a" if i % 2 else "b") for i in range(6)]
    slots.append(slot(9, State="Claimed", Activity="Idle", Pool="a", RemoteUser="x@d"))
    res = run(cycle([SubmitterInput("u@d", 1.0)], slots, {"u@d": jobs(1, 10)}),
              NegotiatorConfig(negotiator_slot_constraint='Pool == "a"'))
    assert sorted(m.slot.split("@")[0] for m in res.matches) == ["slot1", "slot3", "slot5"]


def test_ephemeral_submitter_attributes_visible_to_start() -> None:
    slots = [slot(i, START="/Expr(TARGET.SubmitterUserPrio < 10 && "
                         "TARGET.SubmitterGroup == \"<none>\")/") for i in range(4)]
    subs = [SubmitterInput("good@d", 5.0), SubmitterInput("bad@d", 50.0)]
    res = run(cycle(subs, slots, {"good@d": jobs(1, 2), "bad@d": jobs(2, 2)}))
    assert res.count_by_submitter() == {"good@d": 2}


def test_unscoped_reference_falls_through_to_target() -> None:
    slots = [slot(1, START='/Expr(Owner == "coltrane")/')]
    subs = [SubmitterInput("c@d", 1.0), SubmitterInput("t@d", 2.0)]
    idle = {"c@d": jobs(1, 1, Owner="coltrane"), "t@d": jobs(2, 1, Owner="tyner")}
    res = run(cycle(subs, slots + [slot(2, START='/Expr(Owner == "tyner")/')], idle))
    assert {(m.submitter, m.slot.split("@")[0]) for m in res.matches} == {("c@d", "slot1"),
                                                                         ("t@d", "slot2")}


def test_payloads_are_valid_events() -> None:
    subs = [SubmitterInput("u@d", 1.0)]
    res = run(cycle(subs, [slot(1)], {"u@d": jobs(1, 2)}))
    matches, summary = to_payloads(res, "negotiator@cm")
    assert matches[0].slot == "slot1@host1.example.org" and matches[0].reason == "NoPreemption"
    assert summary.matches == 1 and summary.cycle == 7
    assert summary.submitters["u@d"]["matches"] == 1


def test_negotiate_is_deterministic() -> None:
    subs = [SubmitterInput(f"u{k}@d", 1.0 + k) for k in range(5)]
    idle = {s.name: jobs(k + 1, 20) for k, s in enumerate(subs)}
    snap = cycle(subs, [slot(i) for i in range(37)], idle)
    assert negotiate(snap).matches == negotiate(snap).matches


@pytest.mark.parametrize("bad", [
    CycleInput(now=0, cycle=1, submitters=[SubmitterInput("a@d", 1)] * 2, slots=[], jobs={}),
    CycleInput(now=0, cycle=1, submitters=[], slots=[], jobs={"x@d": []}),
])
def test_bad_input_raises_negotiator_error(bad: CycleInput) -> None:
    from services.negotiator import NegotiatorError
    with pytest.raises(NegotiatorError):
        negotiate(bad)


def test_fast_path_equals_classad2_on_a_synthetic_pool() -> None:
    """The bench's pool in small: pslots, claimed slots, regexp() by columns, and a regexp()
    with options (outside the column subset) left to classad2."""
    import random

    from bench.negotiation import make_jobs, make_slots

    rng = random.Random(3)
    users = [f"user{u}@example.org" for u in range(6)]
    slots = make_slots(240, rng, users)
    idle = make_jobs(600, 60, users, rng)
    for ad in (j for js in idle.values() for j in js if j["ClusterId"] % 50 == 11):
        ad["Requirements"] = ad["Requirements"][:-2] + ' && regexp("^EXEC0", TARGET.Machine, "i"))/'
    subs = [SubmitterInput(u, eup=1.0 + k * 3, weighted_usage=float(k)) for k, u in enumerate(users)]
    res = run(cycle(subs, slots, idle), NegotiatorConfig(preemption_requirements="True"))
    assert len(res.matches) > 100 and res.dynamic_slots
    assert res.counters["pairs_classad"] > 0 and res.counters["rows_column"] > 0


def test_piespin_arithmetic() -> None:
    from services.negotiator.piespin import Slice, ceiling_headroom, spin_limits, spin_order

    assert ceiling_headroom(-1, 5.7) == float("inf")
    assert ceiling_headroom(10, 5.7) == 5  # Ceiling - int(usage)
    slices = [Slice("a", 5, 0), Slice("b", 10, 0), Slice("c", 20, 0)]
    limits, pie_left = spin_limits(slices, 70, 1000)
    assert [round(x, 6) for x in limits] == [40, 20, 10] and round(pie_left, 6) == 70
    limits, pie_left = spin_limits(slices, 70, 35)
    assert pie_left == 35
    assert spin_order(slices, limits) == [0, 1, 2]


def busy(i: int, user: str, **kw: Any) -> dict[str, Any]:
    """Static slot i running a job of `user` (CurrentRank 0)."""
    return slot(i, State="Claimed", Activity="Busy", RemoteUser=user, RemoteOwner=user, **kw)


TIME_SENSITIVE_RANK = "/Expr(TARGET.TimeSensitive =?= True)/"


def test_rank_preemption_by_a_submitter_at_its_pie_limit_in_the_first_spin() -> None:
    # Two busy slots, one each for alice and bob: each has its fair share (1 of 2) and a pie
    # limit of 0. slot1's startd RANK prefers TimeSensitive jobs: bob's TimeSensitive job still
    # preempts alice there (first spin, preemption considered), outside bob's limit.
    slots = [busy(1, "alice@d", Rank=TIME_SENSITIVE_RANK), busy(2, "bob@d")]
    subs = [SubmitterInput("alice@d", 1.0, weighted_usage=1.0),
            SubmitterInput("bob@d", 1.0, weighted_usage=1.0)]
    idle = {"bob@d": [job(1, TimeSensitive=True), job(2)], "alice@d": jobs(3, 2)}
    res = run(cycle(subs, slots, idle))
    assert [(m.job_id, m.slot, m.reason, m.preempts) for m in res.matches] == [
        ("1.0", "slot1@host1.example.org", "Rank", "alice@d")]
    # bob's other job and alice's jobs were not tried against their limit: no rejection
    assert res.rejections == ()
    assert res.submitters["bob@d"].weight == 1.0
    # Without preemption the limit holds for every job, as HTCondor's later spins do.
    off = run(cycle(subs, slots, idle), NegotiatorConfig(negotiator_consider_preemption=False))
    assert off.matches == ()


def test_rank_preemption_is_not_held_to_the_submitter_limit() -> None:
    # Pool of 5 cores, equal priorities: bob (using 1) may take 1.5 more, but the slot whose
    # RANK prefers his job weighs 2 (Cpus). Rank preemption is never checked against the
    # submitter limit (HTCondor checks only no- and priority-preemption candidates), so it
    # wins over the unclaimed 1-core slot.
    slots = [busy(1, "alice@d", Cpus=2, Rank=TIME_SENSITIVE_RANK), slot(2, Cpus=1),
             busy(3, "alice@d"), busy(4, "bob@d")]
    subs = [SubmitterInput("alice@d", 1.0, weighted_usage=3.0),
            SubmitterInput("bob@d", 1.0, weighted_usage=1.0)]
    idle = {"bob@d": [job(1, TimeSensitive=True)], "alice@d": jobs(2, 1)}
    res = run(cycle(subs, slots, idle))
    assert res.submitters["bob@d"].limit == 1.5
    assert [(m.slot, m.reason, m.weight) for m in res.matches if m.submitter == "bob@d"] == [
        ("slot1@host1.example.org", "Rank", 2.0)]


def test_group_at_its_quota_still_rank_preempts_in_the_first_spin() -> None:
    # group_a (quota 1) already uses its one slot; its submitter's TimeSensitive job preempts
    # an outsider on the slot whose RANK prefers it; its other job waits (quota).
    slots = [busy(1, "out@d", Rank=TIME_SENSITIVE_RANK), busy(2, "group_a.u@d"), slot(3)]
    subs = [SubmitterInput("group_a.u@d", 1.0, weighted_usage=1.0, group="group_a"),
            SubmitterInput("out@d", 1.0, weighted_usage=1.0)]
    groups = [GroupInput("group_a", 1.0, usage=1.0)]
    idle = {"group_a.u@d": [job(1), job(2, TimeSensitive=True)]}
    res = run(cycle(subs, slots, idle, groups=groups))
    assert [(m.job_id, m.slot, m.reason) for m in res.matches] == [
        ("2.0", "slot1@host1.example.org", "Rank")]


def test_a_schedd_at_max_jobs_running_offers_no_more_jobs() -> None:
    # MAX_JOBS_RUNNING leaves the schedd room for 3 more jobs: after 3 matches (of either
    # submitter) it offers nothing more this cycle; its jobs are not rejected, just not asked.
    subs = [SubmitterInput("a@d", 1.0, schedd="ap1.example.org"),
            SubmitterInput("b@d", 1.0, schedd="ap1.example.org")]
    idle = {"a@d": jobs(1, 4), "b@d": jobs(2, 4)}
    res = run(cycle(subs, [slot(i) for i in range(1, 11)], idle,
                    schedd_room={"schedd@ap1.example.org": 3}))
    assert len(res.matches) == 3 and res.rejections == ()
    res = run(cycle(subs, [slot(i) for i in range(1, 11)], idle, schedd_room={"other": 0}))
    assert len(res.matches) == 8


def dslot(k: int, user: str, current_rank: float = 0.0) -> dict[str, Any]:
    """Dynamic slot slot1_k of the `pslot()` machine: 2 cores, 2 GB, running `user`'s job."""
    return slot(1, Name=f"slot1_{k}@big.example.org", Machine="big.example.org", Cpus=2,
                Memory=2048, DynamicSlot=True, State="Claimed", Activity="Busy", RemoteUser=user,
                RemoteOwner=user, CurrentRank=current_rank, Rank="/Expr(TARGET.Big =?= True)/")


def test_pslot_preemption_takes_several_dynamic_slots_for_one_larger_job() -> None:
    # seed 001: a 10-core pslot fully carved into 2-core dynamic slots; a 4-core job its RANK
    # prefers (Big) fits no single dynamic slot. With ALLOW_PSLOT_PREEMPTION the negotiator
    # adds dynamic slots to the pslot in CurrentRank order (lowest first) until it matches.
    full = pslot(Cpus=0, Memory=0, Rank="/Expr(TARGET.Big =?= True)/")
    slots = [full, dslot(1, "a@d", 0.5), dslot(2, "a@d", 0.0), dslot(3, "b@d", 0.0),
             dslot(4, "b@d", 2.0), dslot(5, "b@d", 0.0)]
    subs = [SubmitterInput("big@d", 1.0), SubmitterInput("a@d", 1.0, weighted_usage=4.0),
            SubmitterInput("b@d", 1.0, weighted_usage=6.0)]
    big = {"big@d": [job(1, RequestCpus=4, RequestMemory=4096, Big=True, WantPslotPreemption=True)]}
    on = NegotiatorConfig(allow_pslot_preemption=True)
    res = run(cycle(subs, slots, big), on)
    [m] = res.matches
    # slot1_2 and slot1_3 (CurrentRank 0, in slot order) give 4 cores and 4 GB
    assert (m.slot, m.reason, m.preempts, m.weight) == ("slot1@big.example.org", "Rank", "a@d, b@d", 4.0)
    assert res.counters["preemptions"] == 2
    # without the knob no single dynamic slot is big enough: nothing matches
    assert run(cycle(subs, slots, big)).matches == ()
    # a job that does not ask for it (WantPslotPreemption) is not matched that way
    plain = {"big@d": [job(1, RequestCpus=4, RequestMemory=4096, Big=True)]}
    assert run(cycle(subs, slots, plain), on).matches == ()
    # a dynamic slot whose CurrentRank is above the pslot's RANK of the job is never taken
    high = [full, dslot(1, "a@d", 5.0), dslot(2, "a@d", 5.0)]
    assert run(cycle(subs, high, big), on).matches == ()


def test_pslot_priority_preemption_needs_preemption_requirements() -> None:
    # equal ranks (0 = 0): priority preemption of other users' dynamic slots, only where
    # PREEMPTION_REQUIREMENTS holds against each dynamic slot; never the submitter's own.
    full = pslot(Cpus=0, Memory=0)
    slots = [full, dslot(1, "new@d"), dslot(2, "hog@d"), dslot(3, "hog@d")]
    subs = [SubmitterInput("new@d", 0.5, weighted_usage=2.0),
            SubmitterInput("hog@d", 500.0, weighted_usage=4.0)]
    idle = {"new@d": [job(1, RequestCpus=4, RequestMemory=4096, WantPslotPreemption=True)]}
    res = run(cycle(subs, slots, idle), NegotiatorConfig(
        allow_pslot_preemption=True, preemption_requirements="MY.RemoteUser =!= \"new@d\""))
    assert [(m.slot, m.reason, m.preempts) for m in res.matches] == [
        ("slot1@big.example.org", "Priority", "hog@d")]
    res = run(cycle(subs, slots, idle), NegotiatorConfig(allow_pslot_preemption=True))
    assert res.matches == ()


def test_an_attribute_read_through_eval_is_not_merged_away() -> None:
    """START reads Size only through eval(): slots that differ in Size alone must not share
    one evaluation (slot classes, classad2 dedupe), on either path."""
    start = '/Expr(eval(strcat("Si", "ze")) >= TARGET.RequestCpus)/'
    slots = [slot(i, Size=8 if i == 5 else 1, START=start, SlotID=1, Machine="m")
             for i in range(12)]
    subs = [SubmitterInput("a@d", 1.0)]
    res = run(cycle(subs, slots, {"a@d": [job(1, RequestCpus=4)]}))
    assert [m.slot for m in res.matches] == ["slot5@host5.example.org"]


def test_a_cycle_runs_with_the_folds_collector_settings_and_restores_them() -> None:
    """The cycle's many short-lived objects: collector settings as in a long fold
    (streams.gcpolicy), and the caller's back after it."""
    seen: list[tuple[tuple[int, int, int], int]] = []

    def clock() -> float:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        return 0.0

    before = gc.get_threshold()
    snap = CycleInput(now=1_700_000_000.0, cycle=1, submitters=[SubmitterInput("u@x", eup=1.0)],
                      slots=[slot(0)], jobs={"u@x": [job(1)]})
    assert len(negotiate(snap, NegotiatorConfig(), clock).matches) == 1
    assert seen and all(t == FOLD_THRESHOLD and frozen > 0 for t, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
