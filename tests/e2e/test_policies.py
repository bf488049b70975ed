"""Seed 000's pool policies end to end: the pool emits, the ledger folds, the negotiator
matches, the pool starts jobs — and the log shows the policy held at every moment."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.events import Envelope, JobStarted
from tests.e2e.helpers import batch, events, machines, run, running_by, userprio

LONG = {"kind": "uniform", "low": "20m", "high": "40m"}


def _group(d: JobStarted) -> str:
    local = d.submitter.rpartition("@")[0]
    return local.rpartition(".")[0] or "<none>"


def _matches(evs: list[Envelope], cycle: int) -> list[Any]:
    return [e.data for e in evs if e.type == "match" and e.data.cycle == cycle]


# --- group quotas ---------------------------------------------------------------------------

def _groups_doc(slots_per_machine: int) -> dict[str, Any]:
    return {"config": {"GROUP_NAMES": "group_physics, group_chemistry",
                       "GROUP_QUOTA_group_physics": 20, "GROUP_QUOTA_group_chemistry": 10,
                       "GROUP_ACCEPT_SURPLUS": False,
                       "NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION": False},
            "machines": machines(10, slots_per_machine, name="node{n:02d}.example.org"),
            "submitters": [
                {"user": "einstein", "group": "group_physics", "jobs": [batch(200, LONG)]},
                {"user": "curie", "group": "group_chemistry", "jobs": [batch(200, LONG)]}]}


@pytest.mark.parametrize("slots,quotas", [(3, {"group_physics": 20, "group_chemistry": 10}),
                                          (1, {"group_physics": 10, "group_chemistry": 5})])
def test_group_quotas_hold(tmp_path: Path, slots: int, quotas: dict[str, int]) -> None:
    """20/10 on 30 slots; on 15 slots the static quotas are scaled to 10/5 (seed default)."""
    doc = _groups_doc(slots)
    if slots == 1:  # 15 slots: 10 one-slot machines are too few, use 15
        doc["machines"] = machines(15, 1, name="node{n:02d}.example.org")
    _loop, result = run(tmp_path, doc, hours=2)
    evs = list(events(tmp_path))
    peak, timeline = running_by(evs, _group)
    assert peak == quotas  # never exceeded, and reached
    settled = [counts for ts, counts in timeline if ts >= result.start + 3600]
    assert settled and all(counts.get(g, 0) <= q for counts in settled for g, q in quotas.items())
    groups = result.ledger.group_quotas()
    for g, q in quotas.items():
        assert groups[g]["EffectiveQuota"] == pytest.approx(q)


# --- concurrency limits ------------------------------------------------------------------------

def test_xsw_limit_is_never_exceeded(tmp_path: Path) -> None:
    doc = {"config": {"XSW_LIMIT": 3},
           "machines": machines(10),
           "submitters": [{"user": "alice", "jobs": [batch(30, LONG, concurrency_limits="xsw")]},
                          {"user": "bob", "jobs": [batch(30, LONG)]}]}
    _loop, result = run(tmp_path, doc, hours=2)
    evs = list(events(tmp_path))
    peak, _ = running_by(evs, lambda d: "xsw" in d.concurrency_limits.lower())
    assert peak[True] == 3
    rejected = [r for e in evs if e.type == "negotiation.cycle" for r in e.data.rejections.values()]
    assert any(r["reason"] == "concurrency limit xsw reached" for r in rejected)
    assert result.ledger.limits_view()["xsw"]["Max"] == 3
    assert result.ledger.limits_view()["xsw"]["InUse"] <= 3


# --- submitter ceiling and floor ---------------------------------------------------------------

def test_a_ceiling_caps_a_user(tmp_path: Path) -> None:
    doc = {"machines": machines(10),
           "submitters": [{"user": "alice", "jobs": [batch(50, LONG)]},
                          {"user": "bob", "jobs": [batch(4, "3h")]}],
           "actions": [userprio("setceil", "alice@example.org", 3)]}
    _loop, result = run(tmp_path, doc, hours=1.5)
    peak, _ = running_by(list(events(tmp_path)), lambda d: d.submitter)
    assert peak["alice@example.org"] == 3
    assert peak["bob@example.org"] == 4  # the rest of the pool stays free for others


def test_a_below_floor_user_is_served_first(tmp_path: Path) -> None:
    """bob's EUP (factor 1) would win every slot; carol's floor of 4 is served before him."""
    doc = {"machines": machines(6),
           "submitters": [{"user": "bob", "jobs": [batch(50, "2h")]},
                          {"user": "carol", "jobs": [batch(50, "2h")]}],
           "actions": [userprio("setfactor", "bob@example.org", 1.0),
                       userprio("setfloor", "carol@example.org", 4)]}
    _loop, _result = run(tmp_path, doc, hours=0.5)
    first = _matches(list(events(tmp_path)), 1)
    assert [m.submitter for m in first] == ["carol@example.org"] * 4 + ["bob@example.org"] * 2


def test_without_a_floor_the_better_priority_takes_nearly_all(tmp_path: Path) -> None:
    doc = {"machines": machines(6),
           "submitters": [{"user": "bob", "jobs": [batch(50, "2h")]},
                          {"user": "carol", "jobs": [batch(50, "2h")]}],
           "actions": [userprio("setfactor", "bob@example.org", 1.0)]}
    run(tmp_path, doc, hours=0.2)
    first = [m.submitter for m in _matches(list(events(tmp_path)), 1)]
    # carol's EUP is 1000x bob's: her pie slice rounds to nothing, but a submitter with no
    # usage may take one slot past its limit (HTCondor's pie spin)
    assert first == ["bob@example.org"] * 5 + ["carol@example.org"]


# --- nice_user ---------------------------------------------------------------------------------

@pytest.mark.parametrize("alice_jobs,carol_peak", [(100, 0), (4, 6)])
def test_nice_user_gets_only_leftovers(tmp_path: Path, alice_jobs: int, carol_peak: int) -> None:
    doc = {"machines": machines(10),
           "submitters": [{"user": "alice", "jobs": [batch(alice_jobs, "2h")]},
                          {"user": "carol", "nice_user": True, "jobs": [batch(100, "2h")]}]}
    run(tmp_path, doc, hours=1)
    peak, _ = running_by(list(events(tmp_path)), lambda d: d.submitter)
    assert peak.get("nice-user.carol@example.org", 0) == carol_peak
    assert peak["alice@example.org"] == min(alice_jobs, 10)


# --- job priorities ----------------------------------------------------------------------------

def test_an_unmatchable_priority_10_job_does_not_block_priority_9(tmp_path: Path) -> None:
    doc = {"machines": machines(1),
           "submitters": [{"user": "alice", "jobs": [
               batch(1, "1h", priority=10, requirements="TARGET.Memory > 100000000"),
               batch(1, "1h", priority=9)]}]}
    run(tmp_path, doc, hours=0.2)
    evs = list(events(tmp_path))
    started = [e.data for e in evs if e.type == "job.started"]
    prio = {e.data.job_id: e.data.ad["JobPrio"] for e in evs if e.type == "job.submitted"}
    assert [prio[s.job_id] for s in started] == [9]
    cycle1 = next(e.data for e in evs if e.type == "negotiation.cycle")
    assert [r["reason"] for r in cycle1.rejections.values()] == ["no match found"]
