"""The collector fold: ad lifetime, invalidation, absent ads, update statistics, pool size.

Numbers from seed 000 ("Absent ClassAds": CLASSAD_LIFETIME 15 minutes, absent ads kept 30
days) and seed 002 (condor_updates_stats: Total=713, Lost=3 -> 0.42%).
"""
from __future__ import annotations

from typing import Any

import pytest

from schemas.events import AdInvalidated, AdUpdated, ConfigChanged, Envelope, Payload, make_event
from schemas.config import Knobs
from streams.core import collector
from streams.core.collector import PoolConfig, PoolState

DAY = 86400.0


class Feeder:
    """Builds envelopes with per-source sequence numbers."""

    def __init__(self) -> None:
        self.seq: dict[str, int] = {}

    def __call__(self, payload: Payload, ts: float, source: str = "startd@ep1", seq: int | None = None
                 ) -> Envelope:
        n = self.seq.get(source, 0) + 1 if seq is None else seq
        self.seq[source] = n
        return make_event(payload, ts=ts, source=source, seq=n)


def slot(name: str, **attrs: Any) -> AdUpdated:
    ad = {"MyType": "Machine", "Name": name, "Machine": name.split("@")[-1], "Cpus": 1,
          "Memory": 1024, **attrs}
    return AdUpdated(ad_type="Machine", name=name, ad=ad)


def run(events: list[Envelope], cfg: PoolConfig, state: PoolState | None = None) -> PoolState:
    state = state or PoolState()
    for env in events:
        assert collector.apply(state, env, cfg) == []
    return state


def names(state: PoolState, absent: bool | None = False, ad_type: str | None = None) -> list[str]:
    return [r.name for r in collector.current_ads(state, ad_type, absent=absent)]


# --- lifetime ------------------------------------------------------------------------------

def test_ad_expires_after_default_classad_lifetime_of_event_time() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs({}))
    assert cfg.classad_lifetime == 900
    st = run([ev(slot("slot1@a"), 1000.0)], cfg)
    # exactly 900 s later the deadline is reached but not passed: still there
    run([ev(AdUpdated("Scheduler", "ap1", {"MyType": "Scheduler"}), 1900.0, "schedd@ap1")], cfg, st)
    assert "slot1@a" in names(st)
    run([ev(AdUpdated("Scheduler", "ap1", {"MyType": "Scheduler"}), 1900.5, "schedd@ap1")], cfg, st)
    assert "slot1@a" not in names(st)
    assert collector.pool_size(st) == 0


def test_refresh_extends_lifetime_and_ad_own_classad_lifetime_wins() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs({"CLASSAD_LIFETIME": "600"}))
    st = run([ev(slot("slot1@a"), 0.0), ev(slot("slot2@a", ClassAdLifetime=60), 0.0),
              ev(slot("slot1@a"), 500.0)], cfg)
    run([ev(slot("slot3@b"), 61.0, "startd@b")], cfg, st)
    assert names(st) == ["slot1@a", "slot3@b"]  # slot2 had its own 60 s lifetime
    run([ev(slot("slot3@b"), 1000.0, "startd@b")], cfg, st)
    assert names(st) == ["slot1@a", "slot3@b"]  # refreshed at 500: deadline 1100
    run([ev(slot("slot3@b"), 1100.5, "startd@b")], cfg, st)
    assert names(st) == ["slot3@b"]


def test_invalidation_removes_the_ad_immediately() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs({}))
    st = run([ev(slot("slot1@a"), 0.0), ev(slot("slot2@a"), 0.0),
              ev(AdInvalidated("machine", "slot1@a"), 10.0)], cfg)
    assert names(st) == ["slot2@a"]
    assert collector.pool_size(st) == 1
    run([ev(AdInvalidated("Machine", "nosuch@a"), 11.0)], cfg, st)  # harmless
    assert names(st) == ["slot2@a"]


# --- absent ads ----------------------------------------------------------------------------

ABSENT = {"ABSENT_REQUIREMENTS": "Dedicated =?= true"}


def test_expiring_slot_matching_absent_requirements_becomes_absent_for_30_days() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs(ABSENT))
    assert cfg.absent_expire_ads_after == 30 * DAY
    st = run([ev(slot("slot1@a", Dedicated=True), 0.0), ev(slot("slot1@b"), 0.0, "startd@b")], cfg)
    assert collector.pool_size(st) == 2
    run([ev(AdUpdated("Scheduler", "ap1", {}), 901.0, "schedd@ap1")], cfg, st)
    assert names(st, ad_type="Machine") == []
    assert names(st, absent=True) == ["slot1@a"]
    rec = collector.get_ad(st, "Machine", "slot1@a")
    assert rec is not None and rec.absent and rec.ad["Absent"] is True
    assert collector.pool_size(st) == 0  # absent ads are invisible to the negotiator
    # kept for ABSENT_EXPIRE_ADS_AFTER counted from the moment it expired (900)
    run([ev(AdUpdated("Scheduler", "ap1", {}), 900 + 30 * DAY, "schedd@ap1")], cfg, st)
    assert names(st, absent=True) == ["slot1@a"]
    run([ev(AdUpdated("Scheduler", "ap1", {}), 901 + 30 * DAY, "schedd@ap1")], cfg, st)
    assert names(st, absent=None) == ["ap1"]


def test_returning_machine_replaces_its_absent_ad() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs(ABSENT))
    st = run([ev(slot("slot1@a", Dedicated=True), 0.0), ev(slot("slot1@a", Dedicated=True), 5000.0)], cfg)
    assert names(st) == ["slot1@a"] and names(st, absent=True) == []
    rec = collector.get_ad(st, "Machine", "slot1@a")
    assert rec is not None and "Absent" not in rec.ad
    assert collector.pool_size(st) == 1


def test_absent_zero_means_kept_forever_and_only_machine_ads_go_absent() -> None:
    ev = Feeder()
    cfg = PoolConfig.from_settings(Knobs({"ABSENT_REQUIREMENTS": "true", "ABSENT_EXPIRE_ADS_AFTER": 0}))
    st = run([ev(slot("slot1@a"), 0.0),
              ev(AdUpdated("Scheduler", "ap1", {"MyType": "Scheduler"}), 0.0, "schedd@ap1"),
              ev(slot("slot1@z"), 10 * 365 * DAY, "startd@z")], cfg)
    assert names(st, absent=True) == ["slot1@a"]
    assert collector.get_ad(st, "Scheduler", "ap1") is None


def test_expire_invalidated_ads_makes_invalidation_an_expiry() -> None:
    ev = Feeder()
    plain = PoolConfig.from_settings(Knobs(ABSENT))
    st = run([ev(slot("slot1@a", Dedicated=True), 0.0), ev(AdInvalidated("Machine", "slot1@a"), 5.0)], plain)
    assert names(st, absent=None) == []
    cfg = PoolConfig.from_settings(Knobs({**ABSENT, "EXPIRE_INVALIDATED_ADS": "True"}))
    st = run([ev(slot("slot1@a", Dedicated=True), 0.0), ev(slot("slot2@a"), 0.0),
              ev(AdInvalidated("Machine", "slot1@a"), 5.0), ev(AdInvalidated("Machine", "slot2@a"), 5.0)], cfg)
    assert names(st, absent=True) == ["slot1@a"]  # ABSENT_REQUIREMENTS held: absent
    assert names(st, absent=None) == ["slot1@a"]  # slot2 did not match: removed


# --- update statistics -------------------------------------------------------------------

def test_update_stats_lost_from_sequence_gaps() -> None:
    ev, cfg = Feeder(), PoolConfig()
    st = run([ev(slot("slot1@a"), t, seq=s) for t, s in ((0, 1), (1, 2), (2, 5), (3, 6))], cfg)
    s = collector.update_stats(st)["startd@ep1"]
    assert (s.received, s.lost, s.total, s.last_seq) == (4, 2, 6, 6)
    assert s.lost_pct == pytest.approx(100 * 2 / 6)
    # a redelivered update is not counted; a lower seq is a daemon restart, not a loss
    run([ev(slot("slot1@a"), 4, seq=6), ev(slot("slot1@a"), 5, seq=1)], cfg, st)
    s = collector.update_stats(st)["startd@ep1"]
    assert (s.received, s.lost, s.total) == (5, 2, 7)


def test_update_stats_seed_example_0_42_percent() -> None:
    ev, cfg = Feeder(), PoolConfig()
    seqs = [s for s in range(1, 714) if s not in (100, 200, 300)]  # 710 received, 3 lost
    st = run([ev(slot("vm4@a"), float(i), seq=s) for i, s in enumerate(seqs)], cfg)
    s = collector.update_stats(st)["startd@ep1"]
    assert (s.total, s.lost) == (713, 3)
    assert f"{s.lost_pct:.2f}%" == "0.42%"


# --- pool size -----------------------------------------------------------------------------

def test_pool_size_sums_slot_weight_default_cpus() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs({}))
    st = run([ev(slot("slot1@a", Cpus=4), 0.0), ev(slot("slot2@a", Cpus=2), 0.0),
              ev(AdUpdated("Scheduler", "ap1", {"Cpus": 100}), 0.0, "schedd@ap1")], cfg)
    assert collector.pool_size(st) == 6
    off = PoolConfig.from_settings(Knobs({"NEGOTIATOR_USE_SLOT_WEIGHTS": "false"}))
    assert collector.pool_size(run([ev(slot("slot1@a", Cpus=4), 0.0), ev(slot("slot2@a", Cpus=2), 0.0)], off)) == 2


def test_advertised_slot_weight_expression_is_evaluated_with_classad2() -> None:
    ev, cfg = Feeder(), PoolConfig()
    st = run([ev(slot("slot1@a", Cpus=3, SlotWeight="/Expr(Cpus * 2)/"), 0.0),
              ev(slot("slot2@a", SlotWeight=0.5), 0.0),
              ev(slot("slot3@a", SlotWeight="/Expr(undefined)/"), 0.0)], cfg)
    assert collector.pool_size(st) == 6 + 0.5 + 1.0  # a non-numeric weight counts 1


def test_slot_weight_knob_floor_memory_over_25() -> None:
    # job_cp_cclim_acctgrp: SLOT_WEIGHT = floor(Memory/25)
    cfg = PoolConfig.from_settings(Knobs({"SLOT_WEIGHT": "floor(Memory/25)"}))
    st = run([Feeder()(slot("slot1@a", Memory=210), 0.0)], cfg)
    assert collector.pool_size(st) == 8


def test_partitionable_slot_counts_full_resources_once() -> None:
    ev, cfg = Feeder(), PoolConfig()
    pslot = slot("slot1@a", Cpus=2, TotalSlotCpus=8, PartitionableSlot=True, SlotID=1, SlotWeight=2)
    dslot = slot("slot1_1@a", Cpus=6, DynamicSlot=True, SlotID=1, SlotWeight=6)
    st = run([ev(pslot, 0.0), ev(dslot, 0.0)], cfg)
    assert collector.pool_size(st) == 8
    # a dynamic slot whose partitionable slot is gone counts itself
    run([ev(AdInvalidated("Machine", "slot1@a"), 1.0)], cfg, st)
    assert collector.pool_size(st) == 6


def test_config_changed_overrides_knobs_from_its_event_time() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs({}))
    st = run([ev(slot("slot1@a", Cpus=4), 0.0),
              ev(ConfigChanged("SLOT_WEIGHT", "Cpus * 10"), 1.0, "admin"),
              ev(ConfigChanged("CLASSAD_LIFETIME", "60"), 2.0, "admin"),
              ev(slot("slot2@a", Cpus=1), 3.0)], cfg)
    assert collector.pool_size(st) == 50
    run([ev(slot("slot3@b"), 64.0, "startd@b")], cfg, st)
    assert names(st) == ["slot1@a", "slot3@b"]  # slot2 expired after 60 s, slot1 kept 900


def test_state_json_is_canonical_and_round_trips_midway() -> None:
    ev, cfg = Feeder(), PoolConfig.from_settings(Knobs(ABSENT))
    events = [ev(slot(f"slot{i}@a", Dedicated=i % 2 == 0, Cpus=i), float(i)) for i in range(1, 6)]
    events += [ev(AdInvalidated("Machine", "slot3@a"), 10.0), ev(slot("slot9@b"), 950.0, "startd@b")]
    whole = run(events, cfg)
    half = run(events[:4], cfg)
    resumed = run(events[4:], cfg, PoolState.from_json(half.to_json()))
    assert resumed.to_json() == whole.to_json()
    assert names(whole, absent=True) == ["slot2@a", "slot4@a"]
    assert whole.to_json() == PoolState.from_json(whole.to_json()).to_json()


def test_ad_refreshed_keeps_the_ads_its_stream_wrote_and_counts_their_updates() -> None:
    """The collector endpoint's keep-alive: each refresh moves its ad's deadline to when it
    was last heard plus its lifetime, sets its volatile values, and counts received and lost
    updates; a refresh from another stream, an older one, or of an ad not held changes no ad."""
    from schemas.events import AdRefresh, AdsRefreshed

    feed = Feeder()
    cfg = PoolConfig()
    src = "Machine/slot1@ep1"
    events = [feed(slot("slot1@ep1", LoadAvg=0.0), 0.0, source=src, seq=1),
              feed(slot("slot2@ep1"), 0.0, source="Machine/slot2@ep1", seq=1),
              feed(AdsRefreshed([
                  AdRefresh("Machine", "slot1@ep1", src, 600.0, 2, 5, 3, {"LoadAvg": 0.5}),
                  AdRefresh("Machine", "slot2@ep1", "someone-else", 600.0, 2, 3, 2, {}),
                  AdRefresh("Machine", "slot9@ep1", "Machine/slot9@ep1", 600.0, 1, 1, 1, {})]),
                   840.0, source="collector@cm")]
    state = run(events, cfg)
    rec = collector.get_ad(state, "Machine", "slot1@ep1")
    assert rec is not None and rec.expires == 600.0 + 900 and rec.ad["LoadAvg"] == 0.5
    assert collector.get_ad(state, "Machine", "slot2@ep1").expires == 900.0  # type: ignore[union-attr]
    assert collector.get_ad(state, "Machine", "slot9@ep1") is None
    stats = collector.update_stats(state)
    assert (stats[src].received, stats[src].lost, stats[src].last_seq) == (4, 1, 5)
    assert (stats["Machine/slot9@ep1"].received, stats["Machine/slot9@ep1"].lost) == (1, 0)
    # past slot2's deadline only slot1 is left; an older refresh does not move slot1 back
    late = [feed(AdsRefreshed([AdRefresh("Machine", "slot1@ep1", src, 300.0, 6, 6, 1,
                                         {"LoadAvg": 9.0})]), 1000.0, source="collector@cm")]
    state = run(late, cfg, state)
    assert names(state) == ["slot1@ep1"]
    rec = collector.get_ad(state, "Machine", "slot1@ep1")
    assert rec is not None and rec.ad["LoadAvg"] == 0.5 and rec.expires == 1500.0
