"""Imports of a real pool that tell the truth (issue 26 item 8).

tests/data/pool_groups holds one pool at one moment, written from HTCondor's formats: the
negotiator's Accountantnew.log (a ClassAd transaction log: Customer records of submitters and
of the groups group_physics, group_chemistry and `<none>`, and a `Resource.<slot>@<sinful>`
record per claim, Accountant.cpp), a `condor_status -l` dump of its ten slots (six Claimed),
its condor_config, and what condor_userprio printed there: the default table
(condor_userprio.txt; every number follows from the records: EUP = Priority x PriorityFactor,
Total Usage = WeightedAccumulatedUsage / 3600, In Use = the claims, quotas 6 / 3 / the
remaining 1 of 10 slots) and `-l` (condor_userprio_l.txt: the collector's Accounting ads as
matchmaker.cpp builds them).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.classads import parse_status_dump
from schemas.events import AdUpdated, Envelope
from services.cli import main
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS

POOL = Path(__file__).parent / "data" / "pool_groups"
CONFIG = ["--config", str(POOL / "condor_config")]
#: -l attributes PoolLedger does not match, and why: the unweighted AccumulatedUsage has no
#: condor_userprio edit to carry it (the import says so); a group ad's AccountingGroup is its
#: parent's name in HTCondor's ads (forwardGroupAccounting), its own in PoolLedger's.
NOT_CARRIED = {"AccumulatedUsage"}


def _cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _events(home: Path) -> list[Envelope]:
    lg = EmbeddedLog(home / "log")
    try:
        return [env for _, env in EventLog(lg).read(EVENTS)]
    finally:
        lg.close()


def test_groups_need_group_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = _cli(capsys, tmp_path, "log", "import-accountant",
                        str(POOL / "Accountantnew.log"))
    assert (rc, out) == (2, "")
    assert err == (f"poolledger log import-accountant: {POOL / 'Accountantnew.log'}: accounting "
                   "group(s) group_chemistry, group_physics not in GROUP_NAMES; nothing imported: "
                   "set GROUP_NAMES = group_chemistry, group_physics (with each group's "
                   "GROUP_QUOTA_<group>) in condor_config or with --set, then import again\n")
    assert not (tmp_path / "log").exists() or _events(tmp_path) == []
    # a GROUP_NAMES that lacks one of them is refused too, naming only that one
    rc, _, err = _cli(capsys, tmp_path, "--set", "GROUP_NAMES=group_physics", "log",
                      "import-accountant", str(POOL / "Accountantnew.log"))
    assert rc == 2 and "group(s) group_chemistry not in GROUP_NAMES" in err


@pytest.fixture()
def imported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    home = tmp_path / "home"
    rc, out, _ = _cli(capsys, home, *CONFIG, "log", "import-status", str(POOL / "status.txt"))
    assert (rc, out.splitlines()[0]) == (0, "imported 10 ads into poolledger.events (0 already "
                                             "there); 0 malformed or refused to poolledger.events.dlq")
    rc, out, err = _cli(capsys, home, *CONFIG, "log", "import-accountant",
                        str(POOL / "Accountantnew.log"))
    # 6 claims, and 32 edits: every value of every Customer record an edit can set
    assert rc == 0, err
    assert out.splitlines() == [
        "imported 38 claims and record edits into poolledger.events (0 already there); "
        "0 malformed or refused to poolledger.events.dlq",
        # said, not dropped in silence (NOT_CARRIED below): 3 submitters' and 3 groups'
        "not imported: the unweighted AccumulatedUsage of 6 record(s) (no condor_userprio edit "
        "sets it; WeightedAccumulatedUsage is imported, as -setaccum)"]
    return home


def test_userprio_shows_what_condor_userprio_showed(capsys: pytest.CaptureFixture[str],
                                                    imported: Path) -> None:
    rc, out, err = _cli(capsys, imported, *CONFIG, "userprio")
    assert rc == 0
    assert out == (POOL / "condor_userprio.txt").read_text()
    assert "warning" not in err.lower()  # nothing dead-lettered, no skew


def test_userprio_long_carries_every_record(capsys: pytest.CaptureFixture[str], imported: Path,
                                            tmp_path: Path) -> None:
    rc, out, _ = _cli(capsys, imported, *CONFIG, "userprio", "-l")
    assert rc == 0
    ours_file = tmp_path / "ours.txt"
    ours_file.write_text(out)
    ours = {str(a["Name"]): a for a in parse_status_dump(ours_file)}
    theirs = {str(a["Name"]): a for a in parse_status_dump(POOL / "condor_userprio_l.txt")}
    assert set(ours) == set(theirs)
    checked = 0
    for name, ad in theirs.items():
        mine = ours[name]
        shared = (set(ad.keys()) & set(mine.keys())) - NOT_CARRIED
        if ad["IsAccountingGroup"]:
            shared.discard("AccountingGroup")
        assert {"Priority", "PriorityFactor", "ResourcesUsed", "WeightedResourcesUsed",
                "WeightedAccumulatedUsage", "BeginUsageTime", "LastUsageTime",
                "IsAccountingGroup"} <= shared
        if ad["IsAccountingGroup"]:
            assert {"EffectiveQuota", "ConfigQuota", "SubtreeQuota", "SurplusPolicy",
                    "Requested"} <= shared
        else:
            assert {"AccountingGroup", "Ceiling", "Floor"} <= shared
        assert {a: mine[a] for a in shared} == {a: ad[a] for a in shared}, name
        checked += len(shared)
    assert checked == 78  # the attributes both print, over the six ads


def _dump(path: Path, ads: list[dict[str, str]]) -> Path:
    path.write_text("".join("".join(f"{k} = {v}\n" for k, v in ad.items()) + "\n" for ad in ads))
    return path


def test_status_dump_without_last_heard_from_is_dated_by_its_own_time(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`condor_status -l -direct` style ads: no LastHeardFrom; one ad carries MyCurrentTime,
    another only DaemonStartTime: both are dated at the newest time of the dump."""
    dump = _dump(tmp_path / "direct.txt", [
        {"MyType": '"Machine"', "Name": '"slot1@ep1"', "Cpus": "1", "DaemonStartTime": "1763700000"},
        {"MyType": '"Machine"', "Name": '"slot2@ep1"', "Cpus": "1", "MyCurrentTime": "1763803585"},
        {"MyType": '"Machine"', "Name": '"slot3@ep1"', "Cpus": "1"}])
    rc, out, err = _cli(capsys, tmp_path, "log", "import-status", str(dump))
    assert rc == 0, err
    stamps = {e.data.name: e.ts for e in _events(tmp_path) if isinstance(e.data, AdUpdated)}
    assert stamps == {"slot1@ep1": 1763803585.0, "slot2@ep1": 1763803585.0,
                      "slot3@ep1": 1763803585.0}
    rc, _, err = _cli(capsys, tmp_path, "status", "-total")
    assert rc == 0 and "skew" not in err.lower() and "warning" not in err.lower()


def test_status_dump_with_no_time_at_all_is_refused(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    dump = _dump(tmp_path / "timeless.txt", [
        {"MyType": '"Machine"', "Name": '"slot1@ep1"', "Cpus": "1"},
        {"MyType": '"Machine"', "Name": '"slot2@ep1"', "Cpus": "2"}])
    rc, out, err = _cli(capsys, tmp_path, "log", "import-status", str(dump))
    assert rc == 1
    assert out.startswith("imported 0 ads into poolledger.events (0 already there); 2 malformed")
    refusals = [ln for ln in err.splitlines() if "refused:" in ln]
    assert refusals == [
        f"poolledger log import-status: refused: {dump}: 2 ad(s) without LastHeardFrom, and no "
        "ad carries a time (LastHeardFrom, DaemonLastUpdate, MyCurrentTime, LastUpdate, "
        "DaemonStartTime, ...) to date the dump by: not imported (not dated at the wall clock); "
        "condor_status -l writes LastHeardFrom"]
    assert [e for e in _events(tmp_path) if isinstance(e.data, AdUpdated)] == []
