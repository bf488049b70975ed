"""Hierarchical group quotas and the job demand they use, with seed 000's worked examples
and REFERENCE.md's HTCondor regression scenarios (job_hgq_negfail, job_hgq_autoregroup)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from schemas.events import (AdUpdated, ConfigChanged, Envelope, JobHistory, JobStarted, JobStopped,
                            JobSubmitted, Payload, QuotaComputed, make_event)
from schemas.config import Knobs
from streams.core import collector, jobs
from streams.core.collector import PoolState
from streams.core.groups import ROOT
from streams.core.jobs import JobsConfig, JobsState
from streams.core.quotas import QuotaConfig, QuotaState, apply, compute_quotas, group_order

SEED_FLAT = {"GROUP_NAMES": "group_physics, group_chemistry",
             "GROUP_QUOTA_group_physics": "20", "GROUP_QUOTA_group_chemistry": "10"}
SEED_SUB = {"GROUP_NAMES": "group_physics, group_physics.hep, group_physics.lep, group_chemistry",
            "GROUP_QUOTA_group_physics": "20", "GROUP_QUOTA_group_physics.hep": "15",
            "GROUP_QUOTA_group_physics.lep": "5", "GROUP_QUOTA_group_chemistry": "10"}
SEED_SURPLUS = {**SEED_SUB, "GROUP_ACCEPT_SURPLUS": "false",
                "GROUP_ACCEPT_SURPLUS_group_physics": "false",
                "GROUP_ACCEPT_SURPLUS_group_physics.lep": "true",
                "GROUP_ACCEPT_SURPLUS_group_physics.hep": "true"}
BUSY = {"group_physics": 100, "group_chemistry": 100}


def quotas(knobs: dict[str, Any], size: float, demand: Mapping[str, float] | None = None
           ) -> dict[str, tuple[float, float, float]]:
    """(quota, effective_quota, subtree_quota) per group, rounded for comparison."""
    cfg = QuotaConfig.from_settings(Knobs(knobs))
    out = compute_quotas(cfg.tree, size, demand or {}, {}, cfg)
    return {g: (round(q.quota, 6), round(q.effective_quota, 6), round(q.subtree_quota, 6))
            for g, q in out.items()}


# --- static and dynamic assignment ---------------------------------------------------------

def test_thirty_slots_physics_20_chemistry_10() -> None:
    q = quotas(SEED_FLAT, 30, BUSY)
    assert q["group_physics"] == (20, 20, 20)
    assert q["group_chemistry"] == (10, 10, 10)
    assert q[ROOT] == (0, 0, 30)


def test_fifteen_slots_scales_to_10_and_5_by_default() -> None:
    q = quotas(SEED_FLAT, 15, BUSY)
    assert q["group_physics"] == (10, 10, 10)
    assert q["group_chemistry"] == (5, 5, 5)


def test_oversubscription_knob_gives_unscaled_quotas() -> None:
    q = quotas({**SEED_FLAT, "NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION": "True"}, 15, BUSY)
    assert q["group_physics"][0] == 20 and q["group_chemistry"][0] == 10


def test_oversubscription_lets_a_parent_keep_its_whole_quota_for_its_own_jobs() -> None:
    busy = {"group_physics": 50, "group_physics.hep": 50, "group_physics.lep": 50}
    q = quotas({**SEED_SUB, "NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION": "True"}, 30, busy)
    assert q["group_physics"] == (20, 20, 20)
    assert q["group_physics.hep"] == (15, 15, 15)
    assert quotas(SEED_SUB, 30, busy)["group_physics"] == (0, 0, 20)


def test_static_quotas_are_not_scaled_up_when_the_pool_doubles() -> None:
    q = quotas(SEED_FLAT, 60, BUSY)
    assert q["group_physics"][0] == 20 and q["group_chemistry"][0] == 10
    assert q[ROOT][0] == 30  # the rest stays with <none>


def test_dynamic_two_thirds_one_third() -> None:
    knobs = {"GROUP_NAMES": "group_physics, group_chemistry",
             "GROUP_QUOTA_DYNAMIC_group_chemistry": "0.33", "GROUP_QUOTA_DYNAMIC_group_physics": "0.66"}
    q = quotas(knobs, 30, BUSY)
    assert q["group_physics"][0] == pytest.approx(19.8)
    assert q["group_chemistry"][0] == pytest.approx(9.9)
    q = quotas(knobs, 15, BUSY)  # they keep the ratio as the pool changes
    assert q["group_physics"][0] == pytest.approx(9.9)
    assert q["group_chemistry"][0] == pytest.approx(4.95)


def test_dynamic_fractions_summing_past_one_are_scaled_to_one() -> None:
    knobs = {"GROUP_NAMES": "a, b", "GROUP_QUOTA_DYNAMIC_a": "0.9", "GROUP_QUOTA_DYNAMIC_b": "0.6"}
    q = quotas(knobs, 30, {"a": 100, "b": 100})
    assert q["a"][0] == pytest.approx(18) and q["b"][0] == pytest.approx(12)


def test_hep_lep_static_subgroups_of_physics() -> None:
    q = quotas(SEED_SUB, 30, {"group_physics.hep": 60, "group_physics.lep": 60})
    assert q["group_physics.hep"] == (15, 15, 15)
    assert q["group_physics.lep"] == (5, 5, 5)
    assert q["group_physics"] == (0, 0, 20)  # all of physics went to its children


def test_hep_lep_dynamic_subgroups_give_the_same_15_slots() -> None:
    knobs = {"GROUP_NAMES": SEED_SUB["GROUP_NAMES"],
             "GROUP_QUOTA_DYNAMIC_group_chemistry": "0.33334",
             "GROUP_QUOTA_DYNAMIC_group_physics": "0.66667",
             "GROUP_QUOTA_DYNAMIC_group_physics.hep": "0.75",
             "GROUP_QUOTA_DYNAMIC_group_physics.lep": "0.25"}
    q = quotas(knobs, 30)
    assert q["group_physics.hep"][0] == pytest.approx(15, abs=1e-3)
    assert q["group_physics.lep"][0] == pytest.approx(5, abs=1e-3)
    assert q["group_physics"][2] == pytest.approx(20, abs=1e-3)


# --- surplus -------------------------------------------------------------------------------

def test_seed_surplus_example_quotas_output() -> None:
    # condor_userprio -quotas: hep 15.00 / lep 5.00 with 60 requested each
    cfg = QuotaConfig.from_settings(Knobs(SEED_SURPLUS))
    out = compute_quotas(cfg.tree, 30, {"group_physics.hep": 60, "group_physics.lep": 60}, {}, cfg)
    hep, lep = out["group_physics.hep"], out["group_physics.lep"]
    assert (hep.effective_quota, hep.config_quota, hep.subtree_quota, hep.requested) == (15, 15, 15, 60)
    assert (lep.effective_quota, lep.config_quota, lep.subtree_quota, lep.requested) == (5, 5, 5, 60)
    assert hep.surplus_policy == "byquota" and out["group_physics"].surplus_policy == "no"


def test_subgroups_share_surplus_but_physics_caps_them_at_20() -> None:
    q = quotas(SEED_SURPLUS, 30, {"group_physics.hep": 60})
    assert q["group_physics.hep"][1] == 20  # lep's idle 5 went to hep ...
    assert q["group_physics.lep"][1] == 0
    # ... but chemistry's idle 10 did not: physics does not accept surplus


def test_physics_accepting_surplus_lifts_the_cap() -> None:
    q = quotas({**SEED_SURPLUS, "GROUP_ACCEPT_SURPLUS_group_physics": "true"}, 30, {"group_physics.hep": 60})
    assert q["group_physics.hep"][1] == 30


def test_surplus_water_fill_is_proportional_to_subtree_quota() -> None:
    knobs = {"GROUP_NAMES": "a, b, c", "GROUP_QUOTA_a": 2, "GROUP_QUOTA_b": 6, "GROUP_QUOTA_c": 12,
             "GROUP_ACCEPT_SURPLUS": "true"}
    q = quotas(knobs, 20, {"a": 100, "b": 100, "c": 0})
    assert q["a"][1] == pytest.approx(2 + 12 * 2 / 8)
    assert q["b"][1] == pytest.approx(6 + 12 * 6 / 8)
    # capped groups hand back what they cannot use: a wants only 3 in all
    q = quotas(knobs, 20, {"a": 3, "b": 100, "c": 0})
    assert q["a"][1] == pytest.approx(3) and q["b"][1] == pytest.approx(17)


def test_zero_quota_groups_share_leftover_equally() -> None:
    knobs = {"GROUP_NAMES": "a, z1, z2", "GROUP_QUOTA_a": 10, "GROUP_ACCEPT_SURPLUS": "true"}
    q = quotas(knobs, 20, {"a": 12, "z1": 100, "z2": 100})
    assert q["a"][1] == pytest.approx(12)
    assert q["z1"][1] == pytest.approx(4) and q["z2"][1] == pytest.approx(4)


def test_demand_below_a_non_accepting_group_does_not_attract_surplus() -> None:
    # p accepts surplus but its child p.c does not: p.c's unmet demand must not pull
    # q's idle quota into p, where it could not be used; <none>'s own jobs get it instead
    knobs = {"GROUP_NAMES": "p, p.c, q", "GROUP_QUOTA_p": 10, "GROUP_QUOTA_p.c": 10, "GROUP_QUOTA_q": 10,
             "GROUP_ACCEPT_SURPLUS_p": "true"}
    q = quotas(knobs, 20, {"p.c": 20, ROOT: 5})
    assert q["p.c"][1] == 10 and q[ROOT][1] == 5


def test_job_hgq_negfail_quota_part() -> None:
    # 40 slots; a, b, a.a, a.b, b.a, b.b dynamic 0.5; all accept surplus except a and b
    knobs: dict[str, Any] = {"GROUP_NAMES": "a, b, a.a, a.b, b.a, b.b", "GROUP_ACCEPT_SURPLUS": "true",
                             "GROUP_ACCEPT_SURPLUS_a": "false", "GROUP_ACCEPT_SURPLUS_b": "false"}
    knobs.update({f"GROUP_QUOTA_DYNAMIC_{g}": "0.5" for g in ("a", "b", "a.a", "a.b", "b.a", "b.b")})
    first = quotas(knobs, 40, {"a.a": 40, "a.b": 40, "b.a": 5, "b.b": 5})
    assert {g: first[g][0] for g in ("a", "b", "a.a", "a.b", "b.a", "b.b")} == {
        "a": 0, "b": 0, "a.a": 10, "a.b": 10, "b.a": 10, "b.b": 10}
    # a.b is unmatchable: once its demand is gone, a.a takes a's whole 20, b's unused 10
    # stays inside b (a does not accept surplus) -> 20 a.a, 5 b.a, 5 b.b
    later = quotas(knobs, 40, {"a.a": 40, "a.b": 0, "b.a": 5, "b.b": 5})
    assert {g: later[g][1] for g in ("a.a", "a.b", "b.a", "b.b")} == {
        "a.a": 20, "a.b": 0, "b.a": 5, "b.b": 5}


# --- group order ---------------------------------------------------------------------------

def test_default_sort_is_starvation_order_with_none_last() -> None:
    knobs = {"GROUP_NAMES": "a, b, c", "GROUP_QUOTA_a": 10, "GROUP_QUOTA_b": 10, "GROUP_QUOTA_c": 0}
    cfg = QuotaConfig.from_settings(Knobs(knobs))
    q = compute_quotas(cfg.tree, 30, {"a": 10, "b": 10, "c": 5}, {}, cfg)
    turns = group_order(q, {"a": 8, "b": 2}, cfg, 30, 0.0)
    assert [t.group for t in turns] == ["b", "a", "c", ROOT]  # 0.2, 0.8, zero quota, <none>
    assert turns[0].sort_key == pytest.approx(0.2) and turns[0].limit == 10
    assert not any(t.autoregroup for t in turns)


def test_autoregroup_order_b_a_none_with_whole_pool() -> None:
    # job_hgq_autoregroup_basic_van: 4 cpus, a and b quota 1, autoregroup, b sorts first
    knobs = {"GROUP_NAMES": "a, b", "GROUP_QUOTA_a": 1, "GROUP_QUOTA_b": 1, "GROUP_AUTOREGROUP": "true",
             "GROUP_SORT_EXPR": 'ifThenElse(AccountingGroup =?= "b", 1, '
                                'ifThenElse(AccountingGroup =?= "a", 2, 0))'}
    cfg = QuotaConfig.from_settings(Knobs(knobs))
    q = compute_quotas(cfg.tree, 4, {"a": 4, "b": 4}, {}, cfg)
    assert q["a"].effective_quota == 1 and q["b"].effective_quota == 1
    assert q["a"].surplus_policy == "regroup"
    turns = group_order(q, {}, cfg, 4, 0.0)
    assert [(t.group, t.limit, t.autoregroup) for t in turns] == [
        ("b", 1, False), ("a", 1, False), (ROOT, 4, True)]


def test_unsortable_expression_sorts_last_by_name() -> None:
    cfg = QuotaConfig.from_settings(Knobs({"GROUP_NAMES": "b, a", "GROUP_SORT_EXPR": "undefined"}))
    q = compute_quotas(cfg.tree, 4, {}, {}, cfg)
    assert [t.group for t in group_order(q, {}, cfg, 4, 0.0)] == [ROOT, "a", "b"]


# --- job demand ----------------------------------------------------------------------------

class Feeder:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, payload: Payload, ts: float = 0.0, source: str = "schedd@ap1") -> Envelope:
        self.n += 1
        return make_event(payload, ts=ts, source=source, seq=self.n)


def submit(job_id: str, submitter: str, **ad: Any) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, schedd="schedd@ap1", submitter=submitter, ad=ad)


def start(job_id: str, submitter: str, weight: float = 1.0, slot: str = "slot1@ep1") -> JobStarted:
    return JobStarted(job_id=job_id, schedd="schedd@ap1", submitter=submitter, slot=slot,
                      slot_weight=weight)


def test_demand_idle_running_held_and_weighted() -> None:
    ev, st, cfg = Feeder(), JobsState(), JobsConfig()
    u = "group_physics.einstein@example.org"
    for env in [ev(submit("1.0", u, RequestCpus=4)), ev(submit("1.1", u)),
                ev(submit("1.2", u, RequestCpus="/Expr(1 + 1)/")), ev(submit("1.3", u, JobStatus=5)),
                ev(start("1.0", u, weight=4.0))]:
        jobs.apply(st, env, cfg)
    d = jobs.submitter_demand(st, cfg)[u]
    assert (d.idle, d.running, d.held) == (2, 1, 1)
    assert (d.weighted_idle, d.weighted_running, d.requested) == (3.0, 4.0, 7.0)
    off = JobsConfig.from_settings(Knobs({"NEGOTIATOR_USE_SLOT_WEIGHTS": "false"}))
    assert jobs.submitter_demand(st, off)[u].requested == 3.0
    # evicted -> idle again; held -> held; completed -> gone; history closes a queued job
    for env in [ev(JobStopped("1.0", "slot1@ep1", "evicted", "schedd@ap1", u))]:
        jobs.apply(st, env, cfg)
    assert jobs.submitter_demand(st, cfg)[u].weighted_idle == 7.0
    jobs.apply(st, ev(start("1.1", u, 2.0)), cfg)
    jobs.apply(st, ev(JobStopped("1.1", "slot1@ep1", "held")), cfg)  # v1 stop: no schedd
    d = jobs.submitter_demand(st, cfg)[u]
    assert (d.idle, d.running, d.held) == (2, 0, 2)
    jobs.apply(st, ev(JobHistory({"GlobalJobId": "ap1#1.0#1700000000", "ClusterId": 1, "ProcId": 0})), cfg)
    jobs.apply(st, ev(JobStopped("1.2", "", "removed", "schedd@ap1", u)), cfg)
    d = jobs.submitter_demand(st, cfg)[u]
    assert (d.idle, d.running, d.held, d.weighted_idle) == (0, 0, 2, 0.0)
    assert JobsState.from_json(st.to_json()).to_json() == st.to_json()


def test_group_demand_maps_submitters_to_deepest_group() -> None:
    ev, st, cfg = Feeder(), JobsState(), JobsConfig()
    qcfg = QuotaConfig.from_settings(Knobs(SEED_SUB))
    for env in [ev(submit("1.0", "group_physics.hep.higgs@x")), ev(submit("2.0", "group_physics.bohr@x")),
                ev(submit("3.0", "group_bio.darwin@x")), ev(submit("4.0", "alice@x"))]:
        jobs.apply(st, env, cfg)
    assert jobs.group_demand(st, qcfg.tree, cfg) == {"group_physics.hep": 1, "group_physics": 1, ROOT: 2}


# --- the fold ------------------------------------------------------------------------------

def machine(name: str, cpus: int) -> AdUpdated:
    return AdUpdated("Machine", name, {"MyType": "Machine", "Name": name, "Cpus": cpus})


def test_fold_emits_quota_computed_only_on_change_with_cause() -> None:
    ev, st = Feeder(), QuotaState()
    # per-event announcements (the default is once per negotiation cycle)
    cfg = QuotaConfig.from_settings(Knobs({**SEED_FLAT, "POOLLEDGER_QUOTA_UPDATES": "event"}))
    out = apply(st, ev(machine("slot1@a", 30), 0.0, "startd@a"), cfg)
    by = {p.group: p for p in out if isinstance(p, QuotaComputed)}
    assert (by["group_physics"].subtree_quota, by["group_chemistry"].subtree_quota) == (20, 10)
    assert all(p.cause == "startd@a:1" for p in by.values())
    # an ad that does not move pool size changes nothing
    assert apply(st, ev(machine("slot1@a", 30), 10.0, "startd@a"), cfg) == []
    # demand: physics jobs raise physics' allocation only; its quota (HTCondor's
    # EffectiveQuota) stays what the pool assigns it, 20
    e = ev(submit("1.0", "group_physics.einstein@x", RequestCpus=4), 11.0)
    out = apply(st, e, cfg)
    assert [(p.group, p.effective_quota, p.allocated, p.cause) for p in out
            if isinstance(p, QuotaComputed)] == [("group_physics", 20.0, 4.0, e.id)]
    # a power failure halves the pool: quotas scale to 10 / 5
    out = apply(st, ev(machine("slot1@a", 15), 12.0, "startd@a"), cfg)
    got = {p.group: p.subtree_quota for p in out if isinstance(p, QuotaComputed)}
    assert got["group_physics"] == 10 and got["group_chemistry"] == 5
    # config.changed: oversubscription restores 20 / 10
    out = apply(st, ev(ConfigChanged("NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION", "true"), 13.0, "admin"), cfg)
    got = {p.group: p.subtree_quota for p in out if isinstance(p, QuotaComputed)}
    assert got["group_physics"] == 20 and got["group_chemistry"] == 10
    assert st.current()["group_physics"].requested == 4.0


def test_fold_expiry_shrinks_pool_and_state_round_trips() -> None:
    ev = Feeder()
    cfg = QuotaConfig.from_settings(Knobs({**SEED_FLAT, "CLASSAD_LIFETIME": 100,
                                           "POOLLEDGER_QUOTA_UPDATES": "event"}))
    events = [ev(machine("slot1@a", 15), 0.0, "startd@a"), ev(machine("slot1@b", 15), 50.0, "startd@b"),
              ev(submit("1.0", "group_chemistry.curie@x"), 60.0),
              ev(machine("slot1@b", 15), 120.0, "startd@b")]  # slot1@a expired at 100
    whole = QuotaState()
    derived = [apply(whole, e, cfg) for e in events]
    last = {p.group: p.subtree_quota for p in derived[-1] if isinstance(p, QuotaComputed)}
    assert last["group_physics"] == 10 and last["group_chemistry"] == 5
    half = QuotaState()
    for e in events[:2]:
        apply(half, e, cfg)
    resumed = QuotaState.from_json(half.to_json())
    for e in events[2:]:
        apply(resumed, e, cfg)
    assert resumed.to_json() == whole.to_json()


def test_fold_can_read_a_callers_pool_and_jobs_sections() -> None:
    # a ledger folds pool and jobs itself and passes them in; the result is the same
    ev = Feeder()
    cfg = QuotaConfig.from_settings(Knobs(SEED_FLAT))
    events = [ev(machine("slot1@a", 15), 0.0, "startd@a"),
              ev(submit("1.0", "group_physics.einstein@x"), 1.0),
              ev(machine("slot1@b", 15), 2.0, "startd@b")]
    nested, shared = QuotaState(), QuotaState()
    pool_st, jobs_st = PoolState(), JobsState()
    for e in events:
        a = apply(nested, e, cfg)
        collector.apply(pool_st, e, cfg.pool)
        jobs.apply(jobs_st, e, cfg.jobs)
        b = apply(shared, e, cfg, pool_state=pool_st, jobs_state=jobs_st, accountant_state=None)
        assert a == b
    assert nested.quotas == shared.quotas
    assert shared.pool.ads == {}  # the nested copies stay empty


def test_config_from_the_real_settings_loader() -> None:
    from schemas.settings import load_settings

    s = load_settings([], env={}, overrides={**SEED_SURPLUS, "GROUP_QUOTA_DYNAMIC_group_chemistry": "0.5"})
    cfg = QuotaConfig.from_settings(s)
    assert cfg.tree.names == ("group_chemistry", "group_physics", "group_physics.hep", "group_physics.lep")
    assert dict(cfg.static_quota)["group_physics.hep"] == 15
    assert cfg.accepts_surplus("group_physics.lep") and not cfg.accepts_surplus("group_physics")
    assert not cfg.allow_oversubscription  # the seed's default (DESIGN.md)
    q = compute_quotas(cfg.tree, 30, {"group_physics.hep": 60}, {}, cfg)
    assert q["group_physics.hep"].effective_quota == 20
    assert q["group_chemistry"].config_quota == 10  # static wins over dynamic, as HTCondor
