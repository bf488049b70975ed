"""The accountant fold against seed 000 ("User Priorities and Negotiation") and REFERENCE.md."""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import (
    AdminCommanded, ConfigChanged, Envelope, JobStarted, JobStopped, NegotiationCycled, Payload,
    PriorityChanged, make_event,
)
from streams.core.accountant import (
    AccountantConfig, AccountantConfigError, AccountantState, apply, default_factor, fold,
    priority_at, view,
)
from streams.core.errors import CoreError, EventRejectedError
from streams.core.groups import GroupTree
from streams.core.userprio_ops import AdminCommandError, describe_admin, validate_admin

DAY = 86400.0
_seq = itertools.count(1)


def ev(payload: Payload, ts: float) -> Envelope:
    return make_event(payload, ts=ts, source="test", seq=next(_seq))


def start(sub: str, slot: str, ts: float, weight: float = 1.0, job: str | None = None) -> Envelope:
    return ev(JobStarted(job_id=job or f"job-{slot}", schedd="schedd@ap", submitter=sub, slot=slot,
                         slot_weight=weight), ts)


def stop(slot: str, ts: float, job: str | None = None) -> Envelope:
    return ev(JobStopped(job_id=job or f"job-{slot}", slot=slot, reason="completed"), ts)


def cycle(ts: float) -> Envelope:
    return ev(NegotiationCycled(negotiator="neg", cycle=0, now=ts), ts)


def admin(op: str, target: str, ts: float, value: float | str | None = None,
          duration: float | None = None) -> Envelope:
    return ev(AdminCommanded(op=op, target=target, value=value, duration=duration), ts)  # type: ignore[arg-type]


def run(events: Sequence[Envelope], cfg: AccountantConfig | None = None,
        state: AccountantState | None = None) -> tuple[AccountantState, list[Payload]]:
    state = state if state is not None else AccountantState()
    cfg = cfg or AccountantConfig()
    out: list[Payload] = []
    for e in events:
        cfg, derived = fold(state, e, cfg)
        out.extend(derived)
    return state, out


def pie_shares(eups: Sequence[float]) -> list[float]:
    """Seed/REFERENCE pie spin: share_i = (1/EUP_i) / sum_j (1/EUP_j)."""
    inv = [1.0 / e for e in eups]
    return [i / sum(inv) for i in inv]


ALICE = "alice@example.org"
BOB = "bob@example.org"
HTC = AccountantConfig(mode="htcondor")


# --- RUP basics (seed 000) ----------------------------------------------------------------

def test_rup_starts_at_half_and_never_goes_below() -> None:
    state, _ = run([start(ALICE, "s1", 0.0), stop("s1", 10.0)])
    rec = state.customers[ALICE]
    assert rec.priority >= 0.5
    assert priority_at(state, ALICE, 10.0, AccountantConfig()) == pytest.approx(0.5, abs=1e-3)
    assert priority_at(state, ALICE, 100 * DAY, AccountantConfig()) == 0.5
    assert priority_at(state, "nobody@example.org", 0.0, AccountantConfig()) == 0.5
    fresh, _ = run([admin("setfactor", BOB, 0.0, 2)])
    assert fresh.customers[BOB].priority == 0.5
    clamped, _ = run([admin("setprio", BOB, 0.0, 0.1)])
    assert clamped.customers[BOB].priority == 0.5
    # a weight below 0.5 pulls toward 0.2 but the floor holds
    low, _ = run([start(BOB, "s1", 0.0, weight=0.2), stop("s1", 10 * DAY)])
    assert low.customers[BOB].priority == 0.5


@pytest.mark.parametrize("mode", ["exact", "htcondor"])
def test_100_cores_for_48h_from_half_gives_about_75(mode: str) -> None:
    cfg = AccountantConfig(mode=mode)  # type: ignore[arg-type]
    events = [cycle(0.0)] + [start(ALICE, f"slot{i}", 0.0) for i in range(100)]
    if mode == "htcondor":
        events += [cycle(t) for t in range(3600, int(2 * DAY) + 1, 3600)]
    state, _ = run(events, cfg)
    expected = 0.25 * 0.5 + 0.75 * 100  # beta = 0.5^(48h/24h) = 0.25
    assert expected == 75.125
    got = priority_at(state, ALICE, 2 * DAY, cfg)
    assert got == pytest.approx(expected, rel=1e-9)
    assert got == pytest.approx(75.0, rel=0.01)
    assert view(state, 2 * DAY, cfg)[ALICE]["AccumulatedUsage"] == pytest.approx(100 * 2 * DAY)


@pytest.mark.parametrize("mode", ["exact", "htcondor"])
def test_idle_rup_of_10_halves_each_day(mode: str) -> None:
    cfg = AccountantConfig(mode=mode)  # type: ignore[arg-type]
    state, _ = run([cycle(0.0), admin("setprio", ALICE, 0.0, 10)], cfg)
    if mode == "exact":
        assert priority_at(state, ALICE, DAY, cfg) == pytest.approx(5.0)
        assert priority_at(state, ALICE, 2 * DAY, cfg) == pytest.approx(2.5)
    else:
        run([cycle(DAY)], cfg, state)
        assert state.customers[ALICE].priority == pytest.approx(5.0)
        run([cycle(2 * DAY)], cfg, state)
        assert state.customers[ALICE].priority == pytest.approx(2.5)


def test_steady_usage_equilibrates_to_cores_used() -> None:
    state, _ = run([start(ALICE, f"s{i}", 0.0) for i in range(10)])
    assert priority_at(state, ALICE, 30 * DAY, AccountantConfig()) == pytest.approx(10.0, rel=1e-6)


def test_pie_shares_follow_inverse_eup() -> None:
    a, b, c = pie_shares([5.0, 10.0, 20.0])
    assert a / c == pytest.approx(4.0) and b / c == pytest.approx(2.0)
    assert a + b + c == pytest.approx(1.0)


def test_eup_is_rup_times_factor() -> None:
    state, _ = run([admin("setprio", ALICE, 0.0, 10), admin("setfactor", ALICE, 0.0, 2000)])
    v = view(state, 0.0, AccountantConfig())[ALICE]
    assert v["EffectivePriority"] == pytest.approx(20000.0)
    assert v["PriorityFactor"] == 2000.0


# --- exact mode: cadence independence -------------------------------------------------------

_ops = st.lists(st.tuples(st.floats(1.0, 2 * DAY), st.sampled_from(["start", "stop", "split"]),
                          st.integers(0, 4), st.sampled_from([0.5, 1.0, 2.0, 8.0])),
                min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_exact_mode_is_cadence_independent(ops: list[tuple[float, str, int, float]]) -> None:
    cfg = AccountantConfig(groups=GroupTree.from_names("g"))
    subs = [ALICE, "g.bob@example.org"]
    events: list[Envelope] = [start(ALICE, "boot", 0.0)]
    running: dict[str, bool] = {}
    for t, kind, slot_no, w in sorted(ops):
        slot = f"slot{slot_no}"
        if kind == "start":
            events.append(start(subs[slot_no % 2], slot, t, w))
            running[slot] = True
        elif kind == "stop" and running.get(slot):
            events.append(stop(slot, t))
            running[slot] = False
        elif kind == "split":  # an event that only integrates everyone, changing nothing
            events.append(ev(ConfigChanged(knob="PRIORITY_HALFLIFE", value="86400"), t))
    plain = [e for e in events if e.type != "config.changed"]
    end = 3 * DAY
    a = view(run(events, cfg)[0], end, cfg)
    b = view(run(plain, cfg)[0], end, cfg)
    assert a.keys() == b.keys()
    for name in a:
        for attr in ("Priority", "AccumulatedUsage", "WeightedAccumulatedUsage", "BeginUsageTime",
                     "LastUsageTime", "ResourcesUsed", "WeightedResourcesUsed"):
            assert a[name][attr] == pytest.approx(b[name][attr], rel=1e-9, abs=1e-9), (name, attr)


def test_view_does_not_mutate() -> None:
    state, _ = run([start(ALICE, "s1", 0.0, 4.0)])
    before = state.to_json()
    view(state, DAY, AccountantConfig())
    priority_at(state, ALICE, DAY, AccountantConfig())
    assert state.to_json() == before


# --- htcondor mode: UpdatePriorities step by step -------------------------------------------

def test_htcondor_update_priorities_by_hand() -> None:
    h = 1000.0
    cfg = AccountantConfig(mode="htcondor", priority_halflife=h)
    state, _ = run([cycle(0.0), start(ALICE, "s1", 100.0, weight=2.0)], cfg)
    rec = state.customers[ALICE]
    assert (rec.uncharged_time, rec.weighted_uncharged_time) == (-100.0, -200.0)
    assert rec.priority == 0.5  # nothing moves between cycles
    run([cycle(400.0)], cfg, state)
    a1 = 0.5 ** (400 / h)
    r1 = 2.0 + (-200.0) / 400  # WeightedResourcesUsed + WeightedUnchargedTime / D = 1.5
    p1 = max(0.5, 0.5 * a1 + r1 * (1 - a1))
    assert rec.priority == pytest.approx(p1, rel=1e-12)
    assert rec.accumulated_usage == 1 * 400 - 100 == 300
    assert rec.weighted_accumulated_usage == 2 * 400 - 200 == 600
    assert (rec.begin_usage_time, rec.last_usage_time, rec.uncharged_time) == (400.0, 400.0, 0.0)
    run([stop("s1", 500.0)], cfg, state)
    assert (rec.uncharged_time, rec.weighted_uncharged_time) == (100.0, 200.0)  # 500 - max(100, 400)
    run([cycle(700.0)], cfg, state)
    a2 = 0.5 ** (300 / h)
    p2 = max(0.5, p1 * a2 + (200.0 / 300) * (1 - a2))
    assert rec.priority == pytest.approx(p2, rel=1e-12)
    assert (rec.accumulated_usage, rec.weighted_accumulated_usage) == (400.0, 800.0)
    assert rec.last_usage_time == 700.0 and rec.begin_usage_time == 400.0
    run([cycle(1700.0)], cfg, state)
    assert rec.priority == pytest.approx(max(0.5, p2 * 0.5))
    assert rec.last_usage_time == 700.0  # no recent usage


def test_htcondor_mode_matches_exact_for_whole_cycles() -> None:
    exact = AccountantConfig()
    s1, _ = run([cycle(0.0), start(ALICE, "a", 0.0, 3.0), cycle(5000.0), stop("a", 9000.0),
                 cycle(9000.0)], exact)
    s2, _ = run([cycle(0.0), start(ALICE, "a", 0.0, 3.0), cycle(5000.0), stop("a", 9000.0),
                 cycle(9000.0)], HTC)
    assert s2.customers[ALICE].priority == pytest.approx(priority_at(s1, ALICE, 9000.0, exact))


# --- slot weights ---------------------------------------------------------------------------

def test_slot_weight_charges_weighted_usage() -> None:
    state, _ = run([start(ALICE, "big", 0.0, 8.0), start(BOB, "small", 0.0, 1.0),
                    start(BOB, "neg", 0.0, -3.0)])
    a, b = state.customers[ALICE], state.customers[BOB]
    assert (a.resources_used, a.weighted_resources_used) == (1, 8.0)
    assert (b.resources_used, b.weighted_resources_used) == (2, 2.0)  # a negative weight counts 1
    assert priority_at(state, ALICE, 20 * DAY, AccountantConfig()) == pytest.approx(8.0, rel=1e-5)
    v = view(state, 3600.0, AccountantConfig())[ALICE]
    assert v["WeightedAccumulatedUsage"] == 8 * 3600 and v["AccumulatedUsage"] == 3600


def test_without_slot_weights_every_slot_counts_one() -> None:
    cfg = AccountantConfig(use_slot_weights=False)
    state, _ = run([start(ALICE, "big", 0.0, 8.0)], cfg)
    assert state.customers[ALICE].weighted_resources_used == 1.0
    state2, _ = run([ev(ConfigChanged(knob="NEGOTIATOR_USE_SLOT_WEIGHTS", value="false"), 0.0),
                     start(ALICE, "big", 1.0, 8.0), stop("big", 2.0)])
    assert state2.customers[ALICE].weighted_accumulated_usage == 1.0


# --- groups ---------------------------------------------------------------------------------

GROUPS = AccountantConfig(groups=GroupTree.from_names("group_physics, group_physics.hep, group_chemistry"))


def test_group_and_hierarchical_usage() -> None:
    state, _ = run([start("group_physics.hep.higgs@example.org", "s1", 0.0, 2.0),
                    start("group_physics.einstein@example.org", "s2", 0.0, 1.0),
                    start("GROUP_PHYSICS.HEP.bob@example.org", "s4", 0.0, 4.0),
                    start(ALICE, "s3", 0.0, 3.0)], GROUPS)
    c = state.customers
    hep, phys, none = c["group_physics.hep"], c["group_physics"], c["<none>"]
    assert (hep.resources_used, hep.weighted_resources_used, hep.hier_weighted_resources_used) == (2, 6.0, 6.0)
    assert (phys.resources_used, phys.weighted_resources_used, phys.hier_weighted_resources_used) == (1, 1.0, 7.0)
    assert (none.resources_used, none.weighted_resources_used, none.hier_weighted_resources_used) == (1, 3.0, 10.0)
    assert hep.is_group and not c[ALICE].is_group
    assert state.resources["s1"].group == "group_physics.hep"
    # groups decay toward their subtree's usage
    assert priority_at(state, "group_physics", 30 * DAY, GROUPS) == pytest.approx(7.0, rel=1e-6)
    assert priority_at(state, "<none>", 30 * DAY, GROUPS) == pytest.approx(10.0, rel=1e-6)
    v = view(state, 0.0, GROUPS)
    assert v["group_physics.einstein@example.org"]["AccountingGroup"] == "group_physics"
    assert v["group_physics"]["HierWeightedResourcesUsed"] == 7.0
    run([stop("s1", DAY), stop("s2", DAY), stop("s3", DAY), stop("s4", DAY)], GROUPS, state)
    for g in (hep, phys, none):
        assert (g.resources_used, g.weighted_resources_used, g.hier_weighted_resources_used) == (0, 0.0, 0.0)
    assert phys.weighted_accumulated_usage == pytest.approx(1.0 * DAY)


def test_undefined_group_goes_to_none() -> None:
    state, _ = run([start("group_bio.darwin@example.org", "s1", 0.0)], GROUPS)
    assert state.customers["<none>"].resources_used == 1
    assert "group_bio" not in state.customers


# --- default priority factors ---------------------------------------------------------------

def test_default_factor_rules() -> None:
    cfg = AccountantConfig(groups=GroupTree.from_names("group_physics"),
                           group_prio_factors={"group_physics": 50.0},
                           accountant_local_domain="example.org")
    assert default_factor("nice-user.bob@example.org", cfg) == 1e10
    assert default_factor("group_physics.x@example.org", cfg) == 50.0
    assert default_factor("group_physics", cfg, is_group=True) == 50.0
    assert default_factor("bob@other.org", cfg) == 1e7
    assert default_factor(ALICE, cfg) == 1000.0
    assert default_factor("<none>", cfg, is_group=True) == 1000.0
    assert default_factor("bob@other.org", AccountantConfig()) == 1000.0  # no local domain: all local
    zero = AccountantConfig(groups=cfg.groups, group_prio_factors={"group_physics": 0.0})
    assert default_factor("group_physics.x@example.org", zero) == 1000.0  # 0 means unset


def test_factor_is_written_into_the_record_at_creation() -> None:
    state, _ = run([start("nice-user.bob@example.org", "s1", 0.0), start(ALICE, "s2", 0.0),
                    ev(ConfigChanged(knob="DEFAULT_PRIO_FACTOR", value="5"), 1.0),
                    start("carol@example.org", "s3", 2.0), start(ALICE, "s4", 3.0)])
    assert state.customers["nice-user.bob@example.org"].factor == 1e10
    assert state.customers[ALICE].factor == 1000.0
    assert state.customers["carol@example.org"].factor == 5.0


def test_from_settings_and_with_knob() -> None:
    class Settings:
        values = {"PRIORITY_HALFLIFE": 3600.0, "GROUP_NAMES": ["a", "a.b"], "GROUP_PRIO_FACTOR_a": 7.0,
                  "NEGOTIATOR_USE_SLOT_WEIGHTS": False, "POOLLEDGER_ACCOUNTING_MODE": "htcondor",
                  "ACCOUNTANT_LOCAL_DOMAIN": "example.org"}

        def get(self, knob: str) -> Any:
            return self.values.get(knob)

    cfg = AccountantConfig.from_settings(Settings())
    assert cfg.priority_halflife == 3600.0 and cfg.mode == "htcondor" and not cfg.use_slot_weights
    assert cfg.groups.names == ("a", "a.b") and cfg.group_prio_factors == {"a": 7.0}
    assert cfg.accountant_local_domain == "example.org"
    class Empty:
        def get(self, knob: str) -> Any:
            return None

    assert AccountantConfig.from_settings(Empty()) == AccountantConfig()
    assert cfg.with_knob("priority_halflife", "").priority_halflife == 86400.0
    assert cfg.with_knob("UNRELATED", "x") is cfg
    with pytest.raises(AccountantConfigError):
        cfg.with_knob("PRIORITY_HALFLIFE", "soon")
    with pytest.raises(CoreError):
        cfg.with_knob("POOLLEDGER_ACCOUNTING_MODE", "fuzzy")


def test_halflife_change_applies_from_its_event_time() -> None:
    state, _ = run([admin("setprio", ALICE, 0.0, 16),
                    ev(ConfigChanged(knob="PRIORITY_HALFLIFE", value=str(DAY / 2)), DAY)])
    cfg = AccountantConfig(priority_halflife=DAY / 2)
    assert state.customers[ALICE].priority == pytest.approx(8.0)  # one old half-life
    assert priority_at(state, ALICE, 2 * DAY, cfg) == pytest.approx(2.0)  # two new ones
    # a bad value in the log keeps the old config
    cfg2, out = fold(state, ev(ConfigChanged(knob="PRIORITY_HALFLIFE", value="x"), 2 * DAY), cfg)
    assert cfg2 is cfg


# --- admin edits ----------------------------------------------------------------------------

def test_every_admin_edit() -> None:
    cfg = AccountantConfig()
    state, out = run([start(ALICE, "s1", 0.0, 2.0), stop("s1", 1000.0)])
    rec = state.customers[ALICE]
    _, out = run([admin("setfactor", ALICE, 1000.0, 2500)], cfg, state)
    assert rec.factor == 2500.0
    pc = out[-1]
    assert isinstance(pc, PriorityChanged) and pc.old_factor == 1000.0 and pc.factor == 2500.0
    assert pc.effective_priority == pytest.approx(rec.priority * 2500.0)
    run([admin("setprio", ALICE, 1000.0, 42)], cfg, state)
    assert rec.priority == 42.0
    run([admin("setaccum", ALICE, 1000.0, 123.5)], cfg, state)
    assert rec.weighted_accumulated_usage == 123.5 and rec.accumulated_usage == 1000.0
    run([admin("setbegin", ALICE, 1000.0, 77), admin("setlast", ALICE, 1000.0, "88")], cfg, state)
    assert (rec.begin_usage_time, rec.last_usage_time) == (77.0, 88.0)
    run([admin("resetusage", ALICE, 2000.0)], cfg, state)
    assert (rec.accumulated_usage, rec.weighted_accumulated_usage, rec.begin_usage_time) == (0.0, 0.0, 2000.0)
    assert rec.priority == pytest.approx(42.0 * 0.5 ** (1000 / DAY))  # resetusage keeps the priority
    run([admin("setceil", ALICE, 2000.0, 10.7), admin("setfloor", ALICE, 2000.0, 3)], cfg, state)
    assert (rec.ceiling, rec.floor) == (10.0, 3.0)
    run([admin("setceil", ALICE, 2000.0, -0.5)], cfg, state)
    assert rec.ceiling == -1.0
    run([start(BOB, "s2", 2000.0), admin("resetall", "", 3000.0)], cfg, state)
    bob = state.customers[BOB]
    assert bob.accumulated_usage == 0.0 and bob.begin_usage_time == 3000.0
    assert state.customers["<none>"].accumulated_usage == 0.0
    _, out = run([admin("delete", ALICE, 3000.0)], cfg, state)
    assert ALICE not in state.customers
    assert isinstance(out[0], PriorityChanged) and out[0].priority == 0.5 and out[0].old_priority
    # deleting a submitter with a running claim keeps the live usage charged
    run([admin("setfactor", BOB, 3000.0, 9), admin("delete", BOB, 3000.0)], cfg, state)
    bob = state.customers[BOB]
    assert (bob.factor, bob.resources_used, bob.weighted_resources_used) == (1000.0, 1, 1.0)
    run([stop("s2", 4000.0)], cfg, state)
    assert state.customers[BOB].resources_used == 0
    assert run([admin("delete", "ghost@example.org", 0.0)])[1] == []


def test_derived_events_carry_cause_and_old_values() -> None:
    state = AccountantState()
    e = start(ALICE, "s1", 0.0)
    out = apply(state, e, AccountantConfig())
    assert {p.name for p in out if isinstance(p, PriorityChanged)} == {ALICE, "<none>"}
    assert all(isinstance(p, PriorityChanged) and p.cause == e.id and p.old_priority is None for p in out)
    e2 = stop("s1", DAY)
    out2 = apply(state, e2, AccountantConfig())
    mine = [p for p in out2 if isinstance(p, PriorityChanged) and p.name == ALICE][0]
    assert mine.cause == e2.id and mine.old_priority == 0.5 and mine.priority == pytest.approx(0.75)
    assert mine.resources_used == 0.0


def test_group_targets_for_factor_ceiling_floor() -> None:
    state, _ = run([admin("setceil", "GROUP_PHYSICS", 0.0, 5), admin("setfactor", "<none>", 0.0, 3)], GROUPS)
    assert state.customers["group_physics"].ceiling == 5.0 and state.customers["group_physics"].is_group
    assert state.customers["<none>"].factor == 3.0


def test_stale_stop_and_restart_on_busy_slot() -> None:
    state, _ = run([start(ALICE, "s1", 0.0, job="1.0"), start(BOB, "s1", 10.0, job="2.0")])
    assert state.customers[ALICE].resources_used == 0 and state.customers[BOB].resources_used == 1
    _, out = run([stop("s1", 20.0, job="1.0")], state=state)
    assert out == [] and state.customers[BOB].resources_used == 1
    assert run([stop("nowhere", 1.0)])[1] == []


# --- validation -----------------------------------------------------------------------------

FULL = "condor_userprio: You must specify the full name of the submittor you wish\n"


@pytest.mark.parametrize(("op", "target", "value", "duration", "message"), [
    ("setprio", "alice", 5, None, FULL + "\tto update the priority of (user@uid.domain or user@full.host.name)"),
    ("resetusage", "alice", None, None, FULL + "\tto update the priority of (user@uid.domain or user@full.host.name)"),
    ("setaccum", "alice", 5, None, FULL + "\tto update the Accumulated usage of (user@uid.domain or user@full.host.name)"),
    ("setbegin", "alice", 5, None, FULL + "\tto update the begin usage time of (user@uid.domain or user@full.host.name)"),
    ("setlast", "alice", 5, None, FULL + "\tto update the last usage time of (user@uid.domain or user@full.host.name)"),
    ("delete", "alice", None, None, "condor_userprio: You must specify the full name of the record you wish\n"
                                    "\tto delete (user@uid.domain or user@full.host.name)"),
    ("setfactor", ALICE, 0.5, None, "Priority factors must be greater than or equal to 1."),
    ("setfloor", ALICE, -1, None, "floor must be greater than or equal to 0."),
    ("setceil", ALICE, -2, None, "ceiling must be greater than or equal to -1."),
    ("setaccum", ALICE, -1, None, "Usage must be greater than 0 seconds"),
    ("setbegin", ALICE, -5, None, "Time must be greater than 0 seconds"),
    ("setlast", ALICE, -5, None, "Time must be greater than 0 seconds"),
    ("setprio", ALICE, "lots", None, "condor_userprio: -setprio needs a number, not 'lots'"),
    ("setprio", ALICE, None, None, "condor_userprio: -setprio needs a number, not None"),
    ("setfactor", "group_bio", 2, None, "condor_userprio: You must specify the full name of the "
                                        "submittor you wish\n\tto update the priority of "
                                        "(user@uid.domain or user@full.host.name)"),
    ("setprio", ALICE, 3, 60.0, "condor_userprio: -duration applies only to -setceiling, -setfloor and -setfactor"),
    ("setceil", ALICE, 3, 0.0, "condor_userprio: -duration requires a positive integer number of seconds"),
    ("cancelceillease", ALICE, None, None, f"negotiator rejected cancel: no ceiling lease in effect for {ALICE}"),
    ("cancelfloorlease", ALICE, None, None, f"negotiator rejected cancel: no floor lease in effect for {ALICE}"),
    ("cancelfactorlease", "group_physics", None, None,
     "negotiator rejected cancel: no priority-factor lease in effect for group_physics"),
    ("bogus", ALICE, None, None, "condor_userprio: unknown operation 'bogus'"),
])
def test_validation_messages(op: str, target: str, value: Any, duration: float | None, message: str) -> None:
    state = AccountantState()
    with pytest.raises(AdminCommandError) as exc:
        validate_admin(op, target, value, duration, state, GROUPS)
    assert str(exc.value) == message
    assert isinstance(exc.value, CoreError)
    # the same edit arriving through the log is rejected with that reason and changes nothing
    run([start(ALICE, "s1", 0.0)], GROUPS, state)
    before = state.to_json()
    with pytest.raises(EventRejectedError) as rejected:
        apply(state, admin(op, target, 5.0, value, duration), GROUPS)
    assert message in rejected.value.reason
    assert state.to_json() == before


def test_valid_edits_pass_and_floor_ceiling_bounds() -> None:
    s = AccountantState()
    for op, value in (("setfactor", 1), ("setfloor", 0), ("setceil", -1), ("setaccum", 0), ("setprio", "2.5")):
        validate_admin(op, ALICE, value, None, s, GROUPS)
    validate_admin("resetall", "", None, None, s, GROUPS)
    validate_admin("setceil", "<none>", 3, 10.0, s, GROUPS)


def test_describe_admin_messages() -> None:
    assert describe_admin("setfactor", ALICE, 2) == f"The priority factor of {ALICE} was set to 2.000000"
    assert describe_admin("setprio", ALICE, "3") == f"The priority of {ALICE} was set to 3.000000"
    assert describe_admin("setceil", ALICE, 10.9) == f"The ceiling of {ALICE} was set to 10"
    assert describe_admin("setfloor", ALICE, 2, 3600) == f"Set floor lease on {ALICE} to 2 for 3600 seconds"
    assert describe_admin("setaccum", ALICE, 5) == f"The Accumulated Usage of {ALICE} was set to 5.000000"
    assert describe_admin("setbegin", ALICE, 7) == f"The Begin Usage Time of {ALICE} was set to 7"
    assert describe_admin("setlast", ALICE, 8) == f"The Last Usage Time of {ALICE} was set to 8"
    assert describe_admin("resetusage", ALICE, None) == f"The accumulated usage of {ALICE} was reset"
    assert describe_admin("resetall", "", None) == "The accumulated usage was reset for all users"
    assert describe_admin("delete", ALICE, None) == f"The accountant record named {ALICE} was deleted"
    assert describe_admin("cancelceillease", ALICE, None) == f"Cancelled ceiling lease for {ALICE}"


# --- leases ---------------------------------------------------------------------------------

def test_ceiling_lease_lifecycle() -> None:
    cfg = AccountantConfig()
    state, _ = run([admin("setceil", ALICE, 1000.0, 4), admin("setceil", ALICE, 1000.0, 10, duration=3600)])
    rec = state.customers[ALICE]
    assert rec.ceiling == 10.0 and rec.leases["ceiling"].pre_lease_value == 4.0
    assert view(state, 1000.0, cfg)[ALICE]["Leases"] == {"ceiling": {"PreLeaseValue": 4.0, "Expires": 4600.0}}
    with pytest.raises(AdminCommandError, match=r"^negotiator rejected ceiling lease: ceiling lease for "
                                                r"alice@example.org is already in effect \(expires at 4600\)$"):
        validate_admin("setceil", ALICE, 20, 60.0, state, cfg)
    with pytest.raises(EventRejectedError, match="already in effect"):
        run([admin("setceil", ALICE, 1100.0, 20, duration=60)], cfg, state)
    assert rec.ceiling == 10.0
    run([cycle(4599.0)], cfg, state)
    assert rec.ceiling == 10.0
    run([cycle(4600.0)], cfg, state)  # expiry at cycle start restores the PreLeaseValue
    assert rec.ceiling == 4.0 and rec.leases == {}
    with pytest.raises(AdminCommandError, match="no ceiling lease in effect for alice@example.org"):
        validate_admin("cancelceillease", ALICE, None, None, state, cfg)


def test_factor_and_floor_leases_cancel_and_override() -> None:
    cfg = AccountantConfig()
    state, out = run([start(ALICE, "s1", 0.0), admin("setfactor", ALICE, 10.0, 5, duration=100)])
    rec = state.customers[ALICE]
    assert rec.factor == 5.0
    _, out = run([admin("cancelfactorlease", ALICE, 20.0)], cfg, state)
    assert rec.factor == 1000.0 and "factor" not in rec.leases
    assert any(isinstance(p, PriorityChanged) and p.factor == 1000.0 and p.old_factor == 5.0 for p in out)
    run([admin("setfloor", ALICE, 30.0, 2, duration=50), admin("setfloor", ALICE, 40.0, 7)], cfg, state)
    assert rec.floor == 7.0 and rec.leases == {}  # a plain set ends the lease: the admin's value wins
    run([admin("setfactor", ALICE, 50.0, 9, duration=10), cycle(60.0)], cfg, state)
    assert rec.factor == 1000.0


# --- serialization --------------------------------------------------------------------------

def test_json_roundtrip_is_canonical_and_resumable() -> None:
    events = [start("group_physics.hep.higgs@example.org", "s1", 0.0, 2.0), start(ALICE, "s2", 5.0, 0.3),
              admin("setceil", ALICE, 6.0, 3, duration=1000), admin("setfactor", "group_physics", 7.0, 4)]
    state, _ = run(events, GROUPS)
    text = state.to_json()
    again = AccountantState.from_json(text)
    assert again.to_json() == text
    assert again == state
    assert text.index('"Accountant"') < text.index('"Customers"') < text.index('"Resources"')
    tail = [stop("s1", DAY), cycle(2 * DAY)]
    a, _ = run(tail, GROUPS, state)
    b, _ = run(tail, GROUPS, AccountantState.from_json(text.encode()))
    assert a.to_json() == b.to_json()
    assert math.isfinite(a.customers[ALICE].priority)


def test_from_real_settings() -> None:
    settings_mod = pytest.importorskip("schemas.settings")
    s = settings_mod.load_settings(config_path=[], env={}, overrides={
        "GROUP_NAMES": "a, a.b", "GROUP_PRIO_FACTOR_a": "7", "PRIORITY_HALFLIFE": "3600"})
    cfg = AccountantConfig.from_settings(s)
    assert cfg.groups.names == ("a", "a.b") and cfg.group_prio_factors == {"a": 7.0}
    assert cfg.priority_halflife == 3600.0 and cfg.mode == "exact"
    assert AccountantConfig.from_settings(settings_mod.load_settings(config_path=[], env={})) == AccountantConfig()
