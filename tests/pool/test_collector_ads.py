"""The central manager's own ads: Negotiator (last cycles' statistics), Accounting, Collector."""
from __future__ import annotations

from schemas.events import NegotiationCycled
from services.pool.collector import NegotiatorAd, accounting_ads, collector_ad


def cycle(now: float, matches: int, duration: float, rejections: int = 0) -> NegotiationCycled:
    return NegotiationCycled(
        negotiator="negotiator@cm", cycle=1, now=now, duration=duration, matches=matches,
        submitters={"a@d": {"matches": matches, "rejections": rejections, "idle": 10},
                    "b@d": {"matches": 0, "rejections": 0, "idle": 4}},
        rejections={"a@d#1": {"count": rejections, "reason": "no match found"},
                    "_time_limits": {"submitters": ["a@d"]}})


def test_negotiator_ad_keeps_the_last_three_cycles_newest_at_0() -> None:
    neg = NegotiatorAd("negotiator@cm.example.org", start_time=1000.0)
    neg.cycle(cycle(1060, 5, 2.0), total_slots=10, candidate_slots=10, schedds=2)
    neg.cycle(cycle(1120, 3, 1.0, rejections=4), total_slots=10, candidate_slots=9, schedds=1)
    neg.cycle(cycle(1180, 0, 0.5), total_slots=11, candidate_slots=11, schedds=1)
    up = neg.cycle(cycle(1240, 7, 2.0), total_slots=12, candidate_slots=12, schedds=3,
                   limits={"xsw": 2.0, "db.small": 1.0})
    ad = up.ad
    assert (up.ad_type, up.name, ad["MyType"], ad["Machine"]) == \
        ("Negotiator", "negotiator@cm.example.org", "Negotiator", "cm.example.org")
    assert ad["LastNegotiationCycleMatches0"] == 7
    assert ad["LastNegotiationCycleMatches1"] == 0
    assert ad["LastNegotiationCycleMatches2"] == 3
    assert "LastNegotiationCycleMatches3" not in ad  # NEGOTIATION_CYCLE_STATS_LENGTH = 3
    assert ad["LastNegotiationCycleRejections2"] == 4  # the `_time_limits` entry is not one
    assert ad["LastNegotiationCycleDuration0"] == 2.0
    assert ad["LastNegotiationCyclePeriod0"] == (1240 + 2.0) - (1180 + 0.5)
    assert ad["LastNegotiationCycleNumSchedulers0"] == 3
    assert ad["LastNegotiationCycleActiveSubmitterCount0"] == 2
    assert ad["LastNegotiationCycleNumIdleJobs0"] == 14
    assert ad["LastNegotiationCycleNumJobsConsidered2"] == 7
    assert ad["LastNegotiationCycleTotalSlots0"] == 12
    assert ad["LastNegotiationCycleMatchRate0"] == 3.5
    assert ad["LastNegotiationCycleMatchRateSustained0"] == 7 / 61.5
    assert ad["LastNegotiationCycleSubmittersOutOfTime0"] == 1
    assert (ad["ConcurrencyLimit_xsw"], ad["ConcurrencyLimit_db_small"]) == (2.0, 1.0)


def test_accounting_ads_join_quotas_and_drop_non_finite_values() -> None:
    ads = accounting_ads({"g": {"IsAccountingGroup": True, "Priority": 0.5, "Bad": float("nan")},
                          "g.u@d": {"IsAccountingGroup": False, "Priority": 2.0}},
                         {"g": {"EffectiveQuota": 10.0, "SurplusPolicy": "byquota"}}, "negotiator@cm")
    assert [a.name for a in ads] == ["g", "g.u@d"]
    assert ads[0].ad == {"MyType": "Accounting", "Name": "g", "NegotiatorName": "negotiator@cm",
                         "IsAccountingGroup": True, "Priority": 0.5, "EffectiveQuota": 10.0,
                         "SurplusPolicy": "byquota"}


def test_collector_ad_counts_what_the_collector_holds() -> None:
    held = [("Machine", {"State": "Claimed"}), ("Machine", {"State": "Unclaimed"}),
            ("Machine", {"State": "Owner"}), ("Submitter", {"RunningJobs": 3, "IdleJobs": 4}),
            ("Submitter", {"RunningJobs": 1, "IdleJobs": 0}), ("Scheduler", {"TotalIdleJobs": 4})]
    ad = collector_ad("collector@cm.example.org", 1000.0, 1900.0, held, (120, 3)).ad
    assert (ad["HostsTotal"], ad["HostsClaimed"], ad["HostsUnclaimed"], ad["HostsOwner"]) == (3, 1, 1, 1)
    assert (ad["RunningJobs"], ad["IdleJobs"], ad["SubmitterAds"]) == (4, 4, 2)
    assert (ad["UpdatesTotal"], ad["UpdatesLost"], ad["Machine"]) == (120, 3, "cm.example.org")
