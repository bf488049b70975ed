"""NEGOTIATOR_MAX_TIME_PER_SUBMITTER / _SCHEDD / _PIESPIN / _CYCLE with an injected clock.

The fake clock advances a fixed step on every reading, so each scenario is deterministic.
With step 1 the matchmaker reads the clock at cycle start (t=0), at each spin start and three
times per job tried (the limit check, then the two readings whose difference, 1 s, is charged
to the submitter and to the job's schedd).
"""
from __future__ import annotations

import inspect
import time
from typing import Any

import pytest

from schemas.events import NegotiationCycled
from services.negotiator import (
    CycleInput,
    CycleResult,
    NegotiatorConfig,
    SubmitterInput,
    negotiate,
)
from services.negotiator import service
from services.negotiator.service import Offer, cycle_payloads, run_cycle
from tests.negotiator.ads import job, jobs, slot

SUB_TIME = "submitter time limit exceeded"
SCHEDD_TIME = "schedd time limit exceeded"
CYCLE_TIME = "cycle time limit reached"


class FakeClock:
    """Returns 0, step, 2*step, ... on successive calls."""

    def __init__(self, step: float = 1.0) -> None:
        self.t, self.step, self.calls = 0.0, step, 0

    def __call__(self) -> float:
        now = self.t
        self.t += self.step
        self.calls += 1
        return now


def cycle(subs: list[SubmitterInput], n_slots: int,
          idle: dict[str, list[dict[str, Any]]]) -> CycleInput:
    return CycleInput(now=1_700_000_000.0, cycle=3, submitters=subs,
                      slots=[slot(i) for i in range(n_slots)], jobs=idle)


def run(snap: CycleInput, cfg: NegotiatorConfig, step: float = 1.0) -> CycleResult:
    """Both evaluation paths, each with a fresh fake clock; they must agree."""
    fast = negotiate(snap, cfg, FakeClock(step))
    slow = negotiate(snap, NegotiatorConfig(**{**cfg.__dict__, "fast_path": False}),
                     FakeClock(step))
    assert fast.matches == slow.matches
    assert fast.rejections == slow.rejections
    assert fast.time_limits == slow.time_limits
    return fast


def reasons_of(res: CycleResult, submitter: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in res.rejections:
        if r.submitter == submitter:
            for k, n in r.reasons.items():
                out[k] = out.get(k, 0) + n
    return out


# --- knobs -------------------------------------------------------------------------------


def test_knob_defaults_and_from_knobs() -> None:
    d = NegotiatorConfig()
    assert (d.negotiator_max_time_per_submitter, d.negotiator_max_time_per_schedd,
            d.negotiator_max_time_per_cycle, d.negotiator_max_time_per_piespin) == \
        (60.0, 120.0, 1200.0, 120.0)
    c = NegotiatorConfig.from_knobs({
        "NEGOTIATOR_MAX_TIME_PER_SUBMITTER": "5", "negotiator_max_time_per_schedd": "6",
        "Negotiator_Max_Time_Per_Cycle": "7.5", "NEGOTIATOR_MAX_TIME_PER_PIESPIN": "8"})
    assert (c.negotiator_max_time_per_submitter, c.negotiator_max_time_per_schedd,
            c.negotiator_max_time_per_cycle, c.negotiator_max_time_per_piespin) == \
        (5.0, 6.0, 7.5, 8.0)
    assert "NEGOTIATOR_MAX_TIME_PER_CYCLE" in service._NEGOTIATOR_KNOBS


# --- no clock: reproducible, no limit ----------------------------------------------------


def test_default_clock_never_reaches_a_limit() -> None:
    cfg = NegotiatorConfig(negotiator_max_time_per_submitter=0.5,
                           negotiator_max_time_per_schedd=0.5,
                           negotiator_max_time_per_piespin=0.5,
                           negotiator_max_time_per_cycle=0.5)
    subs = [SubmitterInput("a@d", 1.0)]
    res = negotiate(cycle(subs, 10, {"a@d": jobs(1, 10)}), cfg)
    assert res.count_by_submitter() == {"a@d": 10}
    assert res.time_limits == {}
    assert res.submitters["a@d"].time_limit is None


def test_default_limits_not_reached_by_a_short_cycle() -> None:
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 2.0)]
    res = run(cycle(subs, 40, {"a@d": jobs(1, 20), "b@d": jobs(2, 3)}), NegotiatorConfig())
    assert res.count_by_submitter() == {"a@d": 20, "b@d": 3}
    assert res.time_limits == {}


# --- per submitter -----------------------------------------------------------------------


def test_submitter_time_limit_stops_only_that_submitter() -> None:
    cfg = NegotiatorConfig(negotiator_max_time_per_submitter=5)
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 2.0)]
    res = run(cycle(subs, 40, {"a@d": jobs(1, 20), "b@d": jobs(2, 3)}), cfg)
    # a is charged 1 s per job: after 5 jobs it has spent 5 s and is done for the cycle
    assert res.count_by_submitter() == {"a@d": 5, "b@d": 3}
    assert reasons_of(res, "a@d") == {SUB_TIME: 15}
    assert reasons_of(res, "b@d") == {}
    assert res.submitters["a@d"].time_limit == SUB_TIME
    assert res.submitters["b@d"].time_limit is None
    assert res.time_limits == {"submitters": ["a@d"]}


def test_submitter_time_accumulates_across_spins() -> None:
    # spin 1: a's slice is 3 of the 6 slots (3 s); spin 2 gives a the 2 slots b left, but
    # a has used its 3 s: the limit counts a's time over the whole cycle, not per turn
    cfg = NegotiatorConfig(negotiator_max_time_per_submitter=3)
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 1.0)]
    snap = cycle(subs, 6, {"a@d": jobs(1, 5), "b@d": jobs(2, 1)})
    res = run(snap, cfg)
    assert res.count_by_submitter() == {"a@d": 3, "b@d": 1}
    assert reasons_of(res, "a@d") == {SUB_TIME: 2}
    assert res.counters["spins"] == 2
    free = run(snap, NegotiatorConfig(negotiator_max_time_per_submitter=6))
    assert free.count_by_submitter() == {"a@d": 5, "b@d": 1}


# --- per schedd --------------------------------------------------------------------------


def test_schedd_time_limit_stops_every_submitter_of_that_schedd() -> None:
    cfg = NegotiatorConfig(negotiator_max_time_per_schedd=4)
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 2.0), SubmitterInput("c@d", 3.0)]
    idle = {
        "a@d": jobs(1, 3, ScheddName="s1"),
        "b@d": jobs(2, 3, ScheddName="s1") + jobs(3, 3, ScheddName="s2"),
        "c@d": jobs(4, 2, ScheddName="s1"),
    }
    res = run(cycle(subs, 40, idle), cfg)
    # s1: a's 3 jobs (3 s) + b's first (4 s) -> s1 is stopped; b goes on with its s2 jobs
    assert [(m.submitter, m.schedd) for m in res.matches] == [
        ("a@d", "s1"), ("a@d", "s1"), ("a@d", "s1"),
        ("b@d", "s1"), ("b@d", "s2"), ("b@d", "s2"), ("b@d", "s2")]
    assert reasons_of(res, "a@d") == {}
    assert reasons_of(res, "b@d") == {SCHEDD_TIME: 2}
    assert reasons_of(res, "c@d") == {SCHEDD_TIME: 2}  # never got a turn
    assert res.submitters["b@d"].time_limit == SCHEDD_TIME
    assert res.submitters["c@d"].time_limit == SCHEDD_TIME
    assert res.submitters["a@d"].time_limit is None
    assert res.time_limits == {"schedds": ["s1"]}


# --- per pie spin ------------------------------------------------------------------------


def test_piespin_time_limit_ends_the_spin() -> None:
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 1.0)]
    snap = cycle(subs, 20, {"a@d": jobs(1, 10), "b@d": jobs(2, 10)})
    # spin starts at t=1; a's k-th job is checked at t=2+3k: 7 s into the spin at k=2
    one = run(snap, NegotiatorConfig(negotiator_max_time_per_piespin=7, max_spins=1))
    assert one.count_by_submitter() == {"a@d": 2}  # b's turn in the spin never came
    assert one.time_limits == {"piespins": 1}
    assert one.rejections == ()
    assert one.submitters["b@d"].time_limit is None
    # the next spin starts afresh (unlike the cycle limit)
    two = run(snap, NegotiatorConfig(negotiator_max_time_per_piespin=7, max_spins=2))
    assert len(two.matches) == 4
    assert two.time_limits == {"piespins": 2}
    free = run(snap, NegotiatorConfig(max_spins=1))
    assert free.count_by_submitter() == {"a@d": 10, "b@d": 10}


# --- per cycle ---------------------------------------------------------------------------


def test_cycle_time_limit_ends_the_cycle() -> None:
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 1.0)]
    snap = cycle(subs, 20, {"a@d": jobs(1, 10), "b@d": jobs(2, 10)})
    res = run(snap, NegotiatorConfig(negotiator_max_time_per_cycle=8))
    # a's k-th job is checked at t=2+3k: 8 s into the cycle at k=2; nothing after that
    assert res.count_by_submitter() == {"a@d": 2}
    assert res.counters["spins"] == 1
    assert res.time_limits == {"cycle_time_limit_reached": True}
    assert res.rejections == ()
    assert res.submitters["a@d"].time_limit == CYCLE_TIME
    assert res.submitters["b@d"].time_limit == CYCLE_TIME


# --- the negotiation.cycle payload -------------------------------------------------------


def _cycled(snap: CycleInput, res: CycleResult) -> NegotiationCycled:
    [cycled] = [p for p in cycle_payloads(snap, res, "neg", None, 0.0, Offer())
                if isinstance(p, NegotiationCycled)]
    return cycled


def test_payload_records_limit_hits_only_when_they_happen() -> None:
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 1.0)]
    snap = cycle(subs, 20, {"a@d": jobs(1, 10), "b@d": jobs(2, 10)})
    hit = _cycled(snap, run(snap, NegotiatorConfig(negotiator_max_time_per_cycle=8)))
    assert hit.rejections["_time_limits"] == {"cycle_time_limit_reached": True}
    assert hit.submitters["a@d"]["stopped"] == CYCLE_TIME
    assert hit.submitters["a@d"]["not_considered"] == 8
    assert hit.submitters["b@d"]["time_limit"] == CYCLE_TIME
    clean = _cycled(snap, run(snap, NegotiatorConfig()))
    assert "_time_limits" not in clean.rejections
    assert all("time_limit" not in d for d in clean.submitters.values())

    sub = _cycled(snap, run(snap, NegotiatorConfig(negotiator_max_time_per_submitter=4)))
    assert sub.rejections["_time_limits"] == {"submitters": ["a@d", "b@d"]}
    assert sub.rejections["a@d#0"]["reason"] == SUB_TIME
    assert sub.rejections["a@d#0"]["count"] == 6
    assert sub.submitters["a@d"]["time_limit"] == SUB_TIME


def test_run_cycle_passes_its_clock_to_the_matchmaker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert inspect.signature(run_cycle).parameters["clock"].default is time.perf_counter
    subs = [SubmitterInput("a@d", 1.0), SubmitterInput("b@d", 1.0)]
    snap = cycle(subs, 20, {"a@d": jobs(1, 10), "b@d": jobs(2, 10)})
    monkeypatch.setattr(service, "_snapshot", lambda *a, **k: (snap, Offer()))
    cfg = NegotiatorConfig(negotiator_max_time_per_cycle=8)
    ledger: Any = None
    # run_cycle reads the clock once before negotiating: the matchmaker's cycle starts at t=1
    payloads = run_cycle(ledger, cfg, snap.now, snap.cycle, clock=FakeClock())
    [cycled] = [p for p in payloads if isinstance(p, NegotiationCycled)]
    assert cycled.matches == 2
    assert cycled.rejections["_time_limits"] == {"cycle_time_limit_reached": True}
    payloads = run_cycle(ledger, cfg, snap.now, snap.cycle, clock=None)
    [cycled] = [p for p in payloads if isinstance(p, NegotiationCycled)]
    assert cycled.matches == 20 and "_time_limits" not in cycled.rejections


def test_single_job_submitter_stopped_before_any_job() -> None:
    cfg = NegotiatorConfig(negotiator_max_time_per_submitter=0)
    subs = [SubmitterInput("a@d", 1.0)]
    res = run(cycle(subs, 3, {"a@d": [job(1, 0), job(2, 0)]}), cfg)
    assert res.matches == ()
    assert reasons_of(res, "a@d") == {SUB_TIME: 2}
