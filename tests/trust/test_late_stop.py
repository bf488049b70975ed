"""Issue 28 item 9, accounting: a late `job.stopped` is charged where its interval belongs,
not at its arrival. Numbers computed by hand from the half-life flow (DESIGN.md, exact mode):
priority' = (rho - priority) ln2 / h, so over a stretch of d seconds at constant rho,
P <- beta*P + (1 - beta)*rho with beta = 0.5^(d/h)."""
from __future__ import annotations

import pytest

from schemas.events import Envelope, JobStarted, JobStopped, make_event
from schemas.settings import load_settings
from streams.core.ledger import Ledger
from streams.synthetic import SCHEDD

T0 = 1_763_800_000.0
USER = "alice@example.org"
#: beta of one hour at PRIORITY_HALFLIFE 86400: 0.5 ** (3600 / 86400)
BETA = 0.9715319411536059


def _events() -> tuple[list[Envelope], Envelope]:
    """alice starts three jobs at T0 and a fourth at T0 + 2 h; job 1.0 stopped at T0 + 1 h.
    Returns the events in time order, and the stop."""
    start = [make_event(JobStarted(f"{i}.0", SCHEDD, USER, f"slot{i}@ep.example.org", 1.0),
                        ts=T0 + (7200 if i == 4 else 0), source=SCHEDD, seq=i if i < 4 else 5)
             for i in range(1, 5)]
    stop = make_event(JobStopped("1.0", "slot1@ep.example.org", "completed", SCHEDD, USER),
                      ts=T0 + 3600, source=SCHEDD, seq=4)
    return [*start[:3], stop, start[3]], stop


def _fold(events: list[Envelope]) -> Ledger:
    led = Ledger(load_settings(env={}, overrides={"PRIORITY_HALFLIFE": "86400"}))
    for env in events:
        led.apply(env)
    return led


def test_a_late_stop_is_charged_where_its_interval_belongs() -> None:
    """By hand: [T0, T0+1h] rho 3, [T0+1h, T0+2h] rho 2, from 0.5:
    P(1h) = BETA*0.5 + (1-BETA)*3 = 0.5711701471159853,
    P(2h) = BETA*P(1h) + (1-BETA)*2 = 0.6118461594493722;
    AccumulatedUsage 3*3600 + 2*3600 = 18000 s. Charged at its arrival (T0+2h) instead, it
    would be BETA^2*0.5 + (1-BETA^2)*3 = 0.6403142182957662 and 21600 s: the correction is
    1*(1 - BETA) of priority (the hour's weight, decayed since) and 3600 s of usage."""
    in_order, stop = _events()
    late = [e for e in in_order if e is not stop] + [stop]
    for led in (_fold(in_order), _fold(late)):
        alice = led.submitter(USER, T0 + 7200)
        assert alice is not None
        assert alice["Priority"] == pytest.approx(0.6118461594493722, rel=1e-12)
        assert alice["AccumulatedUsage"] == pytest.approx(18_000.0, rel=1e-12)
        assert alice["WeightedAccumulatedUsage"] == pytest.approx(18_000.0, rel=1e-12)
        assert alice["ResourcesUsed"] == 3
        group = led.priorities(T0 + 7200, all_groups=True)["<none>"]
        assert group["Priority"] == pytest.approx(0.6118461594493722, rel=1e-12)
        assert group["AccumulatedUsage"] == pytest.approx(18_000.0, rel=1e-12)
    assert 0.6118461594493722 == pytest.approx(
        BETA * (BETA * 0.5 + (1 - BETA) * 3) + (1 - BETA) * 2, rel=1e-15)


def test_a_late_stop_before_its_start_takes_back_the_whole_match() -> None:
    """A stop whose time is before its match began (a start folded late, then the stop):
    the match is taken back from its start, not from the stop's time."""
    in_order, stop = _events()
    early = make_event(JobStopped("4.0", "slot4@ep.example.org", "completed", SCHEDD, USER),
                       ts=T0 + 3600, source=SCHEDD, seq=6)
    led = _fold([*in_order, early])
    alice = led.submitter(USER, T0 + 7200)
    assert alice is not None
    assert alice["ResourcesUsed"] == 2
    assert alice["Priority"] == pytest.approx(0.6118461594493722, rel=1e-12)
    assert alice["AccumulatedUsage"] == pytest.approx(18_000.0, rel=1e-12)
