"""What the collector endpoint does with a command: updates and invalidations become events on
the log, queries and GET_PRIORITY are answered from the ledger folded from that log.

The backend folds the configured log with the one fold driver (`streams.runner.
EmbeddedRunner`): its own appends and everyone else's (negotiators, followers), so a query
answers from the same state `poolledger status` folds, and a restart resumes from the log.

Update streams and sequence numbers. HTCondor numbers each ad's updates (a daemon's
DCCollector keeps one UpdateSequenceNumber per ad, keyed by MyType, Name and Machine) and
restarts the count with the daemon (DaemonStartTime); the collector counts an update as lost
when the number skips within one DaemonStartTime, and nothing lost across a restart
(collector_stats.cpp). Here each ad is its own event source, `<MyType>/<Name>`, and its
events carry a sequence that never goes back: the ad's UpdateSequenceNumber plus an offset
that moves at each DaemonStartTime, so the ledger's duplicate marks stay bounded and
`updates-stats` reports exactly what condor_updates_stats would (an ad without sequence
numbers is numbered on, losing nothing, as HTCondor counts it).

Heartbeats. A daemon re-sends its ads every UPDATE_INTERVAL whether or not they changed; a
200,000-slot pool would write ~700 whole ads a second. An update whose attributes differ
from the ad as logged only in volatile ones (POOLLEDGER_COLLECTOR_VOLATILE_ATTRS: clocks,
load, idle times, statistics) is not logged. What the log then must still say, exactly, is
(a) until when the ad lives and (b) how many of its updates arrived. Both are only needed
when the fold would otherwise expire the ad: REFRESH_MARGIN seconds before its deadline (its
last logged time plus ClassAdLifetime) the heartbeats heard since are written as one entry
of an `ad.refreshed` event: the last heard time (the new deadline counts from it, as the
collector's), the range of sequence numbers and how many of them arrived, and the latest
values of the volatile attributes. A heartbeat heard inside that margin is written at once.
So an ad that keeps beating costs one small entry per ClassAdLifetime minus UPDATE_INTERVAL
(about one per two heartbeats at the defaults, ~100 bytes instead of a whole ad), whatever
its update rate; an ad that stops beating expires in the fold exactly when the collector
would drop it; lost updates inside a range are counted from the range. Queries see the
latest heartbeat of each ad (the fold's ad with its not-yet-logged volatile values), and
closing the backend logs every pending heartbeat, so the log then ends in the collector's
exact state.

Queries scan the fold's ads (unordered, as the collector's hash tables), evaluate the
constraint in a ClassAd kept per ad version (the one received, or built once from the fold's
JSON form), and answer with each ad rendered for the wire once per version (`RenderedAd`: its
old-syntax lines; the flusher renders new versions while idle); a projection picks lines by
position, once per ad shape, and an ad keeps its last projected answer. Building and printing
200,000 ClassAds per query would cost seconds.

Memory: the service holds millions of objects (each ad's JSON form in the fold, its
ClassAd, its rendering), almost none in reference cycles; a full garbage collection walks
them all (~2 s at 200,000 slots, measured: it landed in the second query after a fill). So
what a flush or a query leaves is frozen out of collection (`gc.freeze`, as the folds'
`streams.gcpolicy` does), and every SWEEP_EVERY seconds the flusher collects once in full.

The real negotiator's cycles. PoolLedger's accountant in htcondor mode
(POOLLEDGER_ACCOUNTING_MODE) updates priorities only at `negotiation.cycle` events, and in
shadow mode no negotiator of PoolLedger's writes any. The real negotiator's ads say when its
accountant updated: each Accounting ad carries `LastUpdate` (the accountant's LastUpdateTime,
set by UpdatePriorities), and the Negotiator ad carries its last NEGOTIATION_CYCLE_STATS_LENGTH
cycles (`LastNegotiationCycleTime<i>`, the cycle's start, and `...DurationPhase1<i>`, the time
spent fetching ads, after which matchmaker.cpp calls UpdatePriorities). So an ad of either
type that reports a cycle of its negotiator newer than the last one the log holds (by more
than CYCLE_SAME seconds: the two types' reports of one cycle may differ by a second, real
cycles lie NEGOTIATOR_MIN_INTERVAL apart) is preceded, in its batch, by a `negotiation.cycle`
of that negotiator at that time (its `now` and its event time: the moment the real accountant
updated, not the cycle's end, which lies the rest of the cycle later), numbered on from the
negotiator's last cycle, carrying no per-submitter statistics (the ads hold none). A cycle
older than the accountant's last update is not written (folding it would take the update
time back). The events are the endpoint's own (its source and sequence); their times lie in
the past, which the ledger's clock evidence accepts as any late event, and the jobs that
started after the cycle, already on the log, the accountant charges from after it. Off with
POOLLEDGER_COLLECTOR_CYCLES = False, which a log that PoolLedger's own negotiator also
writes needs: its cycles update the same accountant.

Private attributes (HTCondor's ClaimId, Capability, ClaimIdList, ClaimIds, ChildClaimIds,
TransferKey and anything named `_condor_priv*`) are removed before anything is logged or
kept, and a startd's private ad is never looked at.
"""
from __future__ import annotations

import fnmatch
import gc
import heapq
import logging
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import classad2

from schemas.classads import ad_from_json, ad_to_json
from schemas.config import SettingsLike
from schemas.events import (MAX_CYCLE, TS_MAX, TS_MIN, AdInvalidated, AdRefresh, AdsRefreshed,
                            AdUpdated, Envelope, NegotiationCycled, make_event)
from services.collector.cedar import ad_lines, is_private
from services.collector.port import CommandRefusedError, Peer, RenderedAd
from streams.core.ledger import Ledger
from streams.log.events import EventLog
from streams.log.port import Appended, Log, LogError
from streams.log.topics import EVENTS
from streams.runner import EmbeddedRunner

__all__ = ["LedgerCollector", "priority_ad"]

log = logging.getLogger("poolledger.collector")

#: always volatile: what the collector or the daemon's clock changes on every update
_ALWAYS_VOLATILE: Final = ("LastHeardFrom", "MyCurrentTime", "UpdateSequenceNumber")
#: the runner's consumer group for this service's folds (and snapshots)
GROUP: Final = "poolledger.collector"
#: appended events are batched: at most this many per append, or FLUSH_EVERY seconds apart
BATCH: Final = 2000
FLUSH_EVERY: Final = 0.05
#: seconds of each idle flusher tick spent rendering ads for the wire (`_warm`)
WARM_PER_TICK: Final = 0.02
#: seconds between full garbage collections (see "Memory" above)
SWEEP_EVERY: Final = 900.0
#: seconds a fold may wait for records already appended to become readable (Kafka)
FOLD_WAIT: Final = 30.0
#: what a query's TargetType may call the slot ads the fold keys as Machine (HTCondor 23+
#: names them Slot; its StartD ads are the startd daemons', kept apart)
_TYPE_ALIASES: Final = {"slot": "Machine", "machine": "Machine"}
#: seconds within which two reports of a negotiator's cycle are the same cycle (module
#: docstring, "The real negotiator's cycles")
CYCLE_SAME: Final = 5.0
#: the most cycles a Negotiator ad is read for (HTCondor's MAX_NEGOTIATION_CYCLE_STATS)
_MAX_CYCLE_STATS: Final = 100
_SPLIT = re.compile(r"[\s,]+")
#: an attribute's name at the start of a line of printOld()
_NAME = re.compile(rb"^([A-Za-z_][A-Za-z0-9_]*) = ", re.M)
Pick = Callable[[tuple[bytes, ...]], tuple[bytes, ...]]


@dataclass(slots=True)
class _Shape:
    """Ads rendered with the same attributes in the same order: where each attribute's
    line is, and per projection (lower-case names) the picker of its lines."""

    index: dict[str, int]
    picks: dict[tuple[str, ...], Pick] = field(default_factory=dict)


#: the shapes met so far, by their lines' attribute names
_SHAPES: dict[tuple[bytes, ...], _Shape] = {}
#: the projections asked for so far, interned
_PROJECTIONS: dict[tuple[str, ...], tuple[str, ...]] = {}


def _render(entry: _Cached) -> tuple[RenderedAd, _Shape]:
    """The ad's wire lines and its shape, kept in `entry`."""
    text = entry.cad.printOld().encode()
    lines = tuple(text.split(b"\n")[:-1])  # the text ends with a newline
    names = tuple(_NAME.findall(text))
    if len(names) != len(lines):  # a string with a newline of its own
        lines = tuple(ad_lines(entry.cad))
        names = tuple(line.split(b" = ", 1)[0] for line in lines)
    shape = _SHAPES.get(names)
    if shape is None:
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        shape = _SHAPES[names] = _Shape({n.decode().lower(): i for i, n in enumerate(names)})
    entry.whole, entry.shape = RenderedAd(lines), shape
    return entry.whole, shape


def _picker(positions: list[int]) -> Pick:
    """The lines at `positions`, as a tuple (itemgetter, in C, when there are two or more)."""
    if len(positions) >= 2:
        return cast(Pick, operator.itemgetter(*positions))
    return lambda lines: tuple(lines[i] for i in positions)


@dataclass(slots=True)
class _Cached:
    """A record's ClassAd (kept while `ad`, the fold's JSON form, or for a pending
    heartbeat `cad` itself is current) and its rendering for the wire, made on demand."""

    ad: dict[str, Any] | None
    cad: classad2.ClassAd
    whole: RenderedAd | None = None
    shape: _Shape | None = None
    #: the last projection answered (its interned names) and the answer
    projected: tuple[tuple[str, ...], RenderedAd] | None = None


@dataclass
class _Stream:
    """One ad's update stream: the incarnation (DaemonStartTime) whose numbers it follows,
    the offset from UpdateSequenceNumber to event seq, and the last event seq given out."""

    start: int | None
    base: int | None
    last: int


@dataclass
class _Logged:
    """An ad as the log holds it: its attributes, the stream that wrote it, and when the
    folds expire it (inf while its event is not folded yet: it was just written)."""

    ad: dict[str, Any]
    source: str
    deadline: float = math.inf


@dataclass
class _Beats:
    """Heartbeats of one ad not logged yet: event seqs first..last, `received` of them."""

    ad_type: str
    name: str
    source: str
    heard: float
    first: int
    last: int
    received: int
    ad: dict[str, Any]
    cad: classad2.ClassAd


@dataclass
class _Spec:
    """One ad type of a query: its constraint, result limit and projection."""

    ad_type: str | None  # None: every type ("Any")
    constraint: classad2.ExprTree | None
    limit: int
    projection: tuple[str, ...] | None  # lower case
    projection_expr: str | None = None  # a Projection that is an expression, its attribute
    skip_absent: bool = False


@dataclass
class _Pending:
    """What the next flush appends, in order."""

    items: list[Envelope | AdRefresh | NegotiationCycled] = field(default_factory=list)
    cads: dict[str, classad2.ClassAd] = field(default_factory=dict)  # key -> ad written
    envs: list[Envelope] | None = None  # the items as events, once built


class LedgerCollector:
    """A CollectorBackend over a log: `update`/`invalidate` append, `query`/`priorities`
    read the ledger this object folds. Thread-safe (one lock); `start()` runs the flusher
    that batches appends and writes keep-alives when due, `close()` stops it and logs every
    pending heartbeat. `clock` gives event times (the wall clock, or a simulation's)."""

    def __init__(self, log: Log, settings: SettingsLike, *, name: str, topic: str = EVENTS,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.topic = topic
        self.clock = clock
        self.elog = EventLog(log)
        self.runner = EmbeddedRunner(self.elog, settings, topic=topic, derived_topic=None,
                                     group=GROUP)
        self.runner.fold()
        self.seq = self.ledger.last_seq(name)
        patterns = [*_ALWAYS_VOLATILE, *(settings.get("POOLLEDGER_COLLECTOR_VOLATILE_ATTRS") or ())]
        self._volatile_exact = {p.lower() for p in patterns if "*" not in p and "?" not in p}
        self._volatile_glob = [re.compile(fnmatch.translate(p.lower())) for p in patterns
                               if "*" in p or "?" in p]
        self._volatile_memo: dict[str, bool] = {}
        self.margin = float(settings.get("POOLLEDGER_COLLECTOR_REFRESH_MARGIN") or 60.0)
        cycles = settings.get("POOLLEDGER_COLLECTOR_CYCLES")
        self.record_cycles = True if cycles is None else bool(cycles)
        lead = settings.get("POOLLEDGER_CLOCK_LEAD")
        self.cycle_lead = 900.0 if lead is None else float(lead)
        #: per negotiator, the number and time of the last cycle queued (not folded yet maybe)
        self.cycled: dict[str, tuple[int, float]] = {}
        self.lock = threading.RLock()
        self.streams: dict[str, _Stream] = {}
        self.logged: dict[str, _Logged] = {}
        self.beats: dict[str, _Beats] = {}
        self.due: list[tuple[float, str]] = []  # (deadline - margin, key), lazily pruned
        self.pending = _Pending()
        self.cads: dict[str, _Cached] = {}
        #: ads to render for the wire while idle: every one the fold holds, to begin with
        self.unrendered: set[str] = {k for k, _ in self.ledger.collector_keyed_ads()}
        self.last_ts = self.ledger.now or 0.0
        self.commands = 0  # commands handled (tests wait on it)
        self.appended = 0  # events appended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._complained = -math.inf

    @property
    def ledger(self) -> Ledger:
        return self.runner.ledger

    # --- the service's life ------------------------------------------------------------

    def start(self) -> None:
        """Run the flusher: every FLUSH_EVERY seconds, keep-alives due and the batch."""
        self._thread = threading.Thread(target=self._flusher, name="collector-flusher",
                                        daemon=True)
        self._thread.start()

    def _flusher(self) -> None:
        swept = time.monotonic()
        while not self._stop.wait(FLUSH_EVERY):
            if time.monotonic() - swept > SWEEP_EVERY:  # the cycles freezing kept, freed
                with self.lock:
                    gc.unfreeze()
                    gc.collect()
                    gc.freeze()
                swept = time.monotonic()
            try:
                self.tick(warm=WARM_PER_TICK)
            except Exception as exc:  # noqa: BLE001 - the log is down: say so, retry
                now = time.monotonic()
                if now - self._complained > 60:
                    log.error("cannot append to the log (%s: %s); %d updates held, retrying",
                              type(exc).__name__, exc, len(self.pending.items))
                    self._complained = now

    def close(self) -> None:
        """Stop the flusher, log every heartbeat not logged yet (the log then holds the
        collector's exact state) and store a snapshot of the fold. Once."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self.lock:
            for key in list(self.beats):
                self._refresh(key)
            self.flush()
            self.runner.snapshot()

    def tick(self, now: float | None = None, warm: float = 0.0) -> None:
        """Write the keep-alives due by `now` (default: the clock) and append the batch.
        A driver appending events of its own (a replay) calls it with their time first.
        With nothing to append, spend up to `warm` seconds rendering ads for the wire."""
        with self.lock:
            self._due(self.clock() if now is None else now)
            idle = not self.pending.items
            self.flush()
            if idle and warm > 0:
                self._warm(warm)

    def _warm(self, budget: float) -> None:
        """Render ads written (or, after a start, folded) since the last query, for at most
        `budget` seconds: the first query of 200,000 ads then finds them rendered (~30 us
        each, done while the service is idle, not while a client waits)."""
        end = time.perf_counter() + budget
        todo = self.unrendered
        while todo and time.perf_counter() < end:
            key = todo.pop()
            rec = self.ledger.collector_ad(*key.split("/", 1))
            if rec is not None:
                entry = self._entry(key, rec)
                if entry.whole is None:
                    _render(entry)

    # --- updates -------------------------------------------------------------------------

    def update(self, ad_type: str, ad: classad2.ClassAd, private: classad2.ClassAd | None,
               peer: Peer) -> None:
        """UPDATE_*_AD: the ad (private attributes removed, LastHeardFrom and the sender's
        authenticated identity set, as the collector does) as an `ad.updated`, or a
        heartbeat. The backend keeps and edits `ad`; `private` is never read."""
        if ad_type == "Generic":  # UPDATE_AD_GENERIC: the ad names its own type
            ad_type = _generic_type(ad.get("MyType"), "UPDATE_AD_GENERIC")
        name = ad.get("Name")
        if not isinstance(name, str) or not name:
            name = ad.get("Machine")  # a startd ad without Name is keyed by Machine
            if not isinstance(name, str) or not name:
                raise CommandRefusedError(f"{ad_type} ad without a Name")
        with self.lock:
            self.commands += 1
            now = self.clock()
            self._due(now)
            obj = ad_to_json(ad)
            private, spelled = _names(obj)
            for attr in private:
                del ad[attr]
                del obj[attr]
            stamps: dict[str, Any] = {"LastHeardFrom": int(now)}
            if peer.user:
                stamps["AuthenticatedIdentity"] = peer.user
                if peer.method:
                    stamps["AuthenticationMethod"] = peer.method
            for attr, value in stamps.items():
                ad[attr] = value
                sent = spelled.get(attr.lower())
                if sent is not None and sent != attr:
                    del obj[sent]  # the sender's spelling, replaced
                obj[attr] = value
            key, source = f"{ad_type.lower()}/{name}", f"{ad_type}/{name}"
            seq, fresh = self._seq(source, key, obj)
            logged = self._logged(key, source, now)
            if self.record_cycles and ad_type in ("Negotiator", "Accounting"):
                self._cycles(ad_type, obj, now)
            beats = self.beats.get(key)
            if logged is not None and self._heartbeat(logged.ad, obj):
                if not fresh:
                    return  # a late heartbeat (UDP reordered it): its successor said more
                if beats is None:
                    self.beats[key] = _Beats(ad_type, name, source, now, seq, seq, 1, obj, ad)
                elif seq > beats.last:
                    beats.heard, beats.last, beats.ad, beats.cad = now, seq, obj, ad
                    beats.received += 1
                if now >= logged.deadline - self.margin:
                    self._refresh(key)
            else:
                if beats is not None:
                    self._refresh(key)  # the heartbeats' range before the new ad
                env = make_event(AdUpdated(ad_type=ad_type, name=name, ad=obj), ts=now,
                                 source=source, seq=seq)
                self.pending.items.append(env)
                self.pending.cads[key] = ad
                self.logged[key] = _Logged(obj, source)
            if len(self.pending.items) >= BATCH:
                self.flush()

    def _cycles(self, ad_type: str, obj: Mapping[str, Any], now: float) -> None:
        """Queue the `negotiation.cycle`s of the real negotiator this Negotiator or Accounting
        ad reports and the log does not hold yet (module docstring). A cycle later than the
        ad's arrival by more than POOLLEDGER_CLOCK_LEAD is refused (its negotiator's clock is
        wrong, or the ad forged): taken, it would hide every real cycle until then."""
        if ad_type == "Negotiator":
            name = obj.get("NegotiatorName") or obj.get("Name")
            times = []
            for i in range(_MAX_CYCLE_STATS):
                start = _seconds(obj.get(f"LastNegotiationCycleTime{i}"))
                if start is None:
                    break
                phase1 = _seconds(obj.get(f"LastNegotiationCycleDurationPhase1{i}"))
                times.append(start + (phase1 if phase1 is not None and phase1 > 0 else 0.0))
        else:
            name = obj.get("NegotiatorName")
            last_update = _seconds(obj.get("LastUpdate"))
            times = [] if last_update is None else [last_update]
        if not isinstance(name, str) or not name or not times:
            return
        number, last = self.cycled.get(name, (0, -math.inf))
        folded = self.ledger.negotiator_cycles(name)
        if folded is not None and folded[1] > last:
            number, last = folded[0], folded[1]
        floor = self.ledger.last_priority_update
        for t in sorted(times):
            if t - last <= CYCLE_SAME or not TS_MIN <= t <= TS_MAX \
                    or (floor is not None and t < floor):
                continue
            if t > now + self.cycle_lead:
                log.warning("%s ad of %s reports a negotiation cycle at %.0f, %.0f s after it "
                            "arrived (more than POOLLEDGER_CLOCK_LEAD): no cycle written",
                            ad_type, name, t, t - now)
                break
            number = min(number + 1, MAX_CYCLE)
            self.pending.items.append(NegotiationCycled(negotiator=name, cycle=number, now=t))
            last = t
        self.cycled[name] = (number, last)

    def _seq(self, source: str, key: str, obj: Mapping[str, Any]) -> tuple[int, bool]:
        """The event seq of this update in its ad's stream (see the module docstring), and
        whether it is newer than every one before it."""
        useq, start = obj.get("UpdateSequenceNumber"), obj.get("DaemonStartTime")
        useq = useq if type(useq) is int and useq >= 0 else None
        start = start if type(start) is int else None
        st = self.streams.get(source)
        if st is None:
            st = self.streams[source] = self._resume(source, key)
        if useq is None:
            st.last += 1
            return st.last, True
        if st.base is None or st.start != start:  # first heard, or the daemon restarted
            st.start, st.base = start, st.last + 1 - useq
        seq = st.base + useq
        if seq < 1:  # numbers below the first one heard: start again from here
            st.base = st.last + 1 - useq
            seq = st.last + 1
        fresh = seq > st.last
        st.last = max(st.last, seq)
        return seq, fresh

    def _resume(self, source: str, key: str) -> _Stream:
        """A stream as the log left it: its last seq, and the incarnation and offset of the
        ad the fold holds (so the first update after a restart of this service still
        counts what was lost meanwhile)."""
        last = self.ledger.last_seq(source)
        rec = self.ledger.collector_ad(*key.split("/", 1))
        if rec is not None and rec.source == source:
            useq, start = rec.ad.get("UpdateSequenceNumber"), rec.ad.get("DaemonStartTime")
            if type(useq) is int and type(start) is int:
                return _Stream(start, last - useq, last)
        return _Stream(None, None, last)

    def _logged(self, key: str, source: str, now: float) -> _Logged | None:
        """The ad as logged by this stream, if the folds hold it live until past `now` (a
        heartbeat can only refresh that: an ad past its lifetime, invalidated or absent is
        updated anew, as the collector re-adds it); from the fold after a restart."""
        found = self.logged.get(key)
        if found is not None and found.deadline == math.inf:
            self.flush()  # written, not folded yet: its deadline is the fold's to say
            found = self.logged.get(key)
        rec = self.ledger.collector_ad(*key.split("/", 1))
        if rec is None or rec.absent or rec.source != source or rec.expires is None \
                or rec.expires < now:
            self.logged.pop(key, None)
            return None
        if found is None or found.ad is not rec.ad:
            found = self.logged[key] = _Logged(rec.ad, source, rec.expires)
            heapq.heappush(self.due, (rec.expires - self.margin, key))
        return found

    def _is_volatile(self, attr: str) -> bool:
        found = self._volatile_memo.get(attr)
        if found is None:
            low = attr.lower()
            found = low in self._volatile_exact or any(g.match(low) for g in self._volatile_glob)
            if len(self._volatile_memo) < 65536:
                self._volatile_memo[attr] = found
        return found

    def _heartbeat(self, logged: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether `new` differs from the logged ad only in volatile attributes (same
        attribute names, same values elsewhere)."""
        if logged.keys() != new.keys():
            return False
        for k, v in new.items():
            old = logged[k]
            if (old != v or type(old) is not type(v)) and not self._is_volatile(k):
                return False
        return True

    def _refresh(self, key: str) -> None:
        """Queue the keep-alive entry of `key`'s heartbeats."""
        b = self.beats.pop(key)
        logged = self.logged[key]
        delta = {k: v for k, v in b.ad.items() if logged.ad.get(k, v) != v or k not in logged.ad}
        self.pending.items.append(AdRefresh(b.ad_type, b.name, b.source, b.heard, b.first,
                                            b.last, b.received, delta))
        self.pending.cads[key] = b.cad
        self.logged[key] = _Logged({**logged.ad, **delta}, logged.source)

    def _due(self, now: float) -> None:
        """Queue the keep-alives of ads whose fold deadline is within the margin of `now`."""
        due = self.due
        while due and due[0][0] <= now:
            at, key = heapq.heappop(due)
            logged = self.logged.get(key)
            if logged is None or logged.deadline - self.margin != at:
                continue  # stale: re-logged or refreshed since
            if key in self.beats:
                self._refresh(key)

    # --- appending and folding ---------------------------------------------------------

    def flush(self) -> None:
        """Append the batch (keep-alive entries in runs, one `ad.refreshed` per run), fold
        the log to its end, and learn the deadlines of the ads just written."""
        with self.lock:
            pending = self.pending
            if pending.items:
                if pending.envs is None:  # built once: a retry appends the same events
                    pending.envs = self._envelopes(pending.items)
                landed = self.elog.append(self.topic, pending.envs)
                self.pending = _Pending()  # appended: a failure before keeps them for a retry
                self.appended += len(pending.envs)
                self._fold_past(landed)
            else:
                self.runner.fold()
            self.runner.checkpoint()
            ledger = self.ledger
            for key, cad in pending.cads.items():
                logged = self.logged.get(key)
                rec = ledger.collector_ad(*key.split("/", 1))
                if logged is None:
                    continue
                if rec is None or rec.source != logged.source or rec.absent:
                    del self.logged[key]  # not held (an expiry, another writer): log anew
                    continue
                logged.ad, logged.deadline = rec.ad, (rec.expires if rec.expires is not None
                                                      else math.inf)
                cached = self.cads.get(key)
                if cached is not None and cached.cad is cad:  # a heartbeat's, rendered maybe
                    cached.ad = rec.ad
                else:
                    self.cads[key] = _Cached(rec.ad, cad)
                self.unrendered.add(key)
                if rec.expires is not None and not rec.absent:
                    heapq.heappush(self.due, (rec.expires - self.margin, key))
            gc.freeze()

    def _envelopes(self, items: list[Envelope | AdRefresh | NegotiationCycled]) -> list[Envelope]:
        """The batch as events: each run of keep-alive entries one `ad.refreshed`, and each
        real negotiator's cycle a `negotiation.cycle` at its time, of this collector's own
        source."""
        envs: list[Envelope] = []
        run: list[AdRefresh] = []
        for item in [*items, None]:
            if isinstance(item, AdRefresh):
                run.append(item)
                continue
            if run:
                self.seq += 1
                ts = max([self.last_ts, *(r.heard for r in run)])
                envs.append(make_event(AdsRefreshed(run), ts=ts, source=self.name,
                                       seq=self.seq))
                run = []
            if isinstance(item, NegotiationCycled):
                self.seq += 1
                envs.append(make_event(item, ts=item.now, source=self.name, seq=self.seq))
            elif item is not None:
                envs.append(item)
                self.last_ts = max(self.last_ts, item.ts)
        return envs

    def _fold_past(self, landed: Iterable[Appended]) -> None:
        """Fold the log past the records just appended (a Kafka consumer may see a record a
        moment after its producer wrote it), and whatever came before them."""
        wanted: dict[int, int] = {}
        for a in landed:
            wanted[a.partition] = max(wanted.get(a.partition, 0), a.offset + 1)
        deadline = time.monotonic() + FOLD_WAIT
        while True:
            self.runner.fold()
            if all(self.runner.positions.get(p, 0) >= end for p, end in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise LogError(f"the log did not hand back the records just appended to "
                               f"{self.topic} within {FOLD_WAIT:g} s")
            time.sleep(0.005)

    # --- invalidations -----------------------------------------------------------------

    def invalidate(self, ad_type: str, query: classad2.ClassAd, peer: Peer) -> None:
        """INVALIDATE_*: the ad the query names (Name, as the collector's hash key), else
        every ad of the type its Requirements select; one `ad.invalidated` each."""
        if ad_type == "Generic":
            ad_type = _generic_type(query.get("TargetType"), "INVALIDATE_ADS_GENERIC")
        with self.lock:
            self.commands += 1
            now = self.clock()
            self._due(now)
            self.flush()
            name = query.get("Name")
            if isinstance(name, str) and name:
                rec = self.ledger.collector_ad(ad_type, name)
                names = [] if rec is None else [rec.name]
                kind = ad_type if rec is None else rec.ad_type
            else:
                req = query.lookup("Requirements") if "Requirements" in query else None
                if req is None:
                    raise CommandRefusedError(f"invalidation of {ad_type} ads names no ad "
                                              "(no Name, no Requirements)")
                kind = ad_type
                names = [rec.name for key, rec in self.ledger.collector_keyed_ads(ad_type)
                         if _true(req, self._entry(key, rec).cad)]
            for n in names:
                key = f"{kind.lower()}/{n}"
                if key in self.beats:
                    self._refresh(key)  # count its heartbeats before it goes
                self.logged.pop(key, None)
                self.cads.pop(key, None)
                self.seq += 1
                self.pending.items.append(make_event(AdInvalidated(ad_type=kind, name=n),
                                                     ts=max(now, self.last_ts),
                                                     source=self.name, seq=self.seq))
            self.flush()

    # --- queries -------------------------------------------------------------------------

    def _entry(self, key: str, rec: Any) -> _Cached:
        """The ClassAd (and its rendering) of a folded record: the latest heartbeat's when
        one is pending, else the one written (or built once from the fold's JSON form)."""
        found = self.cads.get(key)
        beats = self.beats.get(key)
        if beats is not None:
            if found is None or found.cad is not beats.cad:
                found = self.cads[key] = _Cached(None, beats.cad)
            return found
        if found is None or found.ad is not rec.ad:
            found = self.cads[key] = _Cached(rec.ad, ad_from_json(rec.ad))
        return found

    def query(self, ad_type: str | None, query: classad2.ClassAd,
              peer: Peer) -> list[RenderedAd]:
        """QUERY_*_ADS / QUERY_MULTIPLE_ADS as condor_collector answers them: per type the
        constraint (`<Type>Requirements`, else `Requirements`) evaluated in each ad, absent
        ads skipped when ABSENT_REQUIREMENTS is set unless the constraint mentions Absent,
        `LimitResults` (and `<Type>LimitResults`) over the whole answer, and the projection
        (`<Type>Projection`, else `Projection`: a list of names, or an expression evaluated
        per ad). The answers are rendered for the wire once per ad version and projected
        by picking lines (`RenderedAd`): building ClassAds per query costs seconds at
        200,000 slots."""
        with self.lock:
            self.commands += 1
            now = self.clock()
            self._due(now)
            self.flush()
            specs = self._specs(ad_type, query)
            out: list[RenderedAd] = []
            total = _limit(query, "LimitResults")
            for spec in specs:
                budget = min(total, spec.limit) - len(out)
                if budget <= 0:
                    break
                # the hot loop of a 200,000-ad query: `_entry` and `_project` inlined for
                # the common case (an ad cached, its rendering made, the projection seen)
                constraint, wanted = spec.constraint, spec.projection
                plain = spec.projection_expr is None
                cads, beats, append = self.cads, self.beats, out.append
                for key, rec in self.ledger.collector_keyed_ads(spec.ad_type):
                    if rec.absent:
                        if spec.skip_absent:
                            continue
                    elif rec.expires is not None and rec.expires < now:
                        continue  # past its lifetime: the collector's housekeeper drops it
                    entry = cads.get(key)
                    pending = beats.get(key)
                    if entry is None or (entry.ad is not rec.ad if pending is None
                                         else entry.cad is not pending.cad):
                        entry = self._entry(key, rec)
                    if constraint is not None and not _true(constraint, entry.cad):
                        continue
                    if plain and entry.projected is not None and entry.projected[0] is wanted:
                        append(entry.projected[1])
                    elif plain and wanted is None and entry.whole is not None:
                        append(entry.whole)
                    else:
                        append(self._project(entry, spec, query))
                        self.unrendered.discard(key)  # rendered now: not the warmer's any more
                    budget -= 1
                    if budget <= 0:
                        break
            gc.freeze()
            return out

    def _specs(self, ad_type: str | None, query: classad2.ClassAd) -> list[_Spec]:
        absent_set = bool(self.ledger.settings.get("ABSENT_REQUIREMENTS"))
        if ad_type == "Generic":
            ad_type = _generic_type(query.get("TargetType"), "QUERY_GENERIC_ADS")
        if ad_type is not None:
            types: list[tuple[str | None, str]] = [(_canonical(ad_type), "")]
        else:
            target = query.get("TargetType")
            if not isinstance(target, str) or not target.strip():
                raise CommandRefusedError("QUERY_MULTIPLE_ADS without a TargetType list")
            types = [(_canonical(t), t) for t in _SPLIT.split(target.strip()) if t]
        specs = []
        for kind, tag in types:
            attr = f"{tag}Requirements" if tag and f"{tag}Requirements" in query else "Requirements"
            constraint = query.lookup(attr) if attr in query else None
            if constraint is not None and str(constraint).strip().lower() == "true":
                constraint = None  # what every client sends without a constraint
            limit = _limit(query, f"{tag}LimitResults") if tag else _limit(query, "LimitResults")
            proj_attr = f"{tag}Projection" if tag and f"{tag}Projection" in query else "Projection"
            projection, proj_expr = None, None
            if proj_attr in query:
                value = query.get(proj_attr)
                if isinstance(value, str):
                    names = tuple(a.lower() for a in _SPLIT.split(value) if a)
                    # one object per projection, so a cached answer is found by identity
                    projection = _PROJECTIONS.setdefault(names, names) if names else None
                    if len(_PROJECTIONS) > 4096:
                        _PROJECTIONS.clear()
                else:
                    proj_expr = proj_attr
            mentions_absent = constraint is not None and "absent" in str(constraint).lower()
            specs.append(_Spec(kind, constraint, limit, projection, proj_expr,
                               absent_set and not mentions_absent))
        return specs

    def _project(self, entry: _Cached, spec: _Spec, query: classad2.ClassAd) -> RenderedAd:
        """The ad as the query's projection wants it: its wire lines (rendered once per ad
        version), or the projected ones picked by position (once per ad shape)."""
        whole, shape = entry.whole, entry.shape
        if whole is None or shape is None:
            whole, shape = _render(entry)
        wanted = spec.projection
        if spec.projection_expr is not None:
            value = query.lookup(spec.projection_expr).eval(scope=query, target=entry.cad)
            wanted = tuple(a.lower() for a in _SPLIT.split(value) if a) \
                if isinstance(value, str) else None
        if not wanted:
            return whole
        pick = shape.picks.get(wanted)
        if pick is None:
            pick = shape.picks[wanted] = _picker([i for i in map(shape.index.get, wanted)
                                                  if i is not None])
        projected = RenderedAd(pick(whole.lines))
        if spec.projection_expr is None:  # kept for the next query with this projection
            entry.projected = (wanted, projected)
        return projected

    # --- GET_PRIORITY ----------------------------------------------------------------------

    def priorities(self, peer: Peer) -> classad2.ClassAd:
        """GET_PRIORITY: the ledger's accountant as the negotiator reports it (`priority_ad`)."""
        with self.lock:
            self.commands += 1
            self._due(self.clock())
            self.flush()
            ledger = self.ledger
            now = ledger.now or 0.0
            return priority_ad(ledger.priorities(now, all_groups=True), ledger.group_quotas(),
                               {n: v["InUse"] for n, v in ledger.limits_view().items()},
                               ledger.last_priority_update or now)


_NAMES: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, str]]] = {}


def _names(obj: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """An ad's private attributes, and its names by lower case (once per set of names: ads
    of one kind share theirs)."""
    names = tuple(obj)
    found = _NAMES.get(names)
    if found is None:
        if len(_NAMES) >= 4096:
            _NAMES.clear()
        found = _NAMES[names] = (tuple(k for k in names if is_private(k)),
                                 {k.lower(): k for k in names})
    return found


def _seconds(value: Any) -> float | None:
    """A time or duration of an ad: a finite number (not a bool), else None."""
    if type(value) is not int and type(value) is not float:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _generic_type(value: Any, command: str) -> str:
    """The MyType a generic command names (the ad's MyType, the query's TargetType)."""
    if not isinstance(value, str) or not value:
        raise CommandRefusedError(f"{command} without the ad type (MyType / TargetType)")
    return value


def _canonical(ad_type: str) -> str | None:
    """The MyType the fold keys a query's type by (None: every type)."""
    low = ad_type.lower()
    if low == "any":
        return None
    return _TYPE_ALIASES.get(low, ad_type)


def _limit(query: classad2.ClassAd, attr: str) -> int:
    value = query.get(attr) if attr in query else None
    return value if type(value) is int and value > 0 else 2**62


def _true(expr: classad2.ExprTree, ad: classad2.ClassAd) -> bool:
    """A constraint holds as the collector reads it: evaluated in the ad (MY), true or a
    non-zero number."""
    value = expr.eval(scope=ad)
    if value is True:
        return True
    return type(value) in (int, float) and value != 0


def priority_ad(rows: Mapping[str, Mapping[str, Any]], quotas: Mapping[str, Mapping[str, Any]],
                limits: Mapping[str, float], last_update: float) -> classad2.ClassAd:
    """The negotiator's answer to GET_PRIORITY (Accountant::ReportState, no rollup): groups
    numbered first, breadth first from `<none>` = 1, then every submitter; per entry Name<i>,
    Priority<i> (the real priority), PriorityFactor<i>, usage and times (and the quotas of a
    group, the floor and ceiling of a submitter); LastUpdate, NumSubmittors and
    ConcurrencyLimit_<name> beside them."""
    ad = classad2.ClassAd()
    ad["LastUpdate"] = int(last_update)
    groups = sorted((n for n, r in rows.items() if r.get("IsAccountingGroup")),
                    key=lambda n: (n != "<none>", n.count("."), n.lower()))
    numbers = {"<none>": 1}
    for g in groups:
        numbers.setdefault(g, len(numbers) + 1)
    entry = len(numbers)
    for g in groups:
        r, i = rows[g], numbers[g]
        q = quotas.get(g, {})
        parent = g.rsplit(".", 1)[0] if "." in g else "<none>"
        _numbered(ad, i, {
            "Name": g, "IsAccountingGroup": True, "AccountingGroup": g if g == "<none>" else parent,
            "Priority": float(r["Priority"]), "PriorityFactor": float(r["PriorityFactor"]),
            "EffectiveQuota": float(q.get("EffectiveQuota", 0.0)),
            "ConfigQuota": float(q.get("ConfigQuota", 0.0)),
            "SubtreeQuota": float(q.get("SubtreeQuota", 0.0)),
            "SurplusPolicy": str(q.get("SurplusPolicy", "no")),
            "Requested": float(q.get("Requested", 0.0)),
            "ResourcesUsed": int(r["ResourcesUsed"]),
            "WeightedResourcesUsed": float(r["WeightedResourcesUsed"]),
            "AccumulatedUsage": float(r["AccumulatedUsage"]),
            "HierWeightedResourcesUsed": float(r.get("HierWeightedResourcesUsed", 0.0)),
            "WeightedAccumulatedUsage": float(r["WeightedAccumulatedUsage"]),
            "BeginUsageTime": int(r["BeginUsageTime"]), "LastUsageTime": int(r["LastUsageTime"]),
        })
    for name in sorted(n for n, r in rows.items() if not r.get("IsAccountingGroup")):
        r = rows[name]
        entry += 1
        _numbered(ad, entry, {
            "Name": name, "IsAccountingGroup": False,
            "AccountingGroup": str(r.get("AccountingGroup") or "<none>"),
            "Priority": float(r["Priority"]), "Ceiling": int(r["Ceiling"]),
            "Floor": int(r["Floor"]), "PriorityFactor": float(r["PriorityFactor"]),
            "ResourcesUsed": int(r["ResourcesUsed"]),
            "WeightedResourcesUsed": float(r["WeightedResourcesUsed"]),
            "AccumulatedUsage": float(r["AccumulatedUsage"]),
            "WeightedAccumulatedUsage": float(r["WeightedAccumulatedUsage"]),
            "SubmitterShare": 0.0, "SubmitterLimit": 0.0,
            "BeginUsageTime": int(r["BeginUsageTime"]), "LastUsageTime": int(r["LastUsageTime"]),
        })
    ad["NumSubmittors"] = entry
    for limit, used in sorted(limits.items()):
        ad[f"ConcurrencyLimit_{limit.replace('.', '_')}"] = float(used)
    return ad


def _numbered(ad: classad2.ClassAd, i: int, attrs: Mapping[str, Any]) -> None:
    for k, v in attrs.items():
        ad[f"{k}{i}"] = v
