"""The reconciliation fold (streams/core/reconcile.py): what each writer's Accounting ad means,
drift dated in event time, agreement with HTCondor's formulas and with PoolLedger's own
negotiator, and the section's place in snapshots, faust tables and the canonical JSON."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from schemas.settings import load_settings
from streams.core.ledger import Ledger
from streams.core.reconcile import NO_RECORD, reported
from streams.faust_tables import from_snapshot_doc, snapshot_doc
from streams.replay import replay
from tests.reconcile.helpers import (NEGOTIATOR, accounting, cycle, events_of, negotiator_ad,
                                     simulated, start, stop)

T0 = 1_763_800_000.0
H = 1000.0
ALICE = "alice@example.org"
#: the agreement we state: every compared attribute within this relative difference
AGREEMENT = 1e-6


def _htcondor(tolerance: float = AGREEMENT) -> Ledger:
    return Ledger(load_settings(overrides={
        "POOLLEDGER_ACCOUNTING_MODE": "htcondor", "PRIORITY_HALFLIFE": str(H),
        "POOLLEDGER_RECONCILE_TOLERANCE": repr(tolerance)}))


def _row(ledger: Ledger, name: str):  # type: ignore[no-untyped-def]
    rows = [r for r in ledger.reconciliation() if r.name == name]
    assert len(rows) == 1, rows
    return rows[0]


def test_reported_reads_the_priority_each_writer_means() -> None:
    # condor_negotiator's forwarded ad: Priority is GetPriority() = RUP x factor; LastUpdate set
    real = reported({"Name": ALICE, "Priority": 1500.0, "PriorityFactor": 1000.0,
                     "LastUpdate": T0, "WeightedAccumulatedUsage": 7.0})
    assert real["Priority"] == 1.5 and real["EffectivePriority"] == 1500.0
    assert real["WeightedAccumulatedUsage"] == 7.0
    # a Customer record of Accountantnew.log: the real priority, no LastUpdate
    record = reported({"Name": ALICE, "Priority": 1.5, "PriorityFactor": 1000.0})
    assert record["Priority"] == 1.5 and record["EffectivePriority"] == 1500.0
    # PoolLedger's own ads carry both
    own = reported({"Name": ALICE, "Priority": 1.5, "EffectivePriority": 1500.0,
                    "PriorityFactor": 1000.0, "LastUpdateTime": T0})
    assert own["Priority"] == 1.5 and own["EffectivePriority"] == 1500.0
    # expressions, strings and booleans are not numbers: left out, never a failure
    odd = reported({"Name": ALICE, "Priority": "/Expr(1 + 1)/", "ResourcesUsed": True,
                    "PriorityFactor": "high"})
    assert "Priority" not in odd and "ResourcesUsed" not in odd and "PriorityFactor" not in odd


def test_hand_computed_htcondor_ads_agree_and_drift_is_dated() -> None:
    """HTCondor's UpdatePriorities by hand (REFERENCE.md): PoolLedger in htcondor mode agrees
    with the negotiator's ads within 1e-6 relative on every attribute; an ad off by 1e-5
    drifts from its own event time until an agreeing one clears it."""
    led = _htcondor()
    for env in [cycle(T0), start(ALICE, "s1", T0 + 100, weight=2.0), cycle(T0 + 400)]:
        led.apply(env)
    a1 = 0.5 ** (400 / H)
    p1 = max(0.5, 0.5 * a1 + (2.0 - 200.0 / 400) * (1 - a1))
    led.apply(negotiator_ad(ALICE, T0 + 401, last_update=T0 + 400, rup=p1, factor=1000.0,
                            ResourcesUsed=1, WeightedResourcesUsed=2.0, AccumulatedUsage=300.0,
                            WeightedAccumulatedUsage=600.0, BeginUsageTime=T0 + 400,
                            LastUsageTime=T0 + 400))
    row = _row(led, ALICE)
    assert row.negotiator == NEGOTIATOR and row.as_of == T0 + 400 and row.reported_at == T0 + 401
    assert row.drifting == [] and row.since is None and row.agreed == T0 + 401
    assert row.ours is not None
    for attr in ("Priority", "EffectivePriority", "WeightedAccumulatedUsage", "AccumulatedUsage",
                 "WeightedResourcesUsed", "ResourcesUsed", "PriorityFactor"):
        assert row.ours[attr] == pytest.approx(row.theirs[attr], rel=AGREEMENT), attr
    assert row.ours["Priority"] == pytest.approx(p1, rel=1e-12)

    led.apply(stop("s1", T0 + 500))
    led.apply(cycle(T0 + 700))
    p2 = max(0.5, p1 * 0.5 ** (300 / H) + (200.0 / 300) * (1 - 0.5 ** (300 / H)))
    usage = {"ResourcesUsed": 0, "WeightedResourcesUsed": 0.0, "AccumulatedUsage": 400.0,
             "WeightedAccumulatedUsage": 800.0}
    for ts in (T0 + 701, T0 + 760):  # the negotiator's priority 1e-5 too high, twice
        led.apply(negotiator_ad(ALICE, ts, last_update=T0 + 700, rup=p2 * (1 + 1e-5),
                                factor=1000.0, **usage))
    row = _row(led, ALICE)
    assert row.drifting == ["Priority", "EffectivePriority"]
    assert row.since == T0 + 701 and row.agreed == T0 + 401 and row.reports == 3
    led.apply(negotiator_ad(ALICE, T0 + 761, last_update=T0 + 700, rup=p2, factor=1000.0, **usage))
    row = _row(led, ALICE)
    assert row.drifting == [] and row.since is None and row.agreed == T0 + 761


def test_a_looser_tolerance_accepts_what_a_tighter_one_calls_drift() -> None:
    evs = [cycle(T0), start(ALICE, "s1", T0 + 100), cycle(T0 + 400)]
    p = max(0.5, 0.5 * 0.5 ** 0.4 + (1 - 100 / 400) * (1 - 0.5 ** 0.4))
    ad = negotiator_ad(ALICE, T0 + 401, last_update=T0 + 400, rup=p * 1.001, factor=1000.0)
    tight, loose = _htcondor(1e-6), _htcondor(0.01)
    for led in (tight, loose):
        for env in [*evs, ad]:
            led.apply(env)
    assert _row(tight, ALICE).drifting == ["Priority", "EffectivePriority"]
    assert _row(loose, ALICE).drifting == []


def test_a_submitter_poolledger_never_saw_drifts_as_no_record() -> None:
    led = _htcondor()
    led.apply(cycle(T0))
    led.apply(negotiator_ad("carol@example.org", T0 + 1, last_update=T0, rup=0.5, factor=1000.0))
    row = _row(led, "carol@example.org")
    assert row.drifting == [NO_RECORD] and row.ours is None and row.since == T0 + 1


def test_group_quotas_are_compared_for_groups() -> None:
    led = Ledger(load_settings(overrides={"GROUP_NAMES": "group_a", "GROUP_QUOTA_group_a": "4"}))
    led.apply(start("group_a.bob@example.org", "s1", T0))
    led.apply(cycle(T0 + 60))
    ours = led.group_quotas()["group_a"]
    led.apply(accounting({"Name": "group_a", "IsAccountingGroup": True, "Priority": 0.5,
                          "PriorityFactor": 1000.0, "EffectivePriority": 500.0,
                          "ConfigQuota": ours["ConfigQuota"], "EffectiveQuota": 3.0,
                          "SubtreeQuota": ours["SubtreeQuota"],
                          "SurplusPolicy": ours["SurplusPolicy"]}, T0 + 61))
    row = _row(led, "group_a")
    # no slots: PoolLedger's effective quota is 0 where the negotiator says 3
    assert ours["ConfigQuota"] == 4.0 and ours["EffectiveQuota"] == 0.0
    assert row.drifting == ["EffectiveQuota"]
    assert "ConfigQuota" not in row.drifting and "SurplusPolicy" not in row.drifting


@pytest.fixture(scope="module")
def own_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A simulated run per accounting mode: its negotiator's Accounting ads are on the log."""
    return {mode: simulated(tmp_path_factory.mktemp(mode), POOLLEDGER_ACCOUNTING_MODE=mode)
            for mode in ("exact", "htcondor")}


@pytest.mark.parametrize("mode", ["exact", "htcondor"])
def test_own_negotiator_ads_show_no_drift(own_logs: dict[str, Path], mode: str) -> None:
    """Self-consistency: replayed, the run's own Accounting ads agree with the ledger exactly
    (tolerance 0) on every submitter and group, every cycle."""
    evs = events_of(own_logs[mode])
    ads = [e for e in evs if e.type == "ad.updated" and e.data.ad_type == "Accounting"]
    led = replay(evs, load_settings(overrides={"POOLLEDGER_RECONCILE_TOLERANCE": "0"}))
    rows = led.reconciliation()
    assert {r.name for r in rows} == {"alice@example.org", "group_physics.bob@example.org",
                                      "group_physics", "<none>"}
    assert sum(r.reports for r in rows) == len(ads) > 100
    for r in rows:
        assert r.drifting == [] and r.since is None, (r.name, r.ours, r.theirs)
        assert r.ours is not None
        assert r.ours["WeightedAccumulatedUsage"] == r.theirs["WeightedAccumulatedUsage"]
    assert any(r.ours and r.ours["WeightedAccumulatedUsage"] > 0 for r in rows)
    group = next(r for r in rows if r.name == "group_physics")
    assert group.is_group and "EffectiveQuota" in group.theirs


def test_other_mode_than_the_run_shows_drift(own_logs: dict[str, Path]) -> None:
    """The exact run's events folded in htcondor mode (its knob event left out): the
    accountant differs from the ads the run published, and the fold says so."""
    evs = [e for e in events_of(own_logs["exact"])
           if not (e.type == "config.changed" and e.data.knob == "POOLLEDGER_ACCOUNTING_MODE")]
    led = replay(evs, load_settings(overrides={"POOLLEDGER_RECONCILE_TOLERANCE": "1e-9",
                                               "POOLLEDGER_ACCOUNTING_MODE": "htcondor"}))
    drifting = [r for r in led.reconciliation() if r.drifting]
    assert drifting and all(r.since is not None for r in drifting)


def test_the_section_round_trips_and_stays_out_of_the_canonical_json(
        own_logs: dict[str, Path]) -> None:
    settings = load_settings()
    led = replay(events_of(own_logs["exact"]), settings)
    rows = [r.to_doc() for r in led.reconciliation()]
    assert rows and "reconcile" not in orjson.loads(led.to_json())
    again = Ledger.from_sections(settings, led.to_sections())
    assert [r.to_doc() for r in again.reconciliation()] == rows
    tables = from_snapshot_doc(settings, orjson.loads(orjson.dumps(snapshot_doc(led))))
    assert [r.to_doc() for r in tables.reconciliation()] == rows
    assert Ledger.from_snapshot(settings, led.to_snapshot()).to_snapshot() == led.to_snapshot()


def test_embedded_runner_restored_midway_and_the_faust_tables_agree_with_a_replay(
        own_logs: dict[str, Path], tmp_path: Path) -> None:
    """The rows are the ledger's: the embedded runner resuming from its snapshot midway, the
    faust tables' flush and restore, and a replay hold the same rows (drift included)."""
    from streams.faust_tables import TableMirror, restore
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.log.port import TopicSpec
    from streams.runner import EmbeddedRunner

    settings = load_settings()
    evs = events_of(own_logs["exact"])
    last = max(e.ts for e in evs)
    evs.append(negotiator_ad(ALICE, last + 1, last_update=last, rup=9.0, factor=1000.0))
    full = replay(evs, settings)
    assert any(r.drifting for r in full.reconciliation())
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    for topic in ("poolledger.events", "poolledger.derived"):
        elog.log.create_topic(TopicSpec(topic))
    half = len(evs) // 2
    elog.append("poolledger.events", evs[:half])
    EmbeddedRunner(elog, settings).run_once()
    elog.append("poolledger.events", evs[half:])
    resumed = EmbeddedRunner(elog, settings)
    assert resumed.events == half and resumed.run_once() == len(evs) - half
    assert resumed.ledger.to_snapshot() == full.to_snapshot()
    assert [r.to_doc() for r in resumed.ledger.reconciliation()] == \
        [r.to_doc() for r in full.reconciliation()]
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}
    for table, writes in TableMirror().changes(full):
        (subs if table == "submitters" else pool).update(writes)
    restored, _mirror = restore(subs, pool, settings)
    assert restored is not None
    assert [r.to_doc() for r in restored.reconciliation()] == \
        [r.to_doc() for r in full.reconciliation()]


def test_hand_computed_group_ad_in_htcondor_form_agrees() -> None:
    """forwardGroupAccounting's ad (matchmaker.cpp): Priority = the group's EUP, its usage
    (the group record is charged like its submitters: AddMatch), ConfigQuota; a group's
    priority decays toward its subtree's usage (HierWeightedResourcesUsed)."""
    led = Ledger(load_settings(overrides={
        "POOLLEDGER_ACCOUNTING_MODE": "htcondor", "PRIORITY_HALFLIFE": str(H),
        "POOLLEDGER_RECONCILE_TOLERANCE": repr(AGREEMENT), "GROUP_NAMES": "group_a",
        "GROUP_QUOTA_group_a": "4"}))
    bob = "group_a.bob@example.org"
    for env in [cycle(T0), start(bob, "s1", T0 + 100, weight=2.0), cycle(T0 + 400)]:
        led.apply(env)
    a1 = 0.5 ** (400 / H)
    p1 = max(0.5, 0.5 * a1 + (2.0 - 200.0 / 400) * (1 - a1))
    usage = {"ResourcesUsed": 1, "WeightedResourcesUsed": 2.0, "AccumulatedUsage": 300.0,
             "WeightedAccumulatedUsage": 600.0}
    led.apply(accounting({"Name": "group_a", "IsAccountingGroup": True,
                          "AccountingGroup": "<none>", "Priority": p1 * 1000.0,
                          "PriorityFactor": 1000.0, "LastUpdate": T0 + 400,
                          "ConfigQuota": 4.0, "SurplusPolicy": "no", **usage}, T0 + 401))
    led.apply(negotiator_ad(bob, T0 + 401, last_update=T0 + 400, rup=p1, factor=1000.0, **usage))
    group, user = _row(led, "group_a"), _row(led, bob)
    assert group.is_group and group.drifting == [] and user.drifting == []
    assert group.ours is not None and group.ours["ConfigQuota"] == 4.0
    assert group.ours["Priority"] == pytest.approx(p1, rel=1e-12)


def test_reconcile_reads_a_covering_snapshot_without_its_large_sections(
        own_logs: dict[str, Path]) -> None:
    """Like userprio: the rows are a small section of their own, so a snapshot that covers
    the log answers `reconcile` without parsing the collector's ads or the job queue."""
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.replay import replay_log

    settings = load_settings()
    log = EmbeddedLog(own_logs["exact"])
    try:
        folded = replay_log(EventLog(log), settings, warn=pytest.fail, needs=())
    finally:
        log.close()
    assert folded.from_snapshot
    rows = folded.ledger.reconciliation()
    assert folded.ledger._unparsed is not None  # the large sections were not parsed
    assert [r.to_doc() for r in rows] == [
        r.to_doc() for r in replay(events_of(own_logs["exact"]), settings).reconciliation()]
