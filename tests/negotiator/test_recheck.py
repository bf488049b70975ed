"""A carved partitionable slot re-checked for a request takes the match data the request
computed for the same shape on another pslot (`_Engine._recheck`): the cycle must decide
exactly what it decides when every re-check is evaluated afresh."""
from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from services.negotiator import NegotiatorConfig, negotiate
from services.negotiator import matchmaker
from tests.negotiator.test_golden_matches import outcome
from tests.negotiator.test_parallel import big_cycle


@pytest.mark.parametrize("groups", [False, True])
def test_rechecked_shapes_decide_as_fresh_evaluation(groups: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    snap = big_cycle(31 if groups else 37, groups)
    cfg = NegotiatorConfig(negotiator_workers=1, preemption_requirements="True")
    hits = 0
    real_recheck = matchmaker._Engine._recheck

    def counting(self: matchmaker._Engine, req: Any, rows: Any, submitter: str,
                 eup: float) -> None:
        nonlocal hits
        known = {self._shape(req.names, r) for r in rows.tolist()} if req.names else set()
        hits += len(known & set(req.rechecked))
        real_recheck(self, req, rows, submitter, eup)

    monkeypatch.setattr(matchmaker._Engine, "_recheck", counting)
    memo = negotiate(snap, cfg)
    assert hits > 50  # else this compares fresh evaluation with itself
    fresh = itertools.count()
    monkeypatch.setattr(matchmaker._Engine, "_shape", lambda self, names, row: next(fresh))
    plain = negotiate(snap, cfg)
    assert len(plain.dynamic_slots) > 50
    assert json.loads(json.dumps(outcome(memo))) == json.loads(json.dumps(outcome(plain)))
