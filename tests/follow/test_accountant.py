"""`follow accountant`: the real negotiator's Accountantnew.log as its Accounting ads
(observations for `reconcile`), only when a record changed; compaction is a rotation."""
from __future__ import annotations

import os
from pathlib import Path

from services.follow.accountant import AccountantFollower
from streams.core.groups import GroupTree
from streams.log.events import EventLog
from tests.follow.helpers import DATA, cli, dead, event_log, events

NEG = "negotiator@cm.example.org"
HEAD = """107 1 CreationTimestamp 1763790000
105
101 Accountant. * *
103 Accountant. LastUpdateTime 1763803600
101 Customer.group_physics.einstein@example.org * *
103 Customer.group_physics.einstein@example.org Priority 12.5
103 Customer.group_physics.einstein@example.org PriorityFactor 1000.0
103 Customer.group_physics.einstein@example.org ResourcesUsed 4
103 Customer.group_physics.einstein@example.org WeightedResourcesUsed 8.0
103 Customer.group_physics.einstein@example.org AccumulatedUsage 7200.0
103 Customer.group_physics.einstein@example.org WeightedAccumulatedUsage 14400.0
103 Customer.group_physics.einstein@example.org BeginUsageTime 1763790000
103 Customer.group_physics.einstein@example.org LastUsageTime 1763803000
101 Customer.group_physics * *
103 Customer.group_physics PriorityFactor 2000.0
103 Customer.group_physics WeightedAccumulatedUsage 14400.0
101 Customer.bob@example.org * *
103 Customer.bob@example.org Priority 3.0
106
"""


def follower(elog: EventLog, path: Path) -> AccountantFollower:
    return AccountantFollower(elog, path, negotiator=NEG, default_factor=1000.0,
                              group_of=GroupTree.from_names("group_physics").group_of)


def ads(elog: EventLog) -> list[tuple[str, str, dict[str, object] | None, float]]:
    return [(e.type, e.data.name, getattr(e.data, "ad", None), e.ts) for e in events(elog)]


def test_accounting_ads_of_every_customer_record(tmp_path: Path) -> None:
    path = tmp_path / "Accountantnew.log"
    path.write_text(HEAD)
    elog = event_log(tmp_path / "home")
    follower(elog, path).poll()
    got = {name: (kind, ad, ts) for kind, name, ad, ts in ads(elog)}
    assert set(got) == {"group_physics.einstein@example.org", "group_physics", "bob@example.org"}
    assert all(kind == "ad.updated" and ts == 1763803600.0 for kind, _, ts in got.values())
    assert got["group_physics.einstein@example.org"][1] == {
        "MyType": "Accounting", "Name": "group_physics.einstein@example.org",
        "NegotiatorName": NEG, "Priority": 12.5, "PriorityFactor": 1000.0,
        "ResourcesUsed": 4, "WeightedResourcesUsed": 8.0, "AccumulatedUsage": 7200.0,
        "WeightedAccumulatedUsage": 14400.0, "BeginUsageTime": 1763790000,
        "LastUsageTime": 1763803000, "IsAccountingGroup": False,
        "AccountingGroup": "group_physics"}
    group = got["group_physics"][1]
    assert group is not None
    assert (group["IsAccountingGroup"], group["AccountingGroup"], group["PriorityFactor"]) == \
        (True, "group_physics", 2000.0)
    bob = got["bob@example.org"][1]
    assert bob is not None
    assert (bob["AccountingGroup"], bob["PriorityFactor"], bob["ResourcesUsed"]) == \
        ("<none>", 1000.0, 0)   # no group; DEFAULT_PRIO_FACTOR; no usage recorded
    assert all(e.data.ad_type == "Accounting" for e in events(elog))


def test_only_changed_records_and_open_transactions(tmp_path: Path) -> None:
    """A new transaction changing one record gives one ad; a transaction still being written
    is not read until its 106; a deleted record is invalidated; an unchanged file nothing."""
    path = tmp_path / "Accountantnew.log"
    path.write_text(HEAD)
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    f.poll()
    with open(path, "a") as out:
        out.write("105\n103 Accountant. LastUpdateTime 1763803660\n"
                  "103 Customer.bob@example.org Priority 2.5\n")
    assert f.poll().events == 0
    with open(path, "a") as out:
        out.write("106\n")
    assert f.poll().events == 1
    kind, name, ad, ts = ads(elog)[-1]
    assert (kind, name, ts) == ("ad.updated", "bob@example.org", 1763803660.0)
    assert ad is not None and ad["Priority"] == 2.5
    with open(path, "a") as out:
        out.write("105\n103 Accountant. LastUpdateTime 1763803720\n102 Customer.bob@example.org\n"
                  "106\n")
    assert f.poll().events == 1
    assert ads(elog)[-1][:2] == ("ad.invalidated", "bob@example.org")
    assert f.poll().events == 0


def test_compaction_is_a_rotation(tmp_path: Path) -> None:
    """The negotiator rewrites the file on compaction (a new file renamed over the old): the
    new one is replayed from its start; only records whose values differ are appended."""
    path = tmp_path / "Accountantnew.log"
    path.write_text(HEAD)
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    f.poll()
    compacted = tmp_path / "Accountantnew.log.tmp"
    compacted.write_text(HEAD.replace("Priority 3.0", "Priority 4.0")
                         .replace("LastUpdateTime 1763803600", "LastUpdateTime 1763803900"))
    os.rename(compacted, path)
    report = f.poll()
    assert report.rotations == 1 and report.events == 1
    assert ads(elog)[-1][1] == "bob@example.org" and ads(elog)[-1][3] == 1763803900.0


def test_bad_lines_dead_lettered_with_offset(tmp_path: Path) -> None:
    """The importer's sample (a malformed value, an unknown operation): dead-lettered with
    file:line and byte offset; the records around them still become ads."""
    path = tmp_path / "Accountantnew.log"
    path.write_bytes((DATA / "Accountantnew.log").read_bytes())
    elog = event_log(tmp_path / "home")
    report = follower(elog, path).poll()
    text = path.read_text()
    reasons = [d.reason for d in dead(elog)]
    assert report.dead == len(reasons) >= 1
    bad = text.index("103 Customer.bob@example.org PriorityFactor oops(")
    line = text[:bad].count("\n") + 1
    assert any(r.startswith(f"{path}:{line} (byte {bad}): PriorityFactor") for r in reasons), reasons
    assert {name for _, name, _, _ in ads(elog)} >= {"alice@example.org", "bob@example.org"}


def test_cli_follow_accountant_and_reconcile_shape(tmp_path: Path) -> None:
    """`follow accountant --once` with the negotiator named by option; the ads are
    ad.updated events any reader of the log sees (here `log export`)."""
    path = tmp_path / "Accountantnew.log"
    path.write_text(HEAD)
    home = tmp_path / "home"
    r = cli(home, "follow", "accountant", "--once", "--negotiator", NEG, str(path))
    assert r.returncode == 0, r.stderr
    assert "3 events appended, 0 dead-lettered" in r.stdout
    r = cli(home, "--set", "POOLLEDGER_FOLLOW_NEGOTIATOR=cm2.example.org", "follow",
            "accountant", "--once", "--name", "second", str(path))
    assert r.returncode == 0, r.stderr
    elog = event_log(home)
    names = [e.data.ad["NegotiatorName"] for e in events(elog)]
    assert names == [NEG] * 3 + ["cm2.example.org"] * 3
    assert [e.source for e in events(elog)][-1] == "accountant@second"
