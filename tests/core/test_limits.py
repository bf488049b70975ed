"""Concurrency limits: seed 000's examples and HTCondor's test_concurrency_limits.py numbers."""
from __future__ import annotations

from typing import Any

import pytest

from schemas.events import (ConfigChanged, Envelope, JobHistory, JobStarted, JobStopped, LimitChanged,
                            Payload, make_event)
from schemas.config import Knobs
from streams.core.errors import CoreError
from streams.core.limits import (CONCURRENCY_LIMIT_DEFAULT, ConcurrencyLimitError, LimitsConfig,
                                 LimitsState, LimitToken, apply, can_start, limits_for_slot,
                                 parse_limits)


class Feeder:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, payload: Payload, source: str = "schedd@ap1") -> Envelope:
        self.n += 1
        return make_event(payload, ts=float(self.n), source=source, seq=self.n)


def started(job_id: str, limits: str, slot: str = "slot1@ep1", schedd: str = "schedd@ap1") -> JobStarted:
    return JobStarted(job_id=job_id, schedd=schedd, submitter="u@x", slot=slot, slot_weight=1.0,
                      concurrency_limits=limits)


def start_until_rejected(knobs: dict[str, Any], limits: str, tries: int = 10) -> tuple[int, str]:
    """Start jobs declaring `limits` while can_start allows; (how many ran, the rejection)."""
    cfg, st, ev = LimitsConfig.from_settings(Knobs(knobs)), LimitsState(), Feeder()
    for n in range(tries):
        ok, reason = can_start(st, limits, cfg)
        if not ok:
            return n, reason
        apply(st, ev(started(f"{n}.0", limits)), cfg)
    return tries, ""


# --- parsing -------------------------------------------------------------------------------

def test_parse_tokens_increments_and_case() -> None:
    assert parse_limits("XSW, DATABASE, FILESERVER:3") == (
        LimitToken("xsw", 1.0), LimitToken("database", 1.0), LimitToken("fileserver", 3.0))
    assert parse_limits("a:0 b:-2 c:x d:2.5 Large.SwLicense") == (
        LimitToken("a", 1.0), LimitToken("b", 1.0), LimitToken("c", 1.0), LimitToken("d", 2.5),
        LimitToken("large.swlicense", 1.0))
    assert parse_limits("") == () and parse_limits(None) == () and parse_limits(" , ") == ()


@pytest.mark.parametrize("text, token", [
    ("9lives", "9lives"), ("a.b.c", "a.b.c"), ("xsw, bad-name:2", "bad-name:2"),
    ("large.", "large."), (".x", ".x"), (":3", ":3"), ("set.9x", "set.9x"),
])
def test_invalid_names_are_rejected_naming_the_token(text: str, token: str) -> None:
    with pytest.raises(ConcurrencyLimitError) as info:
        parse_limits(text)
    assert info.value.token == token
    assert repr(token) in str(info.value)
    assert isinstance(info.value, CoreError)


# --- maxima --------------------------------------------------------------------------------

def test_maxima_named_then_set_default_then_pool_default() -> None:
    # seed: XSW_LIMIT = 3; LARGE and SMALL sets; CONCURRENCY_LIMIT_DEFAULT = 5 for the rest
    cfg = LimitsConfig.from_settings(Knobs({
        "XSW_LIMIT": "3", "CONCURRENCY_LIMIT_DEFAULT": "5",
        "CONCURRENCY_LIMIT_DEFAULT_LARGE": "100", "CONCURRENCY_LIMIT_DEFAULT_SMALL": "25"}))
    assert cfg.max_for("xsw") == 3
    assert cfg.max_for("large.swlicense") == 100 and cfg.max_for("large.dbsession") == 100
    assert cfg.max_for("small.license") == 25
    assert cfg.max_for("other.license") == 5 and cfg.max_for("database") == 5
    assert LimitsConfig.from_settings(Knobs({})).max_for("anything") == CONCURRENCY_LIMIT_DEFAULT == 2308032


def test_fileserver_3_units_against_xsw_limit_3() -> None:
    knobs = {"XSW_LIMIT": 3, "FILESERVER_LIMIT": 7}
    ran, reason = start_until_rejected(knobs, "XSW, DATABASE, FILESERVER:3")
    assert ran == 2 and reason == "concurrency limit fileserver reached"  # 3+3 <= 7 < 3+3+3
    ran, reason = start_until_rejected(knobs, "xsw")
    assert (ran, reason) == (3, "concurrency limit xsw reached")


# --- HTCondor's test_concurrency_limits.py ------------------------------------------------

def test_named_limit_xsw_4() -> None:
    assert start_until_rejected({"XSW_LIMIT": 4}, "XSW") == (4, "concurrency limit xsw reached")


def test_default_limit_2_with_two_units_runs_1() -> None:
    assert start_until_rejected({"CONCURRENCY_LIMIT_DEFAULT": 2}, "UNDEFINED:2") == (
        1, "concurrency limit undefined reached")


def test_set_default_small_3() -> None:
    assert start_until_rejected({"CONCURRENCY_LIMIT_DEFAULT_SMALL": 3}, "small.license")[0] == 3


def test_set_default_large_1() -> None:
    assert start_until_rejected({"CONCURRENCY_LIMIT_DEFAULT_LARGE": 1}, "large.license")[0] == 1


def test_can_start_rejects_invalid_text() -> None:
    with pytest.raises(ConcurrencyLimitError):
        can_start(LimitsState(), "ok, 1bad", LimitsConfig())


# --- concurrency_limits_expr -----------------------------------------------------------------

def test_concurrency_limits_expr_chooses_limit_from_target_network() -> None:
    job = {"ConcurrencyLimitsExpr": "/Expr(TARGET.NETWORK)/"}
    a, b = {"NETWORK": "NETWORK_A"}, {"NETWORK": "NETWORK_B"}
    assert limits_for_slot(job, a) == "NETWORK_A"
    assert limits_for_slot(job, b) == "NETWORK_B"
    swx = {"ConcurrencyLimitsExpr": '/Expr(strcat("SWX:2 ", TARGET.NETWORK))/'}
    assert parse_limits(limits_for_slot(swx, a)) == (LimitToken("swx", 2.0), LimitToken("network_a", 1.0))
    assert limits_for_slot(job, {}) == ""  # TARGET.NETWORK undefined: no limit
    assert limits_for_slot({"ConcurrencyLimits": "XSW"}, a) == "XSW"
    assert limits_for_slot({}, a) == ""
    # ten network-intensive jobs per network (NETWORK_A_LIMIT = NETWORK_B_LIMIT = 10)
    cfg = LimitsConfig.from_settings(Knobs({"NETWORK_A_LIMIT": 10, "NETWORK_B_LIMIT": 10}))
    st, ev = LimitsState(), Feeder()
    for n in range(10):
        apply(st, ev(started(f"{n}.0", limits_for_slot(job, a))), cfg)
    assert can_start(st, limits_for_slot(job, a), cfg) == (False, "concurrency limit network_a reached")
    assert can_start(st, limits_for_slot(job, b), cfg) == (True, "")


# --- the fold ------------------------------------------------------------------------------

def test_usage_counts_running_jobs_and_emits_limit_changed() -> None:
    cfg = LimitsConfig.from_settings(Knobs({"XSW_LIMIT": 3}))
    st, ev = LimitsState(), Feeder()
    e1 = ev(started("1.0", "xsw, fileserver:3"))
    out = apply(st, e1, cfg)
    assert out == [LimitChanged("fileserver", CONCURRENCY_LIMIT_DEFAULT, 3.0, e1.id),
                   LimitChanged("xsw", 3.0, 1.0, e1.id)]
    apply(st, ev(started("2.0", "XSW", slot="slot2@ep1")), cfg)
    assert st.in_use == {"xsw": 2.0, "fileserver": 3.0}
    # released on any stop (v1 stop without schedd found by job id + slot) and on history
    out = apply(st, ev(JobStopped("1.0", "slot1@ep1", "evicted")), cfg)
    assert {(p.limit, p.in_use) for p in out if isinstance(p, LimitChanged)} == {("xsw", 1.0), ("fileserver", 0.0)}
    out = apply(st, ev(JobHistory({"GlobalJobId": "ap1#2.0#1700000000", "ClusterId": 2, "ProcId": 0})), cfg)
    assert [(p.limit, p.in_use) for p in out if isinstance(p, LimitChanged)] == [("xsw", 0.0)]
    assert st.in_use == {} and st.running == {}
    assert apply(st, ev(JobStopped("9.0", "slot9@ep1", "completed", "schedd@ap1")), cfg) == []


def test_config_changed_moves_maximum_and_bad_tokens_never_stop_the_fold() -> None:
    cfg = LimitsConfig.from_settings(Knobs({"XSW_LIMIT": 3}))
    st, ev = LimitsState(), Feeder()
    assert [p.limit for p in apply(st, ev(started("1.0", "xsw, 9bad, a.b.c")), cfg)
            if isinstance(p, LimitChanged)] == ["xsw"]
    e = ev(ConfigChanged("XSW_LIMIT", "1"), "admin")
    assert apply(st, e, cfg) == [LimitChanged("xsw", 1.0, 1.0, e.id)]
    assert can_start(st, "xsw", cfg) == (False, "concurrency limit xsw reached")
    e = ev(ConfigChanged("DB_LIMIT", "4"), "admin")
    assert apply(st, e, cfg) == [LimitChanged("db", 4.0, 0.0, e.id)]
    assert LimitsState.from_json(st.to_json()).to_json() == st.to_json()
    resumed = LimitsState.from_json(st.to_json())
    assert can_start(resumed, "xsw", cfg) == (False, "concurrency limit xsw reached")
