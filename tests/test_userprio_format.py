"""condor_userprio layout, character for character.

The goldens in tests/data/userprio/ were written by hand from the printf formats in HTCondor's
src/condor_tools/user_prio.cpp and src/condor_utils/format_time.cpp (widths, centring, %g
fallback, <now>, 24 h filter, footer), not captured from this formatter. They keep trailing
spaces: condor_userprio pads every column, the last one included.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.commands.userprio.views import (
    VIEWS,
    format_date,
    format_date_year,
    format_delta,
    format_userprio,
    userprio_json,
)
from services.commands.userprio.views import _number as number

GOLDEN = Path(__file__).parent / "data" / "userprio"
NOW = 1763800000.0          # 2025-11-22 08:26:40 UTC
LAST_UPDATE = 1763799960.0  # 2025-11-22 08:26:00 UTC


def rec(name: str, *, group: str, is_group: bool = False, prio: float, factor: float = 1000.0,
        res: int, accum: float, begin: float, last: float, floor: float = 0.0,
        ceiling: float = -1.0, hier: float | None = None,
        raw_accum: float | None = None) -> dict[str, Any]:
    """A record shaped like streams.core.accountant.view() output."""
    r: dict[str, Any] = {
        "Name": name, "IsAccountingGroup": is_group, "Priority": prio, "PriorityFactor": factor,
        "ResourcesUsed": res, "WeightedResourcesUsed": float(res),
        "AccumulatedUsage": accum if raw_accum is None else raw_accum,
        "WeightedAccumulatedUsage": accum, "BeginUsageTime": begin, "LastUsageTime": last,
        "LastUpdateTime": LAST_UPDATE, "Floor": floor, "Ceiling": ceiling, "Leases": {},
        "EffectivePriority": prio * factor, "AccountingGroup": group,
    }
    if hier is not None:
        r["HierWeightedResourcesUsed"] = hier
    return r


ALICE = rec("alice@example.org", group="<none>", prio=12.34, res=4, accum=45000.0,
            begin=1763700000.0, last=NOW, raw_accum=40000.0)
ALICE["EffectivePriority"] = 12340.0
BOB = rec("group_physics.bob@example.org", group="group_physics", prio=3.5, res=2, accum=9000.0,
          begin=1763780000.0, last=1763794560.0, floor=2.0, ceiling=10.0)
BOB["Leases"] = {"ceiling": {"PreLeaseValue": -1.0, "Expires": 1763803560.0}}
CAROL = rec("carol@example.org", group="<none>", prio=0.5, factor=1e10, res=0, accum=1.5e13,
            begin=1700000000.0, last=1763500000.0)  # idle for 3.5 days
PHYSICS = rec("group_physics", group="group_physics", is_group=True, prio=2.0, res=2,
              accum=9000.0, begin=1763780000.0, last=1763794560.0, hier=2.0)
NONE = rec("<none>", group="<none>", is_group=True, prio=6.0, res=4, accum=15000000045000.0,
           begin=1700000000.0, last=NOW, hier=6.0, raw_accum=15000000040000.0)
ROWS = {r["Name"]: r for r in (ALICE, BOB, CAROL, NONE, PHYSICS)}
GROUPS = {
    "group_physics": {"ConfigQuota": 10.0, "EffectiveQuota": 10.0, "SubtreeQuota": 10.0,
                      "SurplusPolicy": "no", "Requested": 6.0},
    "<none>": {"ConfigQuota": 20.0, "EffectiveQuota": 10.0, "SubtreeQuota": 20.0,
               "SurplusPolicy": "byquota", "Requested": 4.0},
}


def golden(name: str) -> str:
    return (GOLDEN / f"{name}.txt").read_text()


def show(view: str, **kw: Any) -> str:
    return format_userprio(ROWS, now=NOW, last_update=LAST_UPDATE, view=view, groups=GROUPS, **kw)


@pytest.mark.parametrize("view,name", [
    ("default", "default"), ("most", "default"), ("all", "all"), ("quotas", "quotas"),
    ("usage", "usage"), ("priority", "priority"), ("allusers", "allusers"), ("long", "long"),
])
def test_views_match_goldens(view: str, name: str) -> None:
    assert show(view) == golden(name)


def test_long_types_follow_htcondor_ads() -> None:
    """Quotas are reals and times/floor/ceiling integers whatever Python type they arrive in."""
    groups = {"<none>": {"ConfigQuota": 20, "Requested": 0, "SurplusPolicy": 'say "no"'}}
    got = format_userprio({"<none>": dict(NONE, Floor=1.0, LastUsageTime=1763800000.7)},
                          now=NOW, last_update=LAST_UPDATE, view="long", groups=groups)
    lines = got.splitlines()
    assert "ConfigQuota = 20.0" in lines and "Requested = 0.0" in lines
    assert "Floor = 1" in lines and "LastUsageTime = 1763800000" in lines
    assert 'SurplusPolicy = "say \\"no\\""' in lines
    assert "Leases" not in got and got.endswith("\n\n")


def test_most_without_accounting_groups_is_flat() -> None:
    """No submitter in a group: no group column or rows, <none> hidden, quotas dropped."""
    bob = dict(BOB, Name="bob@example.org", AccountingGroup="<none>")
    rows = {"alice@example.org": ALICE, "bob@example.org": bob, "carol@example.org": CAROL,
            "<none>": NONE}
    got = format_userprio(rows, now=NOW, last_update=LAST_UPDATE, view="most")
    assert got == golden("most_flat")


def test_activity_filter_and_activefrom() -> None:
    assert "carol" not in show("default")
    got = show("default", activefrom=NOW - 4 * 86400)
    expected = golden("allusers").splitlines()[:-1] + [
        "Number of users: 3   " + " " + " " * 9 + " " + "ByQuota" + " " + " " * 12 + " " + " " * 9
        + " " + "     6" + " " + " 4.16667e+09" + " " + "   3+23:59" + " " + " " * 10
        + " " + " " * 9 + " " + " " * 9]
    assert got.splitlines() == expected
    # just inside / just outside the 24 h window
    edge = dict(ROWS)
    edge["carol@example.org"] = dict(CAROL, LastUsageTime=NOW - 86400)
    assert "carol@example.org" in format_userprio(edge, now=NOW, last_update=LAST_UPDATE)
    edge["carol@example.org"] = dict(CAROL, LastUsageTime=NOW - 86401)
    assert "carol@example.org" not in format_userprio(edge, now=NOW, last_update=LAST_UPDATE)


def test_regroup_puts_none_last_and_names_the_policy() -> None:
    groups = dict(GROUPS, group_physics=dict(GROUPS["group_physics"], SurplusPolicy="regroup"))
    got = format_userprio(ROWS, now=NOW, last_update=LAST_UPDATE, view="quotas", groups=groups)
    lines = got.splitlines()
    assert [ln.split()[0] for ln in lines[4:6]] == ["group_physics", "<none>"]
    assert lines[4][42:49] == "Regroup"  # Use Surplus starts after 21 + 2 * (1 + 9) + 1
    assert lines[-1].split()[-1] == "Regroup"


def test_quota_columns_without_quota_data_say_nd() -> None:
    got = format_userprio(ROWS, now=NOW, last_update=LAST_UPDATE, view="quotas")
    assert got.splitlines()[4] == ("<none>" + " " * 15 + "       n/d" * 2 + " " + "    n/d"
                                   + "       n/d" + "        n/d")


def test_printf_helpers() -> None:
    # %2d/%-2d %02d:%02d pads a one-digit month on the left and a one-digit day on the right
    assert format_date(1741356300.0) == " 3/7  14:05"      # 2025-03-07 14:05 UTC
    assert format_date_year(1741356300.0) == " 3/07/2025 14:05"
    assert format_date(-1) == "    ???    "
    assert format_delta(5400) == "  0+01:30"
    assert format_delta(123 * 86400 + 4 * 3600 + 5 * 60 + 59) == "123+04:05"
    assert format_delta(-1) == "[?????]"
    # %W.Df first, %.{W-6}g when too wide
    assert number(1234567.0, 6, 0) == " 1e+06"
    assert number(123456.0, 6, 0) == "123456"
    assert number(4166666666.6666665, 12, 2) == " 4.16667e+09"
    assert number(999999999.994, 12, 2) == "999999999.99"
    assert number(1e10, 9, 2) == "    1e+10"
    assert number(123456.0, 8, 2) == " 1.2e+05"


def test_no_records_prints_nothing_and_bad_view_raises() -> None:
    assert format_userprio({}, now=NOW, last_update=LAST_UPDATE) == ""
    with pytest.raises(ValueError):
        show("fancy")
    assert set(VIEWS) == {"default", "most", "all", "quotas", "usage", "priority", "allusers"}


def test_json() -> None:
    limits: dict[str, dict[str, Any]] = {"xsw": {"Max": 10, "InUse": 3},
                                         "fileserver": {"Max": 2.0, "InUse": 2.0}}
    doc = userprio_json(ROWS, now=NOW, groups=GROUPS, limits=limits)
    assert set(doc) == {"Now", "Submitters", "Groups", "Limits"}
    assert doc["Now"] == NOW
    base = {"Name", "Priority", "PriorityFactor", "EffectivePriority", "ResourcesUsed",
            "WeightedResourcesUsed", "AccumulatedUsage", "WeightedAccumulatedUsage",
            "BeginUsageTime", "LastUsageTime", "Floor", "Ceiling", "AccountingGroup",
            "IsAccountingGroup"}
    # GroupResourcesAllocated (the allocation, issue 25 item 1): None without `allocations`
    quota = {"ConfigQuota", "EffectiveQuota", "SubtreeQuota", "SurplusPolicy", "Requested",
             "GroupResourcesAllocated"}
    assert [s["Name"] for s in doc["Submitters"]] == [
        "group_physics.bob@example.org", "alice@example.org", "carol@example.org"]  # by EUP
    assert all(set(s) == base for s in doc["Submitters"])
    assert [g["Name"] for g in doc["Groups"]] == ["group_physics", "<none>"]
    assert all(set(g) == base | quota for g in doc["Groups"])
    bob = doc["Submitters"][0]
    assert (bob["Priority"], bob["EffectivePriority"], bob["Floor"], bob["Ceiling"]) == (
        3.5, 3500.0, 2.0, 10.0)
    assert bob["AccountingGroup"] == "group_physics" and bob["IsAccountingGroup"] is False
    assert doc["Groups"][1]["SurplusPolicy"] == "byquota"
    assert doc["Limits"] == [{"Name": "fileserver", "Max": 2.0, "InUse": 2.0},
                             {"Name": "xsw", "Max": 10, "InUse": 3}]
    bare = userprio_json(ROWS, now=NOW)
    assert bare["Groups"][0]["ConfigQuota"] is None and bare["Limits"] == []


def _since_column(text: str, name: str) -> str:
    """The "Time Since Last Usage" cell of `name`'s row (located by the heading)."""
    lines = text.splitlines()
    start = lines[2].index("Last Usage")  # the heading fills the 10-wide column
    row = next(ln for ln in lines if ln.strip().startswith(name))
    return row[start:start + 10]


def test_time_since_last_usage_of_a_submitter_that_never_used_is_blank() -> None:
    """condor_userprio measures from LastUsageTime 0 and cuts `20416+08:2` (days since 1970)
    to the column: a never-used submitter's cell is blank here, its neighbours as ever."""
    never = rec("dave@example.org", group="<none>", prio=0.5, res=0, accum=0.0, begin=0.0,
                last=0.0)
    text = format_userprio({r["Name"]: r for r in (ALICE, never, CAROL, NONE)}, now=NOW, last_update=LAST_UPDATE,
                           view="allusers")
    assert "20416" not in text and "+" not in _since_column(text, "dave@example.org")
    assert _since_column(text, "dave@example.org").strip() == ""
    assert _since_column(text, "alice@example.org").strip() == "<now>"
    assert _since_column(text, "carol@example.org").strip() == "3+11:19"


def test_time_since_last_usage_is_never_cut_by_the_column() -> None:
    old = rec("erin@example.org", group="<none>", prio=0.5, res=0, accum=1.0, begin=1.0,
              last=LAST_UPDATE - 10_000 * 86400 - 3 * 3600 - 25 * 60)
    text = format_userprio({r["Name"]: r for r in (ALICE, old, NONE)}, now=NOW, last_update=LAST_UPDATE,
                           view="allusers")
    row = next(ln for ln in text.splitlines() if "erin@" in ln)
    assert "10000+03:25" in row
