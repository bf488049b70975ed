"""EffectiveQuota is the quota HTCondor assigned a group, not its allocation (issue 25 item 1).

HTCondor's negotiator publishes `EffectiveQuota = group->quota` in each group's Accounting ad
(matchmaker.cpp, Accountant.cpp ReportState): the static or dynamic quota after the parent's
assignment and scaling. What the group is negotiated with after surplus (`allocated`,
GroupEntry.cpp) is another number, PoolLedger's GroupResourcesAllocated.

The case is HTCondor's regression test src/condor_tests/job_hgq_negfail_basic_van.run: 40
slots, no slot weights; GROUP_NAMES = a, b, a.a, a.b, b.a, b.b, each GROUP_QUOTA_DYNAMIC 0.5
of its parent; surplus accepted except by a and b; a.a.user submits 20 jobs, a.b.user 10,
b.a.user 10, nobody in b.b. HTCondor's quotas (GroupEntry::hgq_assign_quotas): a and b get
20 each and keep nothing of it (their children take it all), each leaf 10, `<none>` 0;
SubtreeQuota a, b 20, leaves 10. EffectiveQuota = that quota for every group — b.b's is 10
though it asks for nothing, where PoolLedger used to publish 0 (its allocation).
"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import orjson
import pytest

from adstash.history.target import HistoryTarget
from schemas.events import (AdUpdated, ConfigChanged, Envelope, JobSubmitted, NegotiationCycled,
                            QuotaComputed, make_event)
from schemas.settings import load_settings
from services.cli import main
from services.pool.collector import accounting_ads
from streams.core.ledger import Ledger
from streams.log.topics import DERIVED
from streams.sink import SinkItem

T0 = 1_763_800_000.0
KNOBS = [("GROUP_NAMES", "a, b, a.a, a.b, b.a, b.b"),
         *((f"GROUP_QUOTA_DYNAMIC_{g}", "0.5") for g in ("a", "b", "a.a", "a.b", "b.a", "b.b")),
         ("GROUP_ACCEPT_SURPLUS", "true"), ("GROUP_ACCEPT_SURPLUS_a", "false"),
         ("GROUP_ACCEPT_SURPLUS_b", "false"), ("NEGOTIATOR_USE_SLOT_WEIGHTS", "false")]
JOBS = {"a.a.user": 20, "a.b.user": 10, "b.a.user": 10}


def _log(jobs: dict[str, int]) -> list[Envelope]:
    evs = [make_event(ConfigChanged(k, v, "root"), ts=T0, source="admin", seq=i + 1)
           for i, (k, v) in enumerate(KNOBS)]
    for i in range(40):
        name = f"slot{i + 1}@ep1.example.org"
        evs.append(make_event(AdUpdated("Machine", name, {
            "MyType": "Machine", "Name": name, "Machine": "ep1.example.org", "Cpus": 1,
            "Memory": 1024, "State": "Unclaimed", "Activity": "Idle"}),
            ts=T0 + 10, source=f"startd@slot{i + 1}", seq=1))
    seq = 0
    for user, n in jobs.items():
        for _ in range(n):
            seq += 1
            evs.append(make_event(JobSubmitted(f"{seq}.0", "schedd@ap1", f"{user}@example.org",
                                               {"RequestCpus": 1}),
                                  ts=T0 + 20, source="schedd@ap1", seq=seq))
    evs.append(make_event(NegotiationCycled("negotiator@cm", 1, T0 + 30), ts=T0 + 30,
                          source="negotiator@cm", seq=1))
    return evs


def _ledger(evs: list[Envelope]) -> tuple[Ledger, list[Envelope]]:
    led = Ledger(load_settings(env={}))
    derived = [d for env in evs for d in led.apply(env)]
    return led, derived


#: (EffectiveQuota, SubtreeQuota, ConfigQuota, SurplusPolicy, Requested) per group, HTCondor's
#: (`<none>`'s ConfigQuota is 0: no knob configures the root, GroupEntry.cpp never sets it)
EXPECTED = {"a": (0.0, 20.0, 0.5, "no", 0.0), "b": (0.0, 20.0, 0.5, "no", 0.0),
            "a.a": (10.0, 10.0, 0.5, "byquota", 20.0), "a.b": (10.0, 10.0, 0.5, "byquota", 10.0),
            "b.a": (10.0, 10.0, 0.5, "byquota", 10.0), "b.b": (10.0, 10.0, 0.5, "byquota", 0.0),
            "<none>": (0.0, 40.0, 0.0, "byquota", 0.0)}


def test_ledger_publishes_htcondors_effective_quota() -> None:
    led, derived = _ledger(_log(JOBS))
    q = led.group_quotas()
    assert {g: (v["EffectiveQuota"], v["SubtreeQuota"], v["ConfigQuota"], v["SurplusPolicy"],
                v["Requested"])
            for g, v in q.items()} == EXPECTED
    # the allocation is its own number: b.b keeps its quota of 10 but is allocated nothing
    assert led.group_allocations() == {"<none>": 0.0, "a": 0.0, "a.a": 10.0, "a.b": 10.0,
                                       "b": 0.0, "b.a": 10.0, "b.b": 0.0}
    # the Accounting ads the negotiator publishes (and the quota metric reads) carry the same
    ads = {a.name: a.ad for a in accounting_ads(led.priorities(all_groups=True), q,
                                                "negotiator@cm")}
    assert {g: ad["EffectiveQuota"] for g, ad in ads.items() if g in q} == {
        g: e[0] for g, e in EXPECTED.items()}
    assert not any("GroupResourcesAllocated" in ad for ad in ads.values())
    # quota.computed: HTCondor's EffectiveQuota and, apart, the allocation
    qc = {d.data.group: d.data for d in derived if isinstance(d.data, QuotaComputed)}
    assert (qc["b.b"].effective_quota, qc["b.b"].allocated) == (10.0, 0.0)
    assert (qc["a.a"].effective_quota, qc["a.a"].allocated) == (10.0, 10.0)


def test_a_log_without_demand_shows_every_quota() -> None:
    led, _ = _ledger(_log({}))
    q = led.group_quotas()
    assert {g: v["EffectiveQuota"] for g, v in q.items()} == {g: e[0] for g, e in EXPECTED.items()}
    assert set(led.group_allocations().values()) == {0.0}


def _write(tmp_path: Path, evs: list[Envelope]) -> Path:
    path = tmp_path / "hgq.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in evs))
    return path


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> str:
    capsys.readouterr()
    assert main(["--home", str(tmp_path / "h"), *args]) == 0
    return capsys.readouterr().out


def test_userprio_and_replay_show_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = str(_write(tmp_path, _log(JOBS)))
    out = _cli(capsys, tmp_path, "userprio", "-quotas", "--log", log)
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()
            if ln.split() and ln.split()[0] in EXPECTED}
    # Effective, Config, Surplus, Subtree, Requested
    assert rows["b.b"] == ["10.00", "0.50", "ByQuota", "10.00", "0"]
    assert rows["a.a"] == ["10.00", "0.50", "ByQuota", "10.00", "20"]
    long = _cli(capsys, tmp_path, "userprio", "-l", "--log", log)
    bb = next(b for b in long.split("\n\n") if 'Name = "b.b"' in b)
    assert "EffectiveQuota = 10.0" in bb.splitlines()
    assert "GroupResourcesAllocated" not in long  # not an attribute of HTCondor's ads
    for cmd in ("userprio", "replay"):
        doc = json.loads(_cli(capsys, tmp_path, cmd, "--json", "--log", log))
        groups = {g["Name"]: g for g in doc["Groups"]}
        assert (groups["b.b"]["EffectiveQuota"], groups["b.b"]["GroupResourcesAllocated"]) \
            == (10.0, 0.0)
        assert (groups["a.a"]["EffectiveQuota"], groups["a.a"]["GroupResourcesAllocated"]) \
            == (10.0, 10.0)


def test_history_quotas_table(tmp_path: Path) -> None:
    _, derived = _ledger(_log(JOBS))
    target = HistoryTarget(tmp_path / "history.duckdb")
    try:
        items = [SinkItem(DERIVED, 0, k, env) for k, env in enumerate(derived)]
        assert target.deliver(items, {DERIVED: {0: len(items)}}) == []
    finally:
        target.con.close()
    con = duckdb.connect(str(tmp_path / "history.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT grp, effective_quota, subtree_quota, allocated FROM quotas "
                           "WHERE grp IN ('a.a', 'b.b', 'b') ORDER BY grp").fetchall()
    finally:
        con.close()
    assert rows == [("a.a", 10.0, 10.0, 10.0), ("b", 0.0, 20.0, 0.0), ("b.b", 10.0, 10.0, 0.0)]
