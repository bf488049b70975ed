"""Round robin among groups (GROUP_QUOTA_ROUND_ROBIN_RATE, GroupEntry.cpp's allocation loop),
its knobs' older HFS_ spellings, and knob families that never swallow a declared knob."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.knobs import family_member
from schemas.settings import load_settings
from services.negotiator.errors import InvalidInputError
from services.negotiator import CycleInput, GroupInput, NegotiatorConfig, SubmitterInput, negotiate
from services.negotiator.service import negotiator_config
from tests.negotiator.ads import jobs, slot


def _competing(cfg: NegotiatorConfig) -> dict[str, int]:
    """Groups a (quota 6) and b (quota 9), oversubscribing a pool of 10 slots, both with
    more idle jobs than their quotas: they compete for the same slots."""
    subs = [SubmitterInput("a.u@d", 1.0, group="a"), SubmitterInput("b.u@d", 1.0, group="b")]
    snap = CycleInput(now=1_700_000_000.0, cycle=1, submitters=subs,
                      slots=[slot(i) for i in range(10)],
                      jobs={"a.u@d": jobs(1, 20), "b.u@d": jobs(2, 20)},
                      groups=[GroupInput("a", 6.0), GroupInput("b", 9.0)])
    by_sub = negotiate(snap, cfg).count_by_submitter()
    return {"a": by_sub.get("a.u@d", 0), "b": by_sub.get("b.u@d", 0)}


def test_without_round_robin_the_first_group_in_starvation_order_takes_its_whole_quota() -> None:
    # both at usage 0: starvation order by name, a first; a takes its 6, b the 4 left
    assert _competing(NegotiatorConfig(negotiator_use_slot_weights=False)) == {"a": 6, "b": 4}


def test_round_robin_rate_1_shares_the_slots_by_the_rounds_arithmetic() -> None:
    # GroupEntry.cpp: maxdelta = max(6 - 0, 9 - 0) = 9; step n (1, 2, ...) lets a reach
    # floor(6n/9) and b floor(9n/9) = n:  n=1: a 0 b 1; n=2: a 1 b 2; n=3: a 2 b 3;
    # n=4: a 2 b 4; n=5: a 3 b 5; n=6: a 4 b 6 -- the pool's 10 slots are gone.
    cfg = NegotiatorConfig(negotiator_use_slot_weights=False, group_quota_round_robin_rate=1.0)
    assert _competing(cfg) == {"a": 4, "b": 6}
    # a rate of 3: n=3: a 2 b 3; n=6: a 4 b 6 -- the same split in two steps
    cfg = NegotiatorConfig(negotiator_use_slot_weights=False, group_quota_round_robin_rate=3.0)
    assert _competing(cfg) == {"a": 4, "b": 6}
    # a rate of 5: n=5: a 3 b 5; n=9 (capped at maxdelta): whole limits, a first takes 2 more
    cfg = NegotiatorConfig(negotiator_use_slot_weights=False, group_quota_round_robin_rate=5.0)
    assert _competing(cfg) == {"a": 5, "b": 5}


def test_round_robin_rate_is_at_least_1() -> None:
    with pytest.raises(InvalidInputError, match="GROUP_QUOTA_ROUND_ROBIN_RATE"):
        NegotiatorConfig.from_knobs({"GROUP_QUOTA_ROUND_ROBIN_RATE": "0.5"})


def test_group_quota_family_never_swallows_a_declared_knob(tmp_path: Path) -> None:
    cfg = tmp_path / "condor_config"
    cfg.write_text("GROUP_NAMES = physics, ROUND_ROBIN_RATE\nGROUP_QUOTA_physics = 5\n"
                   "GROUP_QUOTA_ROUND_ROBIN_RATE = 2\nGROUP_QUOTA_MAX_ALLOCATION_ROUNDS = 4\n")
    s = load_settings(str(cfg), env={})
    assert family_member("GROUP_QUOTA_<group>", "GROUP_QUOTA_ROUND_ROBIN_RATE") is None
    assert family_member("GROUP_QUOTA_<group>", "GROUP_QUOTA_physics") == "physics"
    assert s.family("GROUP_QUOTA_<group>") == {"physics": 5.0}
    assert s.group_quota("ROUND_ROBIN_RATE") is None and s.group_quota("physics") == 5.0
    assert s.get("GROUP_QUOTA_ROUND_ROBIN_RATE") == 2.0
    nc = negotiator_config(s)
    assert nc.group_quota_round_robin_rate == 2.0 and nc.group_quota_max_allocation_rounds == 4


def test_older_hfs_spellings_are_read_when_the_new_names_are_unset(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.write_text("HFS_ROUND_ROBIN_RATE = 3\nHFS_MAX_ALLOCATION_ROUNDS = 5\n")
    nc = negotiator_config(load_settings(str(old), env={}))
    assert nc.group_quota_round_robin_rate == 3.0 and nc.group_quota_max_allocation_rounds == 5
    both = tmp_path / "both"
    both.write_text("HFS_ROUND_ROBIN_RATE = 3\nHFS_MAX_ALLOCATION_ROUNDS = 5\n"
                    "GROUP_QUOTA_ROUND_ROBIN_RATE = 7\nGROUP_QUOTA_MAX_ALLOCATION_ROUNDS = 2\n")
    nc = negotiator_config(load_settings(str(both), env={}))
    assert nc.group_quota_round_robin_rate == 7.0 and nc.group_quota_max_allocation_rounds == 2
    unset = negotiator_config(load_settings(env={}))
    assert unset.group_quota_round_robin_rate is None and unset.group_quota_max_allocation_rounds == 3
    assert NegotiatorConfig.from_knobs({"HFS_ROUND_ROBIN_RATE": "4"}).group_quota_round_robin_rate == 4.0
