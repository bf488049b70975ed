"""A startd answers a policy knob that references nothing without building the slot's ads
(issue 27); anything reading an attribute, time() or random() is still evaluated per slot."""
from __future__ import annotations

import classad2

from services.pool.startd import _MISSING, _constant_value


def test_constant_knobs_are_values_and_the_rest_are_evaluated() -> None:
    assert _constant_value("10 * 60") == 600
    assert _constant_value("0") == 0
    assert _constant_value("UNDEFINED") == classad2.Value.Undefined
    for text in ("TotalJobRunTime > 60", "time() - EnteredCurrentState", "random(10)",
                 "MY.Memory * 2"):
        assert _constant_value(text) is _MISSING, text
