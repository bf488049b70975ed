"""A simulated condor_defrag (seeds 000/001, "Defragmenting Dynamic Slots").

It follows HTCondor's src/defrag/defrag.cpp: every DEFRAG_INTERVAL it reads the collector's
slot ads, counts machines draining (by this daemon) and whole machines (partitionable slots
matching DEFRAG_WHOLE_MACHINE_EXPR), cancels draining where DEFRAG_CANCEL_REQUIREMENTS hold,
and starts draining the best candidates (DEFRAG_REQUIREMENTS, sorted by DEFRAG_RANK) at
DEFRAG_DRAINING_MACHINES_PER_HOUR, split as HTCondor splits it into a number per poll plus a
remainder per clock hour and per day, bounded by DEFRAG_MAX_CONCURRENT_DRAINING and
DEFRAG_MAX_WHOLE_MACHINES. Draining is requested with DEFRAG_DRAINING_SCHEDULE and
resume-on-completion, so a drained machine returns to service as a whole machine. Its Defrag
ad goes out every DEFRAG_UPDATE_INTERVAL.

One deliberate difference: HTCondor shuffles the candidates before the (stable) sort by
rank; here ties keep host order, so a simulation stays reproducible.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from schemas.events import AdUpdated, Envelope
from schemas.classads import Expr, as_number, attrs_from_json, evaluate_policy, expr, is_true
from schemas.errors import ClassAdError
from schemas.settings import DaemonConfig
from services.pool.clock import VirtualClock
from services.pool.daemon import Daemon
from services.pool.errors import PoolConfigError
from services.pool.startd import DRAIN_CAUSES, Startd

#: what defrag.cpp ANDs into every query: partitionable slots that are online
BASE_SLOT = "PartitionableSlot && Offline =!= True"


def enabled(config: DaemonConfig) -> bool:
    """DEFRAG in DAEMON_LIST (the seed: "DEFRAG must be added to DAEMON_LIST")."""
    daemons = (config.get("DAEMON_LIST", "") or "").replace(",", " ").upper().split()
    return "DEFRAG" in daemons


def split_rate(per_hour: float, interval: float) -> tuple[int, int, int]:
    """DEFRAG_DRAINING_MACHINES_PER_HOUR as (per poll, extra per clock hour, extra per day),
    as Defrag::config computes it so that fractional rates are honoured over time."""
    rate = per_hour / 3600.0 * interval
    per_poll = max(0, math.floor(rate + 0.00001))
    error_per_hour = (rate - per_poll) / interval * 3600.0
    per_hour_extra = math.floor(error_per_hour + 0.00001)
    per_day_extra = math.floor((error_per_hour - per_hour_extra) * 24.0 + 0.5)
    if per_day_extra < 0 or interval > 86400:
        per_day_extra = 0
    return per_poll, per_hour_extra, per_day_extra


def prorate(n: int, elapsed: float, period: float, granularity: float) -> int:
    """`n` per period, reduced to the part of the period left (plus one polling interval)."""
    answer = math.floor(n * ((period - elapsed) / period + granularity / period) + 0.5)
    if (n > 0 and answer > n) or (n < 0 and answer < n):
        return n
    return 0 if answer * n < 0 else answer


class Pool(Protocol):
    """What condor_defrag reaches: the collector's slot ads, and each machine's startd."""

    def slot_ads(self) -> list[dict[str, Any]]:
        """The last published ad of every slot."""

    def startd_for(self, slot: str) -> Startd | None:
        """The startd publishing `slot`."""


class Defrag(Daemon):
    """condor_defrag on the central manager (source `defrag@<host>`)."""

    def __init__(self, host: str, config: DaemonConfig, clock: VirtualClock, outbox: list[Envelope],
                 pool: Pool) -> None:
        super().__init__(f"defrag@{host}", clock, outbox)
        self.name = host
        self.config = config  # the pool's: DEFRAG_* defaults live in the knob table (schemas.knobs)
        self.pool = pool
        self.last_poll = 0.0
        self.stats: dict[str, float] = {
            "DrainSuccesses": 0, "DrainFailures": 0, "MachinesDraining": 0,
            "MachinesDrainingPeak": 0, "WholeMachines": 0, "WholeMachinesPeak": 0,
            "AvgDrainingBadput": 0.0, "AvgDrainingUnclaimed": 0.0}
        self._recent: deque[tuple[float, str]] = deque()  # (when, "success"|"failure")
        self.drained: list[tuple[float, str]] = []  # (when, machine) of every drain started
        self.check()

    # ---- configuration -------------------------------------------------------------------

    def _expr(self, knob: str) -> Expr:
        try:
            return expr(self.config.get(knob) or "")
        except ClassAdError as exc:
            raise PoolConfigError(exc.reason, knob=knob) from None

    def check(self) -> None:
        """Every DEFRAG_* knob parses, as Defrag::config insists (EXCEPT on a bad one)."""
        for knob in ("DEFRAG_WHOLE_MACHINE_EXPR", "DEFRAG_RANK", "DEFRAG_CANCEL_REQUIREMENTS",
                     "DEFRAG_REQUIREMENTS"):
            text = self.config.get(knob)
            if text is not None and text.strip():
                self._expr(knob)
        schedule = (self.config.get("DEFRAG_DRAINING_SCHEDULE") or "graceful").strip().lower()
        if schedule not in DRAIN_CAUSES:
            raise PoolConfigError(f"unknown draining schedule {schedule!r} (graceful, quick, fast)",
                                  knob="DEFRAG_DRAINING_SCHEDULE")
        for knob in ("DEFRAG_INTERVAL", "DEFRAG_UPDATE_INTERVAL",
                     "DEFRAG_DRAINING_MACHINES_PER_HOUR", "DEFRAG_MAX_CONCURRENT_DRAINING",
                     "DEFRAG_MAX_WHOLE_MACHINES"):
            self.config.number(knob, 0)

    def _num(self, knob: str) -> float:
        return self.config.number(knob, 0.0)

    # ---- lifecycle -------------------------------------------------------------------------

    def boot(self) -> None:
        """Poll at once and every DEFRAG_INTERVAL; publish at once and every
        DEFRAG_UPDATE_INTERVAL (Defrag::config registers both timers with delay 0)."""
        interval = self._num("DEFRAG_INTERVAL")
        if interval > 0:
            self._every(interval, self.poll)
        self._every(self._num("DEFRAG_UPDATE_INTERVAL"), self.publish)

    def _every(self, interval: float, call: Callable[[], None]) -> None:
        def tick() -> None:
            call()
            if interval > 0:
                self.clock.call_later(interval, tick)

        self.clock.call_later(0, tick)

    # ---- the policy ------------------------------------------------------------------------

    def _ads(self, constraint: str, *extra: Expr) -> list[dict[str, Any]]:
        """Slot ads matching the base constraint, `constraint` and each of `extra`."""
        now = self.clock.now
        base = expr(f"({BASE_SLOT}) && ({constraint})")
        return [ad for ad in map(attrs_from_json, self.pool.slot_ads())
                if is_true(evaluate_policy(base, ad, None, now))
                and all(is_true(evaluate_policy(e, ad, None, now)) for e in extra)]

    @staticmethod
    def _machines(ads: list[dict[str, Any]]) -> list[str]:
        seen: dict[str, None] = {}
        for ad in ads:
            seen.setdefault(str(ad["Name"]).split("@", 1)[-1], None)
        return list(seen)

    def _by_me(self) -> str:
        return f'(DrainReason is undefined || DrainReason == "Defrag {self.name}")'

    def poll(self) -> None:
        """One Defrag::poll: count, cancel, then drain up to the number due."""
        now = self.clock.now
        prev, self.last_poll = self.last_poll, now
        interval = self._num("DEFRAG_INTERVAL")
        per_hour = self._num("DEFRAG_DRAINING_MACHINES_PER_HOUR")
        per_poll, extra_hour, extra_day = split_rate(per_hour, interval)
        if per_hour < 0 or interval > 3600:
            per_hour = 0
        num_to_drain = per_poll
        if prev:
            if int(prev) // 3600 != int(now) // 3600:
                num_to_drain += prorate(extra_hour, now - int(now) // 3600 * 3600, 3600, interval)
            if int(prev) // 86400 != int(now) // 86400:
                num_to_drain += prorate(extra_day, now - int(now) // 86400 * 86400, 86400, interval)
        by_me = self._by_me()
        draining = self._machines(self._ads(f"Draining && {by_me}"))
        whole = set(self._machines(self._ads(by_me, self._expr("DEFRAG_WHOLE_MACHINE_EXPR"))))
        self._count("MachinesDraining", len(draining))
        self._count("WholeMachines", len(whole))
        self._costs()
        cancelled = self._cancel(by_me)
        max_draining = self._num("DEFRAG_MAX_CONCURRENT_DRAINING")
        max_whole = self._num("DEFRAG_MAX_WHOLE_MACHINES")
        if num_to_drain <= 0 or math.ceil(per_hour) <= 0 or max_draining == 0 or max_whole == 0:
            return
        if 0 <= max_draining <= len(draining) or 0 <= max_whole <= len(whole):
            return
        requirements = self.config.get("DEFRAG_REQUIREMENTS")
        extra = (self._expr("DEFRAG_REQUIREMENTS"),) if requirements and requirements.strip() else ()
        rank = self._expr("DEFRAG_RANK")
        candidates = self._ads("Draining =!= true", *extra)
        candidates.sort(key=lambda ad: -as_number(evaluate_policy(rank, {}, ad, now), 0.0))
        done: set[str] = set()
        for ad in candidates:
            machine = str(ad["Name"]).split("@", 1)[-1]
            if machine in cancelled or machine in done or machine in whole:
                continue
            if self._drain(str(ad["Name"]), machine):
                done.add(machine)
                if len(done) >= num_to_drain:
                    break

    def _drain(self, slot: str, machine: str) -> bool:
        startd = self.pool.startd_for(slot)
        schedule = (self.config.get("DEFRAG_DRAINING_SCHEDULE") or "graceful").strip().lower()
        ok = startd is not None and startd.drain(schedule=schedule, reason=f"Defrag {self.name}",
                                                 resume_on_completion=True)
        self.stats["DrainSuccesses" if ok else "DrainFailures"] += 1
        self._recent.append((self.clock.now, "success" if ok else "failure"))
        if ok:
            self.drained.append((self.clock.now, machine))
        return ok

    def _cancel(self, by_me: str) -> set[str]:
        """Cancel draining where DEFRAG_CANCEL_REQUIREMENTS hold (poll_cancel)."""
        text = self.config.get("DEFRAG_CANCEL_REQUIREMENTS")
        if not text or not text.strip():
            return set()
        cancelled: set[str] = set()
        for ad in self._ads(f"Draining && {by_me}", self._expr("DEFRAG_CANCEL_REQUIREMENTS")):
            machine = str(ad["Name"]).split("@", 1)[-1]
            startd = self.pool.startd_for(str(ad["Name"]))
            if machine not in cancelled and startd is not None:
                startd.cancel_drain()
                cancelled.add(machine)
        return cancelled

    def _count(self, name: str, value: int) -> None:
        self.stats[name] = value
        self.stats[f"{name}Peak"] = max(self.stats[f"{name}Peak"], value)

    def _costs(self) -> None:
        """AvgDrainingBadput/AvgDrainingUnclaimed: each machine's totals over its daemon's
        age, summed, over the pool's cpus (queryDrainingCost, one ad per machine)."""
        badput = unclaimed = 0.0
        cpus = 0.0
        for ad in self.pool.slot_ads():
            if ad.get("SlotID") != 1 or "TotalMachineDrainingBadput" not in ad:
                continue
            age = float(ad.get("LastHeardFrom", 0)) - float(ad.get("DaemonStartTime", 0))
            if age <= 0:
                continue
            badput += float(ad["TotalMachineDrainingBadput"]) / age
            unclaimed += float(ad["TotalMachineDrainingUnclaimedTime"]) / age
            cpus += float(ad.get("TotalCpus", 0))
        if cpus > 0:
            self.stats["AvgDrainingBadput"] = badput / cpus
            self.stats["AvgDrainingUnclaimed"] = unclaimed / cpus

    # ---- the Defrag ad ---------------------------------------------------------------------

    def publish(self) -> None:
        """The Defrag ad (`condor_status -l -any -constraint 'MyType == "Defrag"'`)."""
        now = self.clock.now
        window = 10 * self._num("DEFRAG_INTERVAL")  # the stats window defrag.cpp configures
        while self._recent and self._recent[0][0] <= now - window:
            self._recent.popleft()
        ad: dict[str, Any] = {
            "MyType": "Defrag", "Name": self.name, "Machine": self.name,
            "MyAddress": f"<{self.name}:9618>", "LastHeardFrom": int(now), "MyCurrentTime": int(now),
            **{k: (round(v, 6) if isinstance(v, float) and not v.is_integer() else int(v))
               for k, v in self.stats.items()},
            "RecentDrainSuccesses": sum(1 for _, r in self._recent if r == "success"),
            "RecentDrainFailures": sum(1 for _, r in self._recent if r == "failure"),
        }
        self.emit(AdUpdated(ad_type="Defrag", name=self.name, ad=ad))
