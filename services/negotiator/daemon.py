"""`poolledger negotiator`: the negotiator as its own service on the log, with standbys.

Why a daemon of its own: HTCondor runs condor_negotiator beside the collector and, for high
availability, a second central manager whose condor_had takes over when the first dies.
Here every negotiator process folds the same log into the same ledger (the log is the truth),
so a standby is always warm; which one negotiates is a lease on the log
(`streams.log.lease`: a Kafka consumer group, or a lease with a deadline beside the
embedded log).

Event time drives the cycles, never the wall clock. A negotiator's next cycle is due one
NEGOTIATOR_INTERVAL (as the log's knobs said at that cycle) after its last `negotiation.cycle`
on the log (the log's first event time when there is none). The active negotiator reads the log to its
end; once the log's event time (the latest event time folded) has reached the due time, it runs
the cycle at that time. A log that ran on without any cycle for more than an interval (every
negotiator down) gets one cycle at its current event time, not one per missed interval.

Takeover, stated: the standby's first cycle is at most ONE interval of event time after the
last cycle the dead negotiator wrote, because the due time comes from the log, not from the
process. In wall-clock terms it comes once the lease moves (Kafka: the group's session
timeout, 6 s; the embedded log: its lease's deadline, POOLLEDGER_LEASE_TIMEOUT, 6 s, or at
once after a clean stop) and the log's event time has reached it.

Resuming: on the embedded log a negotiator starts from the newest usable snapshot the runner
stored (`streams.snapshot`; the ledger's outcome fold keeps each negotiator's last cycle, its
Negotiator ad its cycle statistics) and folds only the log after it.

Exactly once: a cycle's `negotiation.cycle`, its `match`es and the Negotiator and Accounting
ads go onto the log in ONE append (all or nothing, on both logs), numbered after the last
cycle on the log and with this daemon's source sequence continued from the log, so a
takeover neither reuses a cycle number nor leaves a sequence gap; before appending, the
active one checks, inside the lease's fence, that it still holds the lease at the epoch it
took (a stopped and resumed ex-leader does not) and that the log has not grown since it
looked (a stale holder re-reads instead of writing a second cycle for the same time).
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.config import SettingsLike, negotiator_interval
from schemas.events import Envelope, Matched, NegotiationCycled, Payload, make_event
from services.negotiator.service import JobAds, run_cycle
from services.pool.collector import NegotiatorAd, accounting_ads, cycle_ad_counts
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.lease import Lease, LeaseLostError
from streams.log.port import Log
from streams.log.topics import EVENTS, require_one_partition
from streams.replay import first_time, start_of

__all__ = ["NegotiatorDaemon", "Served"]

#: records folded between two renewals of the lease in a long fold (`follow`): ~50 ms of
#: folding, and a renewal is a clock read unless a tenth of the timeout has passed
RENEW_EVERY = 1000


@dataclass
class Served:
    """What one `serve` call did (for the command's summary and the tests)."""

    cycles: int = 0
    matches: int = 0


class NegotiatorDaemon:
    """One negotiator process: follows `topic`, and negotiates while it holds `lease`.

    `record_durations` False writes 0.0 as each cycle's duration, so a run's log is
    byte-for-byte reproducible (a standby's cycles equal the ones the active would have run).
    """

    def __init__(self, log: Log, settings: SettingsLike, lease: Lease, *, name: str,
                 topic: str = EVENTS, record_durations: bool = True,
                 warn: Callable[[str], None] | None = None) -> None:
        self.log, self.elog, self.topic, self.lease = log, EventLog(log), topic, lease
        self.name = name
        self.ledger = Ledger(settings)
        self.job_ads = JobAds()
        self.record_durations = record_durations
        require_one_partition(log, topic)
        self.positions: dict[int, int] = {0: 0}
        self.event_time: float | None = None  # the latest event time folded
        self.last_cycle = 0  # this negotiator's last cycle number on the log
        self.next_due: float | None = None  # that cycle's time plus the interval then
        self.seq = 0  # this daemon's last source sequence number on the log
        self.ads: NegotiatorAd | None = None  # built from the log's first event time
        self._resume(settings, warn)
        self.ledger.first_version = self.elog.first_version(topic)  # as the runners judge

    def _resume(self, settings: SettingsLike, warn: Callable[[str], None] | None) -> None:
        """Start from the newest usable snapshot of the embedded log (`warn` hears why one
        is not usable), where it holds everything a fold from the log's start would know:
        the ledger, this negotiator's last cycle and, in its last Negotiator ad, the
        statistics of its last cycles. Else (no snapshot, or its ad expired) fold from the
        start."""
        start = start_of(self.elog, settings, topic=self.topic, warn=warn)
        ledger, positions = start.ledger, start.positions
        if ledger is None or positions is None or ledger.now is None:
            return
        begun = first_time(self.elog, self.topic)
        if begun is None:
            return
        ads = NegotiatorAd(self.name, begun)
        last = ledger.negotiator_cycles(self.name)
        if last is not None:
            mine = [ad for name, ad in ledger.current_ads("Negotiator") if name == self.name
                    and ad.get("LastNegotiationCycleTime0") == int(last[1])]
            if not mine:
                return  # its ad of that cycle expired, or is not folded yet: only on the log
            ads = NegotiatorAd.from_ad(self.name, begun, mine[0])
        self.ledger, self.positions = ledger, dict(positions)
        self.event_time, self.seq, self.ads = ledger.now, ledger.last_seq(self.name), ads
        if last is not None:  # the interval in force at that cycle, as a fold would take it
            then = settings.with_overrides(last[2]) if last[2] else settings
            self.last_cycle, self.next_due = last[0], last[1] + negotiator_interval(then)

    # -- following the log ---------------------------------------------------------------

    def follow(self) -> int:
        """Fold everything the log holds beyond what was folded; how many records were read.
        The lease is renewed as the fold progresses (every RENEW_EVERY records), so a fold
        longer than its timeout (a start, a burst) does not lose it."""
        end = self.log.end_offsets(self.topic).get(0, 0)
        n = 0
        for record, env in self.elog.read(self.topic, start_positions=self.positions):
            n += 1
            self._fold(env)
            self.positions[0] = record.offset + 1
            if n % RENEW_EVERY == 0:
                self.lease.held()
        # records that failed validation were dead-lettered by the reader: step past them
        self.positions[0] = max(self.positions[0], end)
        return n

    def _fold(self, env: Envelope) -> None:
        if self.ads is None:
            self.ads = NegotiatorAd(self.name, env.ts)
        if env.source == self.name:
            self.seq = max(self.seq, env.seq)
        d = env.data
        ours = isinstance(d, NegotiationCycled) and d.negotiator == self.name
        # the ad's statistics from the state just before the cycle event: the same
        # state the active one computed them from, so every follower's ad agrees
        inputs = self._ad_inputs() if ours else None
        try:
            self.ledger.apply(env)
        except EventRejectedError:
            return  # the runners dead-letter it; the negotiator never follows it
        if inputs is not None and isinstance(d, NegotiationCycled):
            self.ads.cycle(d, **inputs)
            self.last_cycle = max(self.last_cycle, d.cycle)
            # the interval in force at the cycle, as the pool's clock steps by it: a
            # NEGOTIATOR_INTERVAL change on the log counts from the next cycle on
            self.next_due = d.now + self.interval()
        self.event_time = env.ts if self.event_time is None else max(self.event_time, env.ts)

    def _ad_inputs(self) -> dict[str, Any]:
        slots, schedds = cycle_ad_counts(self.ledger)
        limits = {n: v["InUse"] for n, v in self.ledger.limits_view().items()}
        return {"total_slots": slots, "candidate_slots": slots, "schedds": schedds,
                "limits": limits}

    # -- negotiating ---------------------------------------------------------------------

    def interval(self) -> float:
        """NEGOTIATOR_INTERVAL in force on the log (config.changed included)."""
        return negotiator_interval(self.ledger.settings)

    def due(self) -> float | None:
        """Event time of the next cycle, if the log's event time has reached it (else None)."""
        if self.event_time is None:
            return None
        if self.next_due is None:
            return self.event_time  # the first cycle: at the log's event time
        due = self.next_due
        if self.event_time < due:
            return None
        # every negotiator was down for more than an interval: one cycle now, not a backlog
        return due if self.event_time < due + self.interval() else self.event_time

    def negotiate(self, now: float) -> list[Payload]:
        """Run the cycle at event time `now` and append it; its payloads ([] when the log
        grew meanwhile: it is re-read and the cycle reconsidered)."""
        where = {self.topic: {str(p): o for p, o in sorted(self.positions.items())}}
        payloads = run_cycle(self.ledger, None, now, self.last_cycle + 1, where,
                             job_ads=self.job_ads, negotiator=self.name,
                             clock=time.perf_counter if self.record_durations else None)
        cycled = [p for p in payloads if isinstance(p, NegotiationCycled)]
        matches = [p for p in payloads if isinstance(p, Matched)]
        ads: list[Payload] = []
        assert self.ads is not None  # due() is None until an event was folded
        for c in cycled:
            ads.append(copy.deepcopy(self.ads).cycle(c, **self._ad_inputs()))
        ads += accounting_ads(self.ledger.priorities(now), self.ledger.group_quotas(), self.name)
        batch = [make_event(p, ts=now, source=self.name, seq=self.seq + i)
                 for i, p in enumerate([*cycled, *matches, *ads], start=1)]
        try:
            # a stale holder learns here that it lost the lease; on the embedded log the end
            # is checked inside the append's write transaction, so a holder stopped between
            # the two (a standby appending meanwhile) re-reads instead of writing
            with self.lease.fence(), (self.log.transaction() if isinstance(self.log, EmbeddedLog)
                                      else contextlib.nullcontext()):
                if self.log.end_offsets(self.topic).get(0, 0) != self.positions[0]:
                    return []
                self.elog.append(self.topic, batch)
        except LeaseLostError:
            return []
        self.follow()
        return [*cycled, *matches]

    def serve(self, *, until: Callable[[], bool], poll: float = 0.05,
              say: Callable[[str], None] | None = None) -> Served:
        """Follow the log and negotiate while holding the lease, until `until()` is true;
        `say` hears when this process becomes active and each cycle it writes."""
        served = Served()
        active = False
        while not until():
            read = self.follow()
            held = self.lease.held()
            if held != active and say is not None:
                say(f"active: next cycle {self.last_cycle + 1}" if held else "standing by")
            active = held
            now = self.due() if held else None
            if now is None:
                if not read:
                    time.sleep(poll)
                continue
            done = self.negotiate(now)
            if done:
                matched = sum(isinstance(p, Matched) for p in done)
                served.cycles += 1
                served.matches += matched
                if say is not None:
                    say(f"cycle {self.last_cycle} at {now:.0f}: {matched} matches")
        return served
