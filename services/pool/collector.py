"""The ads the central manager's own daemons put in the collector: Negotiator, Accounting and
Collector ads, with HTCondor's attribute names.

Why: condor_gangliad (and anything else watching the pool) reads the collector, and a real
collector holds more than Machine, Scheduler and Submitter ads. The negotiator keeps its last
NEGOTIATION_CYCLE_STATS_LENGTH cycles' statistics as `LastNegotiationCycle<Stat><i>` (0 the most
recent) and publishes one Accounting ad per submitter and group; the collector describes the
pool it holds (HostsTotal, RunningJobs, ...). Building them from the log's own events keeps a
replay identical.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from schemas.events import AdUpdated, NegotiationCycled

__all__ = ["NegotiatorAd", "accounting_ads", "collector_ad", "CYCLE_STATS_LENGTH",
           "COLLECTOR_UPDATE_INTERVAL", "cycle_ad_counts"]

#: NEGOTIATION_CYCLE_STATS_LENGTH's default: how many past cycles the Negotiator ad carries
CYCLE_STATS_LENGTH = 3
#: COLLECTOR_UPDATE_INTERVAL's default: how often the collector refreshes its own ad
COLLECTOR_UPDATE_INTERVAL = 900.0


def _host(daemon: str) -> str:
    return daemon.split("@", 1)[1] if "@" in daemon else daemon


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or isinstance(value, str):
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return False


#: the statistics of each of its last cycles a Negotiator ad carries, as
#: `LastNegotiationCycle<name><i>` (i = 0 the latest), in the order it writes them
_CYCLE_STATS = ("Time", "End", "Period", "Duration", "Matches", "Rejections", "NumSchedulers",
                "ActiveSubmitterCount", "NumIdleJobs", "NumJobsConsidered", "TotalSlots",
                "CandidateSlots", "TrimmedSlots", "MatchRate", "MatchRateSustained",
                "SubmittersOutOfTime")


class NegotiatorAd:
    """One negotiator's ad: its identity plus the statistics of its last cycles."""

    def __init__(self, name: str, start_time: float, length: int = CYCLE_STATS_LENGTH) -> None:
        self.name = name
        self.machine = _host(name)
        self.start_time = start_time
        self.cycles: deque[dict[str, Any]] = deque(maxlen=max(1, length))

    @classmethod
    def from_ad(cls, name: str, start_time: float, ad: Mapping[str, Any],
                length: int = CYCLE_STATS_LENGTH) -> NegotiatorAd:
        """The negotiator whose latest ad is `ad`: its cycle statistics read back from the
        `LastNegotiationCycle<Stat><i>` attributes (a negotiator resuming from a snapshot
        writes the ads one that folded the log would)."""
        new = cls(name, start_time, length)
        for i in range(length):
            if f"LastNegotiationCycleTime{i}" not in ad:
                break
            new.cycles.append({k: ad[f"LastNegotiationCycle{k}{i}"] for k in _CYCLE_STATS})
        return new

    def cycle(self, c: NegotiationCycled, *, total_slots: int, candidate_slots: int,
              schedds: int, limits: Mapping[str, float] | None = None) -> AdUpdated:
        """The ad after cycle `c`: its statistics become index 0, older ones shift up."""
        end = c.now + c.duration
        period = end - self.cycles[0]["End"] if self.cycles else 0.0
        rejections = sum(int(e.get("count", 0)) for k, e in c.rejections.items()
                         if not k.startswith("_") and isinstance(e, Mapping))
        idle = sum(int(s.get("idle", 0)) for s in c.submitters.values())
        considered = sum(int(s.get("matches", 0)) + int(s.get("rejections", 0))
                         for s in c.submitters.values())
        self.cycles.appendleft(dict(zip(_CYCLE_STATS, (
            int(c.now), end, period, c.duration, c.matches, rejections, schedds,
            len(c.submitters), idle, considered, total_slots, candidate_slots, candidate_slots,
            c.matches / c.duration if c.duration > 0 else 0.0,
            c.matches / period if period > 0 else 0.0,
            len((c.rejections.get("_time_limits") or {}).get("submitters", ()))), strict=True)))
        now = int(c.now)
        ad: dict[str, Any] = {
            "MyType": "Negotiator", "Name": self.name, "NegotiatorName": self.name,
            "Machine": self.machine, "MyAddress": f"<{self.machine}:9618>",
            "DaemonStartTime": int(self.start_time), "LastHeardFrom": now, "MyCurrentTime": now,
            "MonitorSelfAge": max(0, now - int(self.start_time)),
            "LastNegotiationCycleEnd": int(end),
        }
        for i, stats in enumerate(self.cycles):
            for key, value in stats.items():
                ad[f"LastNegotiationCycle{key}{i}"] = value
        for limit, used in sorted((limits or {}).items()):
            ad[f"ConcurrencyLimit_{_limit_attr(limit)}"] = used
        return AdUpdated(ad_type="Negotiator", name=self.name, ad=ad)


def cycle_ad_counts(ledger: Any) -> tuple[int, int]:
    """(slots, schedds with idle jobs) in the pool's current ads, for the Negotiator ad."""
    slots = len(ledger.current_ads("Machine"))
    schedds = sum(1 for _name, ad in ledger.current_ads("Scheduler")
                  if (ad.get("TotalIdleJobs") or 0) > 0)
    return slots, schedds


def _limit_attr(name: str) -> str:
    """HTCondor publishes limit `a.b` as ConcurrencyLimit_a_b (attribute names have no '.')."""
    return name.replace(".", "_")


def accounting_ads(priorities: Mapping[str, Mapping[str, Any]],
                   quotas: Mapping[str, Mapping[str, Any]], negotiator: str) -> list[AdUpdated]:
    """One Accounting ad per submitter and group, as the negotiator publishes them each cycle.

    Quota attributes join the group's ad; a non-finite value (an unlimited ceiling is -1, never
    inf, but be strict) is left out rather than written to the log.
    """
    out = []
    for name in sorted(priorities):
        rec = priorities[name]
        ad: dict[str, Any] = {"MyType": "Accounting", "Name": name, "NegotiatorName": negotiator}
        ad.update((k, v) for k, v in rec.items() if _finite(v))
        ad.update((k, v) for k, v in quotas.get(name, {}).items() if _finite(v))
        out.append(AdUpdated(ad_type="Accounting", name=name, ad=ad))
    return out


def collector_ad(name: str, start_time: float, now: float, ads: Iterable[tuple[str, Mapping[str, Any]]],
                 updates: tuple[int, int] = (0, 0)) -> AdUpdated:
    """The collector's own ad from the ads it holds (`(MyType, ad)` pairs): the pool's totals
    the way condor_collector counts them, plus its update statistics (total, lost)."""
    hosts = {"Total": 0, "Claimed": 0, "Unclaimed": 0, "Owner": 0}
    running = idle = submitters = 0
    for ad_type, ad in ads:
        kind = ad_type.lower()
        if kind == "machine":
            hosts["Total"] += 1
            state = ad.get("State")
            if isinstance(state, str) and state in hosts:
                hosts[state] += 1
        elif kind == "submitter":
            submitters += 1
            running += int(ad.get("RunningJobs") or 0)
            idle += int(ad.get("IdleJobs") or 0)
    machine = _host(name)
    t = int(now)
    return AdUpdated(ad_type="Collector", name=name, ad={
        "MyType": "Collector", "Name": name, "Machine": machine, "MyAddress": f"<{machine}:9618>",
        "DaemonStartTime": int(start_time), "LastHeardFrom": t, "MyCurrentTime": t,
        "HostsTotal": hosts["Total"], "HostsClaimed": hosts["Claimed"],
        "HostsUnclaimed": hosts["Unclaimed"], "HostsOwner": hosts["Owner"],
        "RunningJobs": running, "IdleJobs": idle, "SubmitterAds": submitters,
        "UpdatesTotal": updates[0], "UpdatesLost": updates[1],
    })
