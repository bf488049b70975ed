"""Differential test: today's decisions, recorded before the matchmaker was rebuilt for scale.

`tests/data/negotiator_golden.json` holds the full outcome (every match, dynamic slot,
rejection and per-submitter statistic) of the matchmaker at commit 7f7e9c6 on a few pools
made by `bench/negotiation.py`'s generator (partitionable slots, claimed slots, a regexp()
left to classad2, priority preemption, groups, a slot constraint). The rebuilt matchmaker
must decide exactly the same. `python tests/negotiator/test_golden_matches.py` rewrites the
file; do that only from the reference algorithm.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.negotiation import make_jobs, make_slots
from services.negotiator import (
    CycleInput,
    CycleResult,
    GroupInput,
    NegotiatorConfig,
    SubmitterInput,
    negotiate,
)
from services.negotiator import matchmaker

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "negotiator_golden.json"

#: name -> (seed, slots, jobs, autoclusters, submitters, config, with groups)
CASES: dict[str, tuple[int, int, int, int, int, dict[str, Any], bool]] = {
    "small": (3, 240, 600, 60, 6, {}, False),
    "preempt": (5, 300, 1200, 40, 8, {"preemption_requirements": "True"}, False),
    "wide": (7, 800, 4000, 100, 20, {}, False),
    "groups": (11, 400, 2000, 50, 10, {}, True),
    "constraint": (13, 300, 900, 30, 5, {"negotiator_slot_constraint": 'Arch == "X86_64"',
                                         "negotiator_use_slot_weights": False}, False),
}


def case_input(name: str) -> tuple[CycleInput, NegotiatorConfig]:
    """The cycle input and configuration of golden case `name`."""
    seed, n_slots, n_jobs, n_acs, n_subs, knobs, groups = CASES[name]
    return generated_cycle(seed, n_slots, n_jobs, n_acs, n_subs, groups), NegotiatorConfig(**knobs)


def generated_cycle(seed: int, n_slots: int, n_jobs: int, n_acs: int, n_subs: int,
                    groups: bool) -> CycleInput:
    """A cycle on `bench/negotiation.py`'s generated pool: submitters' EUPs from their
    claimed slots, and with `groups` two groups (30% and 20% of the slots, the first
    accepting surplus) holding two thirds of them."""
    rng = random.Random(seed)
    users = [f"user{u:03d}@example.org" for u in range(n_subs)]
    slots = make_slots(n_slots, rng, users)
    jobs = make_jobs(n_jobs, n_acs, users, rng)
    usage: dict[str, float] = {}
    for s in slots:
        if s.get("State") == "Claimed":
            usage[s["RemoteUser"]] = usage.get(s["RemoteUser"], 0.0) + 1.0
    group_of = {u: (f"group_{'ab'[k % 2]}" if groups and k % 3 else "<none>")
                for k, u in enumerate(users)}
    subs = [SubmitterInput(u, eup=0.5 + 1000.0 * (1 + (k % 17)) * (usage.get(u, 0.0) + 0.5),
                           weighted_usage=usage.get(u, 0.0), group=group_of[u])
            for k, u in enumerate(users)]
    ginputs: list[GroupInput] = []
    if groups:
        for g, quota in (("group_a", n_slots * 0.3), ("group_b", n_slots * 0.2)):
            used = sum(usage.get(u, 0.0) for u in users if group_of[u] == g)
            ginputs.append(GroupInput(g, quota, used, accept_surplus=g == "group_a"))
    return CycleInput(now=1_700_000_000.0, cycle=1, submitters=subs, slots=slots, jobs=jobs,
                      groups=ginputs)


def outcome(result: CycleResult) -> dict[str, Any]:
    """Everything a cycle decided, as JSON-able lists (not the work counters)."""
    return {
        "matches": [[m.job_id, m.schedd, m.submitter, m.group, m.slot, m.reason, m.preempts,
                     m.weight, m.autocluster, m.pslot] for m in result.matches],
        "dynamic_slots": [[d.name, d.pslot, d.job_id, d.cpus, d.memory, d.disk, d.weight,
                           d.pslot_cpus_left, d.pslot_memory_left, d.pslot_disk_left]
                          for d in result.dynamic_slots],
        "rejections": [[r.submitter, r.autocluster, dict(sorted(r.reasons.items())),
                        r.example_job, list(r.jobs)] for r in result.rejections],
        "submitters": {n: [s.matches, s.weight, s.rejections, s.limit, s.usage_end,
                           s.floor_matches] for n, s in sorted(result.submitters.items())},
        "pool_size": result.pool_size,
    }


def _record() -> None:
    data = {name: outcome(negotiate(*case_input(name))) for name in CASES}
    GOLDEN.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_decisions_as_the_reference_matchmaker(name: str) -> None:
    want = json.loads(GOLDEN.read_text())[name]
    got = json.loads(json.dumps(outcome(negotiate(*case_input(name)))))
    assert len(want["matches"]) > 50
    for key in ("matches", "dynamic_slots", "rejections", "submitters", "pool_size"):
        assert got[key] == want[key], key


def test_match_lists_evicted_and_rebuilt_decide_the_same(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """With room for one live match list, every other autocluster's is rebuilt when it is
    next needed (from the slots as they are then): still the same decisions."""
    monkeypatch.setattr(matchmaker, "_REQUEST_BYTES", 1)
    want = json.loads(GOLDEN.read_text())["wide"]
    result = negotiate(*case_input("wide"))
    assert result.counters["autoclusters_evaluated"] > result.counters["autoclusters"]
    got = json.loads(json.dumps(outcome(result)))
    assert got["matches"] == want["matches"] and got["rejections"] == want["rejections"]


@pytest.mark.parametrize("name", ["small", "wide", "groups"])
def test_claimed_slots_pooled_decide_as_one_by_one(name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """When no claimed slot can be preempted, a match list holds them as one class with one
    note (`_Engine._claimed_note`); with that off (a startd RANK could preempt, as far as the
    cycle knows) each is evaluated on its own: the same decisions, insufficient priority and
    PREEMPTION_REQUIREMENTS rejections included."""
    snap, cfg = case_input(name)
    pooled = negotiate(snap, cfg)
    monkeypatch.setattr(matchmaker._Cycle, "_rank_preemption_possible", lambda self: True)
    one_by_one = negotiate(snap, cfg)
    reasons = {r for x in pooled.rejections for r in x.reasons}
    assert {"insufficient priority", "PREEMPTION_REQUIREMENTS == False"} & reasons
    assert json.loads(json.dumps(outcome(pooled))) == json.loads(json.dumps(outcome(one_by_one)))


if __name__ == "__main__":
    _record()
    sys.exit(0)
