"""The ledger: every pure fold composed into one state, with exactly-once event application.

All three runners (faust, embedded, replay) drive this one object, so they cannot disagree.
Duplicates are dropped here: ids of the form `<source>:<seq>` are deduplicated by the highest
seq seen per source (bounded memory); any other id (UUIDs from the CLI) by the id itself; a
duplicate with other content is rejected, naming both versions' checksums: a recent one's
content is held (`Dedup.digests`), an older one's the driver looks up in the log
(`Ledger.first_version`).
`config.changed` events update the knob overrides that are part of the state, so a replay
reproduces the configuration in force at every point of the log (but for LOG_PROOF_KNOBS,
which bound what the log may claim). The clock is the sources' evidence, not one source's
word (`Witnesses`); that evidence, each slot's last claim event, the clock's jumps and the
recent events' checksums travel in snapshots beside the canonical document
(`_evidence_doc`), which stays as it was.
"""
from __future__ import annotations

import copy
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.config import SettingsLike, negotiator_interval
from schemas.events import (AdInvalidated, AdminCommanded, AdsRefreshed, AdUpdated, ConfigChanged,
                            Envelope, content_checksum,
                            JobHistory, JobStarted, JobStopped, JobSubmitted, LimitChanged,
                            Matched, NegotiationCycled, Payload, PriorityChanged, QuotaComputed,
                            make_event)
from streams.core import accountant, collector, jobads, jobs, limits, outcomes, quotas, reconcile
from streams.core.accountant import AccountantConfig, AccountantState
from streams.core.collector import PoolState
from streams.core.jobads import JobAdsState
from streams.core.jobs import JobsState
from streams.core.limits import LimitState
from streams.core.outcomes import JobOutcomes, OutcomesState
from streams.core.reconcile import ReconcileConfig, ReconcileRow, ReconcileState
from streams.core.errors import EventRejectedError
from streams.core.userprio_ops import validate_admin

DERIVED_SOURCE: Final = "poolledger.ledger"
_envelope: Final = Envelope
# the job event types as constants: the compiled core looks an imported name up in the module's
# globals at every use, a Final one not
_STARTED: Final = JobStarted
_STOPPED: Final = JobStopped
_SUBMITTED: Final = JobSubmitted
_HISTORY: Final = JobHistory
_CYCLED: Final = NegotiationCycled
_PRIORITY_CHANGED: Final = PriorityChanged
_PRIORITY_TYPE: Final = PriorityChanged.TYPE
_PRIORITY_VERSION: Final = PriorityChanged.VERSION
_LIMIT_CHANGED: Final = LimitChanged
_LIMIT_TYPE: Final = LimitChanged.TYPE
_LIMIT_VERSION: Final = LimitChanged.VERSION
#: a snapshot's sections (`Ledger.to_sections`); the `LAZY_SECTIONS` ones are parsed on first use
SECTIONS: Final = ("ledger", "accountant", "limits", "reconcile", "pool", "jobs", "job_ads",
                   "outcomes", "matches", "running")
LAZY_SECTIONS: Final = ("pool", "jobs", "job_ads", "outcomes", "matches", "running")
#: how many of the latest events' content checksums the dedup keeps: a duplicate of one of
#: them is judged without asking the log (`Dedup.digests`, `Ledger.first_version`)
DIGESTS_KEPT: Final = 1024

#: the driver's port to the log (`Ledger.first_version`): the first event the log holds with
#: an id, or None
FirstVersion = Callable[[str], Envelope | None]


@dataclass(slots=True)
class Dedup:
    """Which events were seen, exactly, in memory bounded by the number of seq gaps.

    For ids of the form `<source>:<seq>` (seq >= 1): per source the highest seq seen and the
    seqs below it NOT seen, as sorted inclusive ranges `[lo, hi]`. A seq above the mark is new
    (the seqs it skips become a range); one inside a range is a late or reordered event, new
    too (its range is split); any other seq below the mark was seen: a duplicate. Ranges still
    open are lost updates, as condor_updates_stats counts them, except a leading one from seq
    1 (a source first heard mid-stream has lost nothing we know of). Any other id (UUIDs from
    the CLI, seq <= 0) is remembered by the id itself.

    For the latest DIGESTS_KEPT events seen it keeps their content, to tell a redelivery from
    another event reusing an id (a forged or conflicting duplicate) without asking the log;
    older ids are known by their marks only (`Ledger.first_version` finds their content).
    `ring` holds their ids in the order seen (from `oldest` on, once full), `recent` beside it
    each event seen since the dedup was built or restored (None for the ids a snapshot
    brought, whose checksums `digests` holds). An event's checksum (`content_checksum`) is
    taken only when asked, and the event found by its id only then (a scan of `ring`, in C):
    the hot path stores two references per event, no dict entry.
    The checksums travel in snapshots (`Ledger._evidence_doc`), not in `to_doc` (the golden
    digests' document).
    """

    high: dict[str, int] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    missing: dict[str, list[list[int]]] = field(default_factory=dict)
    recent: list[Envelope | None] = field(default_factory=list)
    digests: dict[str, int] = field(default_factory=dict)
    ring: list[str] = field(default_factory=list)
    #: where the oldest id of a full ring is
    oldest: int = 0

    def remember(self, env: Envelope) -> None:
        """Keep `env`, just seen for the first time (the oldest kept goes beyond
        DIGESTS_KEPT). Events are immutable and no fold changes an ad it is given, so its
        checksum taken later is the one it arrived with."""
        ring = self.ring
        if len(ring) < DIGESTS_KEPT:
            ring.append(env.id)
            self.recent.append(env)
            return
        at = self.oldest
        if self.digests:  # a snapshot's ids are still in the ring
            self.digests.pop(ring[at], None)
        ring[at] = env.id
        self.recent[at] = env
        self.oldest = at + 1 if at + 1 < DIGESTS_KEPT else 0

    def held(self, event_id: str) -> int | None:
        """The content checksum of the kept event `event_id` (None: not kept)."""
        try:
            at = self.ring.index(event_id)
        except ValueError:
            return None
        return self._checksum(at)

    def _checksum(self, at: int) -> int | None:
        env = self.recent[at]
        return content_checksum(env) if env is not None else self.digests.get(self.ring[at])

    def kept(self) -> list[list[Any]]:
        """The kept ids and checksums, oldest first (what snapshots hold)."""
        ring, at = self.ring, self.oldest
        order = [*range(at, len(ring)), *range(at)]
        return [[ring[i], self._checksum(i)] for i in order]

    def keep(self, kept: list[list[Any]]) -> None:
        """Restore what `kept` returned."""
        self.ring = [str(i) for i, _d in kept]
        self.digests = {str(i): int(d) for i, d in kept}
        self.recent = [None] * len(self.ring)
        self.oldest = 0

    def seen(self, env: Envelope) -> bool:
        """Record `env` as seen; True if it had been seen before (a duplicate)."""
        seq = env.seq
        if seq >= 1 and env.id == f"{env.source}:{seq}":
            return self.seen_seq(env.source, seq)
        if env.id in self.ids:
            return True
        self.ids.add(env.id)
        return False

    def knows(self, env: Envelope) -> bool:
        """Whether `env` was seen (`seen` would call it a duplicate), recording nothing."""
        seq = env.seq
        if seq >= 1 and env.id == f"{env.source}:{seq}":
            high = self.high.get(env.source)
            if high is None or seq > high:
                return False
            gaps = self.missing.get(env.source)
            if not gaps:
                return True
            i = bisect_right(gaps, seq, key=_first) - 1
            return i < 0 or seq > gaps[i][1]
        return env.id in self.ids

    def seen_seq(self, source: str, seq: int) -> bool:
        """`seen` for the id `<source>:<seq>` (seq >= 1)."""
        high = self.high.get(source)
        if high is None:
            high = 0
        if seq > high:
            if seq > high + 1:
                self.missing.setdefault(source, []).append([high + 1, seq - 1])
            self.high[source] = seq
            return False
        gaps = self.missing.get(source)
        if not gaps:
            return True
        i = bisect_right(gaps, seq, key=_first) - 1
        if i < 0:
            return True
        lo, hi = gaps[i]
        if seq > hi:
            return True
        if lo == hi:
            del gaps[i]
            if not gaps:
                del self.missing[source]
        elif seq == lo:
            gaps[i][0] = seq + 1
        elif seq == hi:
            gaps[i][1] = seq - 1
        else:
            gaps[i:i + 1] = [[lo, seq - 1], [seq + 1, hi]]
        return False

    def advance(self, source: str, first: int, last: int) -> None:
        """Seqs `first`..`last` of `source` were counted by an `ad.refreshed` instead of
        arriving as events: the mark moves to `last`; seqs skipped before `first` become a
        gap (those inside the range the refresh counted itself)."""
        high = self.high.get(source, 0)
        if last <= high:
            return
        if first > high + 1:
            self.missing.setdefault(source, []).append([high + 1, first - 1])
        self.high[source] = last

    def lost_updates(self) -> dict[str, int]:
        """Per source, the seqs skipped and still not seen (sources with none left out)."""
        out = {}
        for source, gaps in self.missing.items():
            n = sum(hi - lo + 1 for lo, hi in gaps if lo > 1)
            if n:
                out[source] = n
        return out

    def to_doc(self) -> dict[str, Any]:
        # "missing" only once there are gaps: a gap-free state serializes as it always did
        doc: dict[str, Any] = {"high": self.high, "ids": sorted(self.ids)}
        if self.missing:
            doc["missing"] = {s: [list(r) for r in gaps] for s, gaps in self.missing.items()}
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Dedup:
        missing = {str(s): [[int(lo), int(hi)] for lo, hi in gaps]
                   for s, gaps in doc.get("missing", {}).items()}
        return cls(dict(doc["high"]), set(doc["ids"]), missing)


def _first(gap: list[int]) -> int:
    return gap[0]


def _max_skew(settings: SettingsLike) -> float:
    """POOLLEDGER_MAX_EVENT_SKEW in seconds (its knob validates it; inf when unset)."""
    value = settings.get("POOLLEDGER_MAX_EVENT_SKEW")
    return float("inf") if value is None else float(value)


def _clock_rule(settings: SettingsLike) -> tuple[int, float]:
    """(POOLLEDGER_CLOCK_QUORUM, POOLLEDGER_CLOCK_LEAD): how many sources vouch for the
    ledger's clock, and how far one source's events may lead them."""
    quorum, lead = settings.get("POOLLEDGER_CLOCK_QUORUM"), settings.get("POOLLEDGER_CLOCK_LEAD")
    return (2 if quorum is None else max(1, int(quorum)),
            float("inf") if lead is None else float(lead))


#: knobs a `config.changed` on the log may not set: they bound what the log itself may claim
#: (an event's time, the clock's evidence, what counts as live), so only an administrator's
#: configuration sets them
LOG_PROOF_KNOBS: Final = frozenset({"POOLLEDGER_MAX_EVENT_SKEW", "POOLLEDGER_LIVE_WINDOW",
                                    "POOLLEDGER_CLOCK_QUORUM", "POOLLEDGER_CLOCK_LEAD"})


#: sources beyond the quorum whose times the clock's evidence keeps (leaders it outvotes)
_OUTLIERS: Final = 4
#: the clock's jumps a ledger remembers (`Ledger.clock_jumps`)
JUMPS_KEPT: Final = 1000


def _rank(lead: list[list[Any]], ts: float, source: str) -> int:
    """Where source's [ts, source] goes in `lead`, newest first, then by source."""
    for j in range(len(lead)):
        t = lead[j][0]
        if t < ts or (t == ts and lead[j][1] > source):
            return j
    return len(lead)


@dataclass(slots=True)
class Witnesses:
    """The evidence for the ledger's clock: the sources with the latest event times, each with
    its latest (`lead`: [time, source], latest first; the quorum and a few outliers).

    `clock` is the latest time `quorum` sources vouch for: the latest source's whose next
    `quorum - 1` lie within `bound` (POOLLEDGER_CLOCK_LEAD) behind it; while fewer sources
    have spoken, as many as have spoken vouch. The ledger (`Ledger.apply`) moves its clock
    to a time they vouch for, or by a negotiation cycle: one step off a vouched clock (the
    pool's time after a quiet spell, as HTCondor's accountant moves at each cycle), not a
    second. Any other event of one source leads it by POOLLEDGER_CLOCK_LEAD at most, however
    far apart (a chain appended at a log's end, each within POOLLEDGER_MAX_EVENT_SKEW of the
    last, moves it no more than that), and an event further ahead is folded at the clock
    until another source's evidence catches up (an honest pool's daemons report within their
    ClassAd lifetimes). A source far behind that speaks after the clock moved contests it, and the clock goes back to what the quorum vouches for (so a log's first events are
    checked against each other: a first event in year 9999 is outvoted by the second
    source's).
    """

    lead: list[list[Any]] = field(default_factory=list)

    def saw(self, source: str, ts: float, quorum: int) -> bool:
        """Record `source`'s event at `ts`; True if the evidence changed. (`lead` stays
        sorted, newest first and then by source, by moving one entry: it is a few long.)"""
        lead = self.lead
        for i in range(len(lead)):
            entry = lead[i]
            if entry[1] == source:
                if ts <= entry[0]:
                    return False
                entry[0] = ts
                if i:
                    del lead[i]
                    lead.insert(_rank(lead, ts, source), entry)
                return True
        keep = quorum + _OUTLIERS
        if len(lead) >= keep and ts <= lead[-1][0]:
            return False
        lead.insert(_rank(lead, ts, source), [ts, source])
        del lead[keep:]
        return True

    def clock(self, quorum: int, bound: float) -> float:
        """The latest time `quorum` sources (or all, while fewer spoke) vouch for."""
        lead = self.lead
        k = min(quorum, len(lead)) - 1
        for i in range(len(lead) - k):
            if lead[i + k][0] >= lead[i][0] - bound:
                return float(lead[i][0])
        return float(lead[k][0])

    def to_doc(self) -> list[list[Any]]:
        return [list(e) for e in self.lead]

    @classmethod
    def from_doc(cls, doc: list[list[Any]]) -> Witnesses:
        return cls([[float(t), str(s)] for t, s in doc])


# which sections fold which payload types (bits); the collector's `tick` runs for the others
_ACCT, _POOL, _JOBS, _LIMITS, _QUOTAS, _CONFIG, _OUTCOMES, _RECONCILE = 1, 2, 4, 8, 16, 32, 64, 128
_ALL: Final = _ACCT | _POOL | _JOBS | _LIMITS | _QUOTAS | _CONFIG | _OUTCOMES | _RECONCILE
_FOLDS: dict[type, int] = {
    JobSubmitted: _JOBS,
    JobStarted: _ACCT | _JOBS | _LIMITS,
    JobStopped: _ACCT | _JOBS | _LIMITS,
    JobHistory: _JOBS | _LIMITS,
    AdUpdated: _POOL | _RECONCILE,
    AdInvalidated: _POOL,
    AdsRefreshed: _POOL,
    NegotiationCycled: _ACCT | _QUOTAS | _OUTCOMES,
    AdminCommanded: _ACCT,
    ConfigChanged: _ALL,
    Matched: _OUTCOMES,
    PriorityChanged: 0,
    QuotaComputed: 0,
    LimitChanged: 0,
}


def _quota_fold(led: Ledger, env: Envelope, out: list[Payload]) -> list[Payload]:
    """`Ledger._quota_fold`, answered without a call while the quota fold is known to
    announce once per cycle (`Ledger._quotas_per_event`'s memo)."""
    known = led._quota_mode
    if known is not None and not known[2] and known[0] is led.quotas and known[1] is led.quota_cfg:
        return out
    return led._quota_fold(env, out)


def _on_submitted(led: Ledger, env: Envelope, d: JobSubmitted, ts: float) -> list[Payload]:
    key = f"{d.schedd}#{d.job_id}"  # jobs.job_key, built once for every section
    jobs.on_submitted(led._jobs, d, ts, key)
    jobads.on_submitted(led._job_ads, d, key)
    outcomes.on_submitted(led._outcomes, d, ts, key)
    return _quota_fold(led, env, [])


def _on_started(led: Ledger, env: Envelope, d: JobStarted, ts: float) -> list[Payload]:
    cause = env.id
    key = f"{d.schedd}#{d.job_id}"  # jobs.job_key, built once for every section
    out = accountant.on_started(led._accountant, d, ts, led.acct_cfg, cause)
    jobs.on_started(led._jobs, d, key)
    outcomes.on_started(led._outcomes, d, ts, key)
    found = limits.on_started(led._limits, d, led.limit_cfg, cause, key)
    if found:
        out += found
    return _quota_fold(led, env, out)


def _on_stopped(led: Ledger, env: Envelope, d: JobStopped, ts: float) -> list[Payload]:
    cause = env.id
    key = f"{d.schedd}#{d.job_id}"  # jobs.job_key, built once for every section
    out = accountant.on_stopped(led._accountant, d, ts, led.acct_cfg, cause)
    jobs.on_stopped(led._jobs, d, key)
    jobads.on_stopped(led._job_ads, d, key)
    outcomes.on_stopped(led._outcomes, d, ts)
    found = limits.on_stopped(led._limits, d, led.limit_cfg, cause, key)
    if found:
        out += found
    return _quota_fold(led, env, out)


def _on_history(led: Ledger, env: Envelope, d: JobHistory, ts: float) -> list[Payload]:
    named = jobs.history_job(d.ad)  # once for every section
    jobs.on_history(led._jobs, named)
    jobads.on_history(led._job_ads, d, named)
    outcomes.on_history(led._outcomes, d, named)
    return _quota_fold(led, env, limits.on_history(led._limits, named, led.limit_cfg, env.id))


class Ledger:
    """The materialized state of the pool: accountant, pool ads, jobs, quotas, limits."""

    def __init__(self, settings: SettingsLike, configs: tuple[Any, ...] | None = None) -> None:
        """A fresh ledger under `settings`; `configs` are the section configs already built
        from them (`_configs_now` of a ledger under the same settings: `__copy__`)."""
        self.base = settings
        self.knobs: dict[str, str] = {}
        self.dedup = Dedup()
        self.applied = 0
        self.rejected = 0  # events seen but not folded (EventRejectedError): dead-lettered
        self.now: float | None = None
        self.witnesses = Witnesses()
        #: whether a source lagging the clock by more than POOLLEDGER_CLOCK_LEAD spoke since
        #: the latest source moved it: then the clock is what the quorum vouches for
        self.contested = False
        #: per slot its last claim event: [time, job id, stopped, event id] (`_claim`)
        self.claims: dict[str, list[Any]] = {}
        #: the events that moved the clock by more than a negotiation cycle: [event id, from,
        #: to], the latest JUMPS_KEPT of them (`clock_jumps`)
        self.jumps: list[list[Any]] = []
        self.derived_seq = 0
        #: the driver's lookup of an id's first version in the log (None: no log), asked only
        #: for a duplicate whose first version is older than the dedup's window (rare), so
        #: every conflicting duplicate is named however old its first version
        self.first_version: FirstVersion | None = None
        self._accountant = AccountantState()
        self._pool = PoolState()
        self._jobs = JobsState()
        self.quotas = quotas.QuotaState()
        self._limits = LimitState()
        self._job_ads = JobAdsState()
        self._outcomes = OutcomesState()
        self._reconcile = ReconcileState()
        # the sections of a snapshot (`from_sections`) while its `LAZY_SECTIONS` ones are not parsed
        # yet (a mapping that may read each from the log when asked); None: all parsed
        self._unparsed: Mapping[str, bytes] | None = None
        # configurations already built, by knob overrides (they are pure functions of them)
        self._configs: dict[frozenset[tuple[str, str]], tuple[Any, ...]] = {}
        self._quota_mode: tuple[Any, Any, bool] | None = None
        if configs is None:
            self._configure(settings)
        else:
            self._restore_configs(configs)

    def __copy__(self) -> Ledger:
        """A shallow copy: every section shared, nothing copied (a negotiator's view). Written
        out because the compiled class has no `__dict__` for `copy.copy` to copy."""
        new = Ledger(self.base, self._configs_now())
        new.knobs, new.dedup, new.applied, new.now = self.knobs, self.dedup, self.applied, self.now
        new.witnesses, new.claims, new.jumps = self.witnesses, self.claims, self.jumps
        new.contested = self.contested
        new.derived_seq, new.rejected = self.derived_seq, self.rejected
        new.first_version = self.first_version
        new._accountant, new._pool, new._jobs = self.accountant, self.pool, self.jobs
        new.quotas, new._limits, new._job_ads = self.quotas, self.limits, self.job_ads
        new._outcomes = self.outcomes
        new._reconcile = self._reconcile
        new._configs, new._quota_mode = self._configs, self._quota_mode
        return new

    def _configure(self, settings: SettingsLike) -> None:
        self.settings = settings
        self.acct_cfg = AccountantConfig.from_settings(settings)
        self.pool_cfg = collector.PoolConfig.from_settings(settings)
        self.jobs_cfg = jobs.JobsConfig.from_settings(settings)
        self.quota_cfg = quotas.QuotaConfig.from_settings(settings)
        self.limit_cfg = limits.LimitConfig.from_settings(settings)
        self.reconcile_cfg = ReconcileConfig.from_settings(settings)
        self.max_skew = _max_skew(settings)
        self.quorum, self.lead = _clock_rule(settings)
        self.cycle = negotiator_interval(settings)

    def _configs_now(self) -> tuple[Any, ...]:
        return (self.settings, self.acct_cfg, self.pool_cfg, self.jobs_cfg, self.quota_cfg,
                self.limit_cfg, self.reconcile_cfg, self.max_skew, self.quorum, self.lead,
                self.cycle)

    def _restore_configs(self, configs: tuple[Any, ...]) -> None:
        (self.settings, self.acct_cfg, self.pool_cfg, self.jobs_cfg, self.quota_cfg,
         self.limit_cfg, self.reconcile_cfg, self.max_skew, self.quorum, self.lead,
         self.cycle) = configs

    def apply(self, env: Envelope) -> list[Envelope]:
        """Fold one event into every section; returns the derived events (none for a duplicate).

        The ledger's clock (`now`) stands on the evidence of several sources (`Witnesses`):
        one source's word never moves it beyond POOLLEDGER_CLOCK_LEAD of what the others
        vouch for, but for one negotiation cycle's step; an event ahead of the clock is folded
        at the clock. Raises EventRejectedError for an event it
        will not fold: too far ahead of the clock (POOLLEDGER_MAX_EVENT_SKEW; the clock does
        not move), a knob the log may not set (LOG_PROOF_KNOBS) or an invalid knob value or
        admin edit, an ad older than the one held (`collector.stale`), a job start older than
        its slot's last claim event (`_claim`), a seen id with other content (a conflicting
        duplicate: both checksums named; beyond the latest DIGESTS_KEPT events the first
        version comes from the log, `first_version`), or any failure of a fold on
        it (a poison event; what the fold changed before failing stays, identically in every
        runner). The event counts as seen (a redelivery is a duplicate) and in `rejected`, not `applied`;
        runners dead-letter it.

        Each section is called only for the event types it folds (`_FOLDS`); the collector's
        clock, sequence bookkeeping and expiry run for every event (`collector.tick`), and the
        quota fold for every event only while it announces per event. The job events (most of
        a log) go through entry points specialised per type, which do the same.
        """
        if self._unparsed is not None:  # restored from sections: the folds need them all
            self._parse_sections()
        # Dedup.seen, its common case inlined (the hot path): the next seq of its source
        source, seq = env.source, env.seq
        high = self.dedup.high
        last = high.get(source)
        if last is not None and seq == last + 1 and env.id == f"{source}:{seq}":
            high[source] = seq
        elif self.dedup.seen(env):
            self._duplicate(env)
            return []
        self.dedup.remember(env)
        ts = env.ts
        now = self.now
        if now is not None and ts - now > self.max_skew:
            self.rejected += 1
            raise EventRejectedError(
                env.id, f"event time {ts:.0f} is {ts - now:.0f}s ahead of the ledger's clock "
                        f"{now:.0f} (POOLLEDGER_MAX_EVENT_SKEW = {self.max_skew:g})")
        lead = self.witnesses.lead
        if lead and lead[0][1] == source:  # the latest source again (the common case)
            if ts > lead[0][0]:
                lead[0][0] = ts
        else:
            self.witnesses.saw(source, ts, self.quorum)
        if self.contested:
            now = self._vouched(env.id)
        elif now is None or ts > now:
            k = min(self.quorum, len(lead)) - 1
            if now is None or lead[k][0] >= ts - self.lead or (
                    type(env.data) is _CYCLED and self.witnesses.clock(self.quorum, self.lead) >= now):
                # vouched for by the quorum, or a negotiation cycle one step off a clock the
                # quorum vouched for (the pool's time after a quiet spell)
                if now is not None and ts - now > self.cycle:
                    self._jumped(env.id, now, ts)
                self.now = now = ts
            else:  # ahead of the quorum: only the quorum moves it on
                now = self._vouched(env.id)
        elif now - ts > self.lead and self._contradicts(source, now):
            self.contested = True  # a source far behind speaks: the lead is not agreed
            now = self._vouched(env.id)
        if ts > now:  # ahead of what the sources vouch for: folded at the clock
            env = _envelope(env.id, env.type, env.v, now, source, env.seq, env.data)
            ts = now
        try:
            out = self._dispatch(env, ts, source, seq)
        except EventRejectedError:
            self.rejected += 1
            raise
        except Exception as exc:  # noqa: BLE001 - a poison event is dead-lettered, not fatal
            self.rejected += 1
            raise EventRejectedError(env.id, f"fold failed: {type(exc).__name__}: {exc}") from exc
        self.applied += 1
        if not out:
            return []
        # what make_event builds for each (source DERIVED_SOURCE, the next derived seq)
        seq = self.derived_seq
        fts = float(ts)
        envelope = _envelope
        derived = []
        for p in out:
            seq += 1
            kind = type(p)  # the common kinds' wire type and version without two look-ups
            if kind is _PRIORITY_CHANGED:
                derived.append(envelope(f"{DERIVED_SOURCE}:{seq}", _PRIORITY_TYPE,
                                        _PRIORITY_VERSION, fts, DERIVED_SOURCE, seq, p))
            elif kind is _LIMIT_CHANGED:
                derived.append(envelope(f"{DERIVED_SOURCE}:{seq}", _LIMIT_TYPE,
                                        _LIMIT_VERSION, fts, DERIVED_SOURCE, seq, p))
            else:
                derived.append(envelope(f"{DERIVED_SOURCE}:{seq}", p.TYPE, p.VERSION, fts,
                                        DERIVED_SOURCE, seq, p))
        self.derived_seq = seq
        return derived

    def _duplicate(self, env: Envelope) -> None:
        """`env` repeats a seen id: nothing if it is the event seen (a redelivery, or an id
        the log never held: one an `ad.refreshed` counted); else EventRejectedError naming
        both versions' checksums. The first version's checksum is held for the latest
        DIGESTS_KEPT events, and asked of the log (`first_version`) for older ones."""
        held = self.dedup.held(env.id)
        if held is None:
            first = self.first_version(env.id) if self.first_version is not None else None
            if first is None:
                return
            held = content_checksum(first)
        digest = content_checksum(env)
        if held == digest:
            return
        self.rejected += 1
        raise EventRejectedError(
            env.id, f"a different event with this id was seen already (content checksum "
                    f"{digest:016x}, the one seen {held:016x}): a conflicting duplicate, not folded")

    def _contradicts(self, source: str, now: float) -> bool:
        """Whether `source`, speaking now, still lags the clock `now` by more than
        POOLLEDGER_CLOCK_LEAD (its latest event too, not only this late one)."""
        for entry in self.witnesses.lead:
            if entry[1] == source:
                return bool(now - entry[0] > self.lead)
        return True

    def _vouched(self, event_id: str) -> float:
        """The clock the quorum vouches for, moved forward to it; while the lead is contested
        also back (the contested leader had moved it), and the contest ends once the latest
        source is within POOLLEDGER_CLOCK_LEAD of the quorum again."""
        clock = self.witnesses.clock(self.quorum, self.lead)
        now = self.now
        if now is None or clock > now:
            if now is not None and clock - now > self.cycle:
                self._jumped(event_id, now, clock)
            self.now = now = clock
        elif clock < now and self.contested:
            self._rewind(clock)
            now = clock
        if self.contested and clock >= self.witnesses.lead[0][0]:
            self.contested = False
        return now

    def _jumped(self, event_id: str, before: float, after: float) -> None:
        jumps = self.jumps
        jumps.append([event_id, before, after])
        if len(jumps) > JUMPS_KEPT:
            del jumps[:len(jumps) - JUMPS_KEPT]

    def _rewind(self, clock: float) -> None:
        """The clock one source moved, outvoted once others spoke: back to `clock`, the
        sections' clocks too (what they folded at the old one stays, as folded)."""
        self.now = clock
        pool = self._pool
        if pool.now is not None and pool.now > clock:
            pool.now = clock
        acct = self._accountant
        if acct.last_update_time is not None and acct.last_update_time > clock:
            acct.last_update_time = clock

    def _dispatch(self, env: Envelope, ts: float, source: str, seq: int) -> list[Payload]:
        """Every section that folds `env` (from `source`, numbered `seq`, at `ts`): the job
        events through their specialised entry points, the rest through `_fold`; the derived
        payloads."""
        data = env.data
        kind = type(data)
        if kind is _STARTED or kind is _STOPPED:
            self._claim(env, data, ts)
        # the job events (most of a log) go straight to their specialised entry points (same
        # sections as `_fold`; the collector's clock first, which no other section reads), once
        # the accountant has its clock (its first event sets it, whatever the type); direct
        # calls, which the compiled core makes cheap
        if self._accountant.last_update_time is None or not (
                kind is _STARTED or kind is _STOPPED or kind is _SUBMITTED or kind is _HISTORY):
            return self._fold(env, data, ts)
        collector.tick(self._pool, ts, source, seq, self.pool_cfg)
        if kind is _STARTED:
            return _on_started(self, env, data, ts)
        if kind is _STOPPED:
            return _on_stopped(self, env, data, ts)
        if kind is _SUBMITTED:
            return _on_submitted(self, env, data, ts)
        return _on_history(self, env, data, ts)

    def _claim(self, env: Envelope, data: JobStarted | JobStopped, ts: float) -> None:
        """A job's life on a slot moves only forward: a `job.started` older than the slot's
        last claim event (its own stop, or a later job's start or stop) is late, and taking
        the slot would bring a finished job back or end a newer claim: EventRejectedError,
        naming the newer event. Otherwise the slot's last claim event becomes this one."""
        slot = data.slot
        claims = self.claims
        last = claims.get(slot)
        if last is None or ts >= last[0]:
            claims[slot] = [ts, data.job_id, type(data) is _STOPPED, env.id]
        elif type(data) is _STARTED:
            what = ("its own job.stopped" if last[1] == data.job_id and last[2] else
                    f"job {last[1]}'s job.{'stopped' if last[2] else 'started'}")
            raise EventRejectedError(
                env.id, f"job.started of {data.job_id} on {slot} at {ts:.0f} is older than "
                        f"{what} there at {last[0]:.0f} ({last[3]}): a job's lifecycle only "
                        "moves forward")
        # a late stop is folded (it ends the claim it names) and moves no mark

    def _fold(self, env: Envelope, data: Any, ts: float) -> list[Payload]:
        """Every section that folds `data`'s type (`_FOLDS`), in order; the derived payloads."""
        folds = _FOLDS.get(type(data))
        if folds is None:  # a type no section folds, or a subclass: every section, as before
            folds = _ALL
        out: list[Payload] = []
        change = self._prepare_config(env, data) if folds & _CONFIG else None
        if folds & _ACCT or self._accountant.last_update_time is None:
            out = accountant.apply(self._accountant, env, self.acct_cfg)
        if folds & _POOL:
            late = collector.stale(self._pool, data, ts)
            if late is not None:
                raise EventRejectedError(env.id, late)
            collector.step(self._pool, env, self.pool_cfg, checked=True)
            if isinstance(data, AdsRefreshed):
                for r in data.refreshes:
                    self.dedup.advance(r.source, r.first, r.last)
        else:
            collector.tick(self._pool, ts, env.source, env.seq, self.pool_cfg)
        if folds & _RECONCILE and isinstance(data, AdUpdated) \
                and data.ad_type == reconcile.ACCOUNTING:
            reconcile.on_accounting_ad(self._reconcile, data.ad, data.name, ts, self._accountant,
                                       self.quotas.quotas, self.acct_cfg, self.reconcile_cfg)
        if folds & _JOBS:
            jobs.step(self._jobs, env, self.jobs_cfg)
            if isinstance(data, JobSubmitted):
                key = jobs.job_key(data.schedd, data.job_id)
                jobads.on_submitted(self._job_ads, data, key)
                outcomes.on_submitted(self._outcomes, data, ts, key)
            elif isinstance(data, JobStarted):
                outcomes.on_started(self._outcomes, data, ts, jobs.job_key(data.schedd, data.job_id))
            elif isinstance(data, JobStopped):
                jobads.on_stopped(self._job_ads, data, jobs.job_key(data.schedd, data.job_id))
                outcomes.on_stopped(self._outcomes, data, ts)
            elif isinstance(data, JobHistory):
                named = jobs.history_job(data.ad)
                jobads.on_history(self._job_ads, data, named)
                outcomes.on_history(self._outcomes, data, named)
        if folds & _OUTCOMES:
            if isinstance(data, NegotiationCycled):
                outcomes.on_cycle(self._outcomes, data, ts, self.knobs)
            elif isinstance(data, Matched):
                outcomes.on_matched(self._outcomes, data, ts)
        if folds & _LIMITS:
            found = limits.apply(self._limits, env, self.limit_cfg)
            if found:
                out += found
        if folds & _QUOTAS or self._quotas_per_event():
            found = quotas.apply(self.quotas, env, self.quota_cfg, pool_state=self._pool,
                                 jobs_state=self._jobs, accountant_state=self._accountant)
            if found:
                out += found
        if change is not None:
            self._quota_mode = None
            self._install_config(*change)
        return out

    def _quota_fold(self, env: Envelope, out: list[Payload]) -> list[Payload]:
        """The quota fold for an event it does not fold itself: only while it announces per
        event (`_fold`'s rule), its derived payloads appended to `out`."""
        if self._quotas_per_event():
            found = quotas.apply(self.quotas, env, self.quota_cfg, pool_state=self._pool,
                                 jobs_state=self._jobs, accountant_state=self._accountant)
            if found:
                out += found
        return out

    def _quotas_per_event(self) -> bool:
        """Whether the quota fold announces per event (POOLLEDGER_QUOTA_UPDATES=event) now
        (remembered until a knob changes or the quota state or its config is replaced)."""
        known = self._quota_mode
        if known is not None and known[0] is self.quotas and known[1] is self.quota_cfg:
            return known[2]
        per_event = self.quotas.effective(self.quota_cfg).announce != "cycle"
        self._quota_mode = (self.quotas, self.quota_cfg, per_event)
        return per_event

    def _prepare_config(self, env: Envelope, d: ConfigChanged
                        ) -> tuple[dict[str, str], frozenset[tuple[str, str]], tuple[Any, ...]]:
        """The knob overrides, their key and the configs after `d`, built before any section
        folds it: a value the settings refuse rejects the event (EventRejectedError)."""
        if d.knob.upper() in LOG_PROOF_KNOBS:
            raise EventRejectedError(env.id, f"config.changed {d.knob} = {d.value!r}: {d.knob.upper()} "
                                     "bounds what the log may claim; only an administrator's "
                                     "configuration sets it, not an event on the log")
        candidate = dict(self.knobs)
        candidate[d.knob.upper()] = d.value
        key = frozenset(candidate.items())
        known = self._configs.get(key)
        if known is not None:
            return candidate, key, known
        previous = self._configs_now()
        try:
            self._configure(self.base.with_overrides(candidate))
            return candidate, key, self._configs_now()
        except Exception as exc:  # noqa: BLE001 - any refusal of the value, named in the reason
            raise EventRejectedError(env.id, f"config.changed {d.knob} = {d.value!r}: {exc}"
                                     ) from exc
        finally:
            self._restore_configs(previous)

    def _install_config(self, candidate: dict[str, str], key: frozenset[tuple[str, str]],
                        configs: tuple[Any, ...]) -> None:
        self._restore_configs(configs)
        self.knobs = candidate
        if key not in self._configs:
            if len(self._configs) >= 256:
                self._configs.clear()
            self._configs[key] = configs

    def _derived(self, payload: Payload, cause: Envelope) -> Envelope:
        self.derived_seq += 1
        return make_event(payload, ts=cause.ts, source=DERIVED_SOURCE, seq=self.derived_seq)

    # --- canonical form ------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        """Everything that defines the state, as JSON-ready data."""
        doc = self._core_doc()
        doc["pool"] = orjson.loads(self.pool.to_json())
        doc["jobs"] = orjson.loads(self.jobs.to_json())
        return doc

    def _core_doc(self) -> dict[str, Any]:
        """`to_doc` but the collector's ads and the job queue (the large sections)."""
        doc = self._core_doc_without_folds()
        doc["accountant"] = orjson.loads(self.accountant.to_json())
        doc["limits"] = orjson.loads(self.limits.to_json())
        return doc

    def _core_doc_without_folds(self) -> dict[str, Any]:
        """`_core_doc` but the accountant and the limits (a snapshot's "ledger" section)."""
        return {
            "knobs": self.knobs, "dedup": self.dedup.to_doc(), "applied": self.applied,
            # "rejected" only once some were: a state without rejections is as it always was
            **({"rejected": self.rejected} if self.rejected else {}),
            "now": self.now, "derived_seq": self.derived_seq,
            "quotas": orjson.loads(self.quotas.to_json()),
        }

    def _evidence_doc(self) -> dict[str, Any]:
        """What snapshots keep beside `to_doc` (the golden digests' document): the clock's
        witnesses and each slot's last claim event, evidence for judging later events, and
        the clock's jumps (`clock_jumps`), and the latest events' content checksums (`Dedup`)."""
        return {"witnesses": self.witnesses.to_doc(), "contested": self.contested,
                "claims": self.claims, "jumps": self.jumps,
                "checksums": self.dedup.kept()}

    def to_json(self) -> str:
        """Canonical JSON (sorted keys): runners compare it byte for byte."""
        return orjson.dumps(self.to_doc(), option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, settings: SettingsLike, text: str | bytes) -> Ledger:
        """Restore a ledger saved with `to_json` (the knob overrides are re-applied)."""
        return cls.from_doc(settings, orjson.loads(text))

    def to_snapshot(self) -> bytes:
        """What a durable snapshot stores: the canonical state with the clock's evidence, the
        job ads, the job outcomes and the reconciliation rows (which `to_json` leaves out), as
        sorted-key JSON (deterministic, floats round-trip)."""
        return orjson.dumps({"ledger": {**self.to_doc(), **self._evidence_doc()},
                             "job_ads": self.job_ads.to_doc(), "outcomes": self.outcomes.to_doc(),
                             "reconcile": self._reconcile.to_doc()}, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_snapshot(cls, settings: SettingsLike, raw: bytes) -> Ledger:
        """Restore a ledger saved with `to_snapshot` (the faust tables' form)."""
        doc = orjson.loads(raw)
        led = cls.from_doc(settings, doc["ledger"])
        led._job_ads = JobAdsState.from_doc(doc["job_ads"])
        # the faust tables written before they held the outcomes restore with none
        if "outcomes" in doc:
            led._outcomes = OutcomesState.from_doc(doc["outcomes"])
        if "reconcile" in doc:
            led._reconcile = ReconcileState.from_doc(doc["reconcile"])
        return led

    def to_sections(self) -> dict[str, bytes]:
        """What a durable snapshot stores, in sections (`SECTIONS`), each restored from its
        own bytes: "ledger" is the small part of the canonical document (knobs, dedup,
        counters, clock, quotas), then the accountant's submitter records, the limits' units
        in use, the reconciliation rows (`streams.core.reconcile`, one per negotiator and
        submitter: small, parsed at once), and the large folds a query like `userprio` never
        reads: the collector's ads, the job queue, the job ads, the job outcomes, the accountant's per-slot match
        records ("matches") and what each running job holds of the limits ("running");
        `from_sections` parses those on first use. Deterministic JSON (floats round-trip
        exactly); a section still unparsed since a restore is written as read."""
        raw = self._unparsed
        doc = self._core_doc_without_folds()
        doc.update(self._evidence_doc())
        out = {
            "ledger": orjson.dumps(doc, option=orjson.OPT_SORT_KEYS),
            "accountant": self._accountant.records_json(),
            "limits": self._limits.totals_json(),
            "reconcile": self._reconcile.to_json(),
        }
        if raw is not None:
            for name in LAZY_SECTIONS:
                out[name] = raw[name]
            return out
        out["pool"] = self._pool.to_json().encode()
        out["jobs"] = self._jobs.to_json().encode()
        out["job_ads"] = orjson.dumps(self._job_ads.to_doc(), option=orjson.OPT_SORT_KEYS)
        out["outcomes"] = orjson.dumps(self._outcomes.to_doc(), option=orjson.OPT_SORT_KEYS)
        out["matches"] = self._accountant.matches_json()
        out["running"] = self._limits.running_json()
        return out

    @classmethod
    def from_sections(cls, settings: SettingsLike, sections: Mapping[str, bytes], *,
                      lazy: bool = False) -> Ledger:
        """Restore a ledger saved with `to_sections`; with `lazy` the large folds (`LAZY_SECTIONS`)
        on first use (a fold, `to_doc`, any read of the pool, the jobs, the whole accountant
        or the limits; the submitter records and the units in use are read without them).
        Raises KeyError for a missing section, ValueError for an unreadable one (of those
        parsed now; a mapping that reads the log raises its own errors, when it reads)."""
        led = cls(settings)
        led._restore_core(orjson.loads(sections["ledger"]))
        led._accountant = AccountantState.from_records_json(sections["accountant"])
        led._limits = LimitState.from_totals_json(sections["limits"])
        led._reconcile = ReconcileState.from_json(sections["reconcile"])
        led._unparsed = sections
        if not lazy:
            led._parse_sections()
        return led

    def _parse_sections(self) -> None:
        """Parse the sections `from_sections` left for later (the big ones): all or, when
        one cannot be read or parsed (the error propagates), none, so a ledger is never
        left with some of its folds empty."""
        raw = self._unparsed
        if raw is None:
            return
        pool = PoolState.from_json(raw["pool"])
        queue = JobsState.from_json(raw["jobs"])
        job_ads = JobAdsState.from_doc(orjson.loads(raw["job_ads"]))
        done = OutcomesState.from_doc(orjson.loads(raw["outcomes"]))
        matches, running = raw["matches"], raw["running"]
        self._accountant.load_matches(matches)
        self._limits.load_running(running)
        self._pool, self._jobs, self._job_ads, self._outcomes = pool, queue, job_ads, done
        self._unparsed = None

    @property
    def accountant(self) -> AccountantState:
        """The accountant's fold, its match records included (parsed on first use after
        `from_sections`; the read side's submitter queries use `_accountant` without them)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._accountant

    @property
    def limits(self) -> LimitState:
        """The concurrency limits' fold, the running jobs' entries included (parsed on first
        use after `from_sections`; `limits_view` reads the units in use without them)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._limits

    @property
    def pool(self) -> PoolState:
        """The collector's fold (parsed on first use after `from_sections`)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._pool

    @property
    def jobs(self) -> JobsState:
        """The job queue's fold (parsed on first use after `from_sections`)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._jobs

    @property
    def job_ads(self) -> JobAdsState:
        """The job-ad fold (parsed on first use after `from_sections`)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._job_ads

    @property
    def outcomes(self) -> OutcomesState:
        """The job-outcome fold (parsed on first use after `from_sections`)."""
        if self._unparsed is not None:
            self._parse_sections()
        return self._outcomes

    @classmethod
    def from_doc(cls, settings: SettingsLike, doc: dict[str, Any]) -> Ledger:
        """Restore a ledger from `to_doc`'s data (the knob overrides are re-applied)."""
        led = cls(settings)
        led._restore_core(doc)
        dumps = orjson.dumps
        led._accountant = AccountantState.from_json(dumps(doc["accountant"]))
        led._pool = PoolState.from_json(dumps(doc["pool"]))
        led._jobs = JobsState.from_json(dumps(doc["jobs"]))
        led._limits = LimitState.from_json(dumps(doc["limits"]))
        return led

    def _restore_core(self, doc: dict[str, Any]) -> None:
        """The small part of a document: knobs (re-applied), dedup, counters, clock, quotas."""
        self.knobs = dict(doc["knobs"])
        if self.knobs:
            self._configure(self.base.with_overrides(self.knobs))
        self.dedup = Dedup.from_doc(doc["dedup"])
        # "checksums" (BLAKE2b); an older snapshot's "digests" were CRC-32s: not kept, the
        # log answers for those ids (`first_version`)
        self.dedup.keep(doc.get("checksums", []))
        self.applied = int(doc["applied"])
        self.rejected = int(doc.get("rejected", 0))
        self.now = doc["now"]
        # a document without the clock's witnesses (`to_json`'s): the restored clock stands
        # vouched for by as many as the quorum asks
        found = doc.get("witnesses")
        self.witnesses = (Witnesses.from_doc(found) if found is not None else
                          Witnesses([[float(self.now), f"<restored {i}>"]
                                     for i in range(self.quorum)] if self.now is not None else []))
        self.claims = {str(k): list(v) for k, v in doc.get("claims", {}).items()}
        self.jumps = [list(j) for j in doc.get("jumps", [])]
        self.contested = bool(doc.get("contested", False))
        self.derived_seq = int(doc["derived_seq"])
        self.quotas = quotas.QuotaState.from_json(orjson.dumps(doc["quotas"]))

    # --- read side -----------------------------------------------------------------------

    def lost_updates(self) -> dict[str, int]:
        """Per source, the updates its seq numbers skipped that never arrived."""
        return self.dedup.lost_updates()

    def priorities(self, now: float | None = None, *, all_groups: bool = False
                   ) -> dict[str, dict[str, Any]]:
        """Accountant records decayed to `now` (default: the last event time), by name (so a
        ledger restored from a snapshot, whose records come back in name order, answers
        exactly as the one that was saved); with `all_groups` also every configured group
        that has no record yet."""
        t = now if now is not None else (self.now or 0.0)
        groups = tuple(self.group_quotas()) if all_groups else ()
        return accountant.view(self._accountant, t, self.acct_cfg,
                               names=sorted(self._accountant.customers), groups=groups)

    def quotas_computed_now(self) -> bool:
        """Whether the quotas fold has no row for some configured group (no negotiation cycle
        folded since GROUP_NAMES named it): `group_quotas` then computes them for now."""
        eff = self.quotas.effective(self.quota_cfg)
        return bool(eff.group_names) and not eff.plan(eff.tree).names <= self.quotas.quotas.keys()

    def _quota_rows(self) -> dict[str, dict[str, Any]]:
        """The quota fold's rows (`quotas._asdict`'s keys), or computed now (`group_quotas`)."""
        if not self.quotas_computed_now():
            return self.quotas.quotas
        eff = self.quotas.effective(self.quota_cfg)
        demand = jobs.group_demand(self.jobs, eff.tree, eff.jobs, weighted=eff.use_weighted_demand)
        computed = quotas.compute_quotas(eff.tree, collector.pool_size(self.pool), demand, None, eff)
        return {g: {"config_quota": q.config_quota, "quota": q.quota,
                    "effective_quota": q.effective_quota, "subtree_quota": q.subtree_quota,
                    "surplus_policy": q.surplus_policy, "requested": q.requested}
                for g, q in computed.items()}

    def group_quotas(self) -> dict[str, dict[str, Any]]:
        """Per group the quota attributes condor_userprio -quotas shows (HTCondor names), for
        every group of GROUP_NAMES: as of the last negotiation cycle, or computed from the
        pool and demand at the last event when the fold has none yet (`quotas_computed_now`).
        EffectiveQuota is HTCondor's: the assigned quota (`group->quota`), not the allocation
        (`group_allocations`)."""
        return {g: {"ConfigQuota": q["config_quota"], "EffectiveQuota": q["quota"],
                    "SubtreeQuota": q["subtree_quota"], "SurplusPolicy": q["surplus_policy"],
                    "Requested": q["requested"]}
                for g, q in self._quota_rows().items()}

    def group_allocations(self) -> dict[str, float]:
        """Per group what it is negotiated with: its quota in use plus surplus (HTCondor's
        `allocated`, GroupResourcesAllocated in GROUP_SORT_EXPR), dated as `group_quotas`.
        No Accounting ad of HTCondor's carries it."""
        return {g: q["effective_quota"] for g, q in self._quota_rows().items()}

    def limits_view(self) -> dict[str, dict[str, float]]:
        """Per concurrency limit in use or configured: its maximum and units in use."""
        names = set(self._limits.in_use) | set(self._limits.announced)
        return {n: {"Max": self.limit_cfg.max_for(n), "InUse": self._limits.in_use.get(n, 0.0)}
                for n in sorted(names)}

    # --- read API: what the services ask of the ledger -------------------------------------
    # Nothing outside streams/core touches a fold's fields (tests/test_read_api.py checks it);
    # these answer from them, as plain data or small frozen views.

    @property
    def last_priority_update(self) -> float | None:
        """When the accountant last updated priorities (condor_userprio's "Last Priority
        Update"); None before its first event."""
        return self._accountant.last_update_time

    def submitter(self, name: str, now: float | None = None) -> dict[str, Any] | None:
        """One accountant record as `priorities` shows it (None: no record of `name`)."""
        if name not in self._accountant.customers:
            return None
        t = now if now is not None else (self.now or 0.0)
        return accountant.view(self._accountant, t, self.acct_cfg, names=(name,))[name]

    def priority_at(self, name: str, t: float) -> float | None:
        """`name`'s real user priority decayed to `t` (None: no record)."""
        if name not in self._accountant.customers:
            return None
        return accountant.priority_at(self._accountant, name, t, self.acct_cfg)

    def new_submitter(self, name: str) -> NewSubmitter:
        """What the accountant would start a submitter it has no record of with."""
        factor = accountant.default_factor(name, self.acct_cfg)
        return NewSubmitter(name, self.acct_cfg.groups.group_of(name), factor,
                            accountant.MIN_PRIORITY * factor)

    def priorities_at_cycle(self, now: float) -> dict[str, dict[str, Any]]:
        """Accountant records as they will be once a `negotiation.cycle` at `now` is folded
        (leases expired; in `htcondor` mode priorities updated), by name: HTCondor updates
        them at the start of a cycle, which the log records as the cycle event, so this
        previews its effect on a copy."""
        state = self.accountant.for_cycle()
        probe = Envelope("negotiator:preview", NegotiationCycled.TYPE, NegotiationCycled.VERSION,
                         float(now), "negotiator", 0, NegotiationCycled("preview", 0, float(now)))
        accountant.apply(state, probe, self.acct_cfg)
        return accountant.view(state, now, self.acct_cfg, names=sorted(state.customers))

    def check_admin(self, op: str, target: str, value: float | str | None,
                    duration: float | None) -> None:
        """Raise AdminCommandError when condor_userprio would refuse this edit now."""
        validate_admin(op, target, value, duration, self.accountant, self.acct_cfg)

    def current_ads(self, ad_type: str) -> list[tuple[str, dict[str, Any]]]:
        """(name, ad) of the collector's current non-absent ads of `ad_type`, by key."""
        return [(rec.name, rec.ad) for rec in collector.current_ads(self.pool, ad_type)]

    def held_ads(self) -> list[tuple[str, dict[str, Any]]]:
        """(MyType, ad) of every ad the collector holds (not absent), by key."""
        return [(rec.ad_type, rec.ad) for rec in collector.current_ads(self.pool)]

    def pool_size(self) -> float:
        """Σ SlotWeight of the current slot ads: the negotiator's pie."""
        return collector.pool_size(self.pool)

    def update_totals(self) -> tuple[int, int]:
        """Ad updates the collector received plus those lost (seq gaps), and those lost."""
        total = lost = 0
        for st in self.pool.stats.values():
            total += st["received"] + st["lost"]
            lost += st["lost"]
        return total, lost

    def job_records(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(job key, record) of every queued job in the demand fold: job_id, schedd,
        submitter, status (`jobs.IDLE`/`RUNNING`/`HELD`), cpus, weight, slot."""
        return iter(self.jobs.jobs.items())

    def job_record(self, key: str) -> Mapping[str, Any] | None:
        """The demand fold's record of one queued job by key (as `job_records` yields it)."""
        return self.jobs.jobs.get(key)

    def changed_jobs(self, reader: object) -> set[str] | None:
        """Keys of the queued jobs added, replaced or removed since `reader` last asked (None:
        it cannot know, e.g. at its first call or after another reader asked: read
        `job_records` whole). One reader at a time follows a queue (`jobs.take_changed`)."""
        return jobs.take_changed(self.jobs, reader)

    def requested(self) -> float:
        """What every queue asks for, summed over submitters (HTCondor's `requested`: the
        weighted running plus idle demand): the share plot's demand line."""
        return sum(d.requested for d in jobs.submitter_demand(self.jobs, self.jobs_cfg).values())

    def job_ad(self, key: str) -> tuple[str, Mapping[str, Any]] | None:
        """(schedd, ad as submitted) of a queued job by key (the job-ad fold), or None."""
        return self.job_ads.ads.get(key)

    def cycle_groups(self, size: float, usage: Mapping[str, float], now: float
                     ) -> CycleGroups | None:
        """This cycle's group quotas from the current pool size and demand, in
        GROUP_SORT_EXPR order at `now` given each group's `usage`; None without
        GROUP_NAMES. (The quota fold's state holds the last cycle's quotas under
        POOLLEDGER_QUOTA_UPDATES=cycle; the same values in event mode.)"""
        qcfg = self.quotas.effective(self.quota_cfg)
        if not qcfg.group_names:
            return None
        demand = jobs.group_demand(self.jobs, qcfg.tree, qcfg.jobs,
                                   weighted=qcfg.use_weighted_demand)
        current = dict(sorted(quotas.compute_quotas(qcfg.tree, size, demand, None, qcfg).items()))
        groups = tuple(CycleGroup(g, float(q.effective_quota), qcfg.autoregroups(g),
                                  qcfg.accepts_surplus(g)) for g, q in current.items())
        order = tuple(t.group for t in quotas.group_order(current, usage, qcfg, size, now))
        return CycleGroups(groups, order)

    def limit_inputs(self) -> LimitInputs:
        """Concurrency limits as a cycle reads them: maxima, default and units in use."""
        return LimitInputs(self.limits.effective(self.limit_cfg).max_for, self.limit_cfg.default,
                           dict(self.limits.in_use))

    def with_demand_of(self, other: Ledger) -> Ledger:
        """A shallow copy of this ledger that reads which jobs are queued, and their ads,
        from `other` (a named negotiator's view: its slots, accountant, quotas and limits,
        and the pool-wide queue). Nothing is copied but references."""
        view = copy.copy(self)
        view._jobs, view._job_ads = other.jobs, other.job_ads
        return view

    def collector_ads(self, ad_type: str | None = None, *, absent: bool | None = False
                      ) -> list[collector.AdRecord]:
        """The collector's ads of `ad_type` (every type when None), by key: absent False the
        ads it holds, True only those it holds as absent, None both (condor_status)."""
        return collector.current_ads(self.pool, ad_type, absent=absent)

    def collector_keyed_ads(self, ad_type: str | None = None
                            ) -> list[tuple[str, collector.AdRecord]]:
        """(key, ad) of the collector's ads of `ad_type`, absent ones too, unordered: what a
        query scans."""
        return collector.keyed_ads(self.pool, ad_type)

    def collector_ad(self, ad_type: str, name: str) -> collector.AdRecord | None:
        """One ad the collector holds, by MyType and Name (absent or not), else None."""
        return collector.get_ad(self.pool, ad_type, name)

    def collector_now(self) -> float | None:
        """The collector's clock: the latest event time it folded (condor_status's now)."""
        return self.pool.now

    def update_stats(self) -> dict[str, collector.UpdateStats]:
        """Per daemon (event source), the updates received and lost (condor_updates_stats)."""
        return collector.update_stats(self.pool)

    def job_outcomes(self, job_id: str) -> list[tuple[str, JobOutcomes]]:
        """(job key, copy) of each queued job with `job_id` as the outcome fold tells its life
        up to the last event: state, last match, the negotiation cycles that found it idle."""
        return outcomes.view(self.outcomes, job_id)

    def reconciliation(self) -> list[ReconcileRow]:
        """(copies of) every reconciliation row, by negotiator then name: the last values each
        negotiator's Accounting ads reported, PoolLedger's for the same record and time, the
        attributes drifting beyond the tolerance and since when (`streams.core.reconcile`)."""
        return [row.copy() for _neg, by in sorted(self._reconcile.rows.items())
                for _name, row in sorted(by.items())]

    def reconciliation_of(self, name: str) -> list[ReconcileRow]:
        """(copies of) the reconciliation rows of submitter or group `name`, one per negotiator
        that reported it, by negotiator."""
        out = []
        for _neg, by in sorted(self._reconcile.rows.items()):
            row = by.get(name)
            if row is not None:
                out.append(row.copy())
        return out

    def reconcile_tolerance(self) -> float:
        """The relative tolerance the reconciliation rows were judged with (its knob now)."""
        return self.reconcile_cfg.tolerance

    def knob_overrides(self) -> dict[str, str]:
        """The knobs the log's `config.changed` events set, by upper-case name (a copy)."""
        return dict(self.knobs)

    def negotiator_cycles(self, name: str) -> tuple[int, float, dict[str, str]] | None:
        """Negotiator `name`'s highest cycle number on the log, the time (`now`) of its
        latest cycle and the knob overrides in force then (a copy); None before its first."""
        found = self.outcomes.negotiators.get(name)
        return None if found is None else (found[0], found[1], dict(found[2]))

    def collector_view(self) -> tuple[collector.PoolState, Dedup]:
        """The collector fold's state and the duplicate marks themselves, handed over to a
        reader that folds on from them (gangliad resuming from a snapshot; this ledger must
        not fold any further then), or that only reads them while this ledger folds on
        (gangliad --reconcile)."""
        return self.pool, self.dedup

    def already_seen(self, env: Envelope) -> bool:
        """Whether folding `env` would drop it as a duplicate (nothing recorded)."""
        return self.dedup.knows(env)

    def clock_jumps(self) -> list[tuple[str, float, float]]:
        """(event id, clock before, clock after) of each event that moved the ledger's clock
        by more than a negotiation cycle (NEGOTIATOR_INTERVAL), oldest first (the latest
        JUMPS_KEPT; a ledger restored from `to_json` knows those after its restore)."""
        return [(str(e), float(a), float(b)) for e, a, b in self.jumps]

    def last_seq(self, source: str) -> int:
        """The highest sequence number of `source`'s events seen (0: none)."""
        return self.dedup.high.get(source, 0)


@dataclass(frozen=True, slots=True)
class NewSubmitter:
    """A submitter the accountant has no record of, as it would start it."""

    name: str
    group: str
    factor: float
    eup: float


@dataclass(frozen=True, slots=True)
class CycleGroup:
    """One group's input to a negotiation cycle."""

    name: str
    quota: float
    autoregroup: bool
    accept_surplus: bool


@dataclass(frozen=True, slots=True)
class CycleGroups:
    """The groups of a cycle, and the order GROUP_SORT_EXPR gives them."""

    groups: tuple[CycleGroup, ...]
    order: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LimitInputs:
    """Concurrency-limit maxima (`max_for(name)`), the default maximum, units in use."""

    max_for: Callable[[str], float]
    default: float
    usage: dict[str, float]
