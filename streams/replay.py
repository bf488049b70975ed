"""The replay runner: fold any stored log (the configured one, or an exported `.jsonl`) into a
ledger, up to a time or a position, optionally with changed knobs (what-if).

It shares the ledger with the live runners, so a replay to the end of the log reproduces their
state exactly; events that fail to decode are reported by file:line or position and skipped.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator

from schemas.config import SettingsLike
from schemas.errors import EventValidationError
from schemas.events import Envelope, content_digest, decode
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.gcpolicy import long_fold
from streams.log.events import EventLog
from streams.log.topics import EVENTS, require_one_partition
from streams.runner import SNAPSHOT_EVERY

log = logging.getLogger(__name__)


class ReplayError(Exception):
    """A replay request that cannot be honoured (bad --until, unreadable log)."""


@dataclass(frozen=True, slots=True)
class Until:
    """Where a replay stops: after the last event with ts <= `ts`, or before offset `position`."""

    ts: float | None = None
    position: int | None = None

    def reached(self, index: int, env: Envelope) -> bool:
        if self.position is not None and index >= self.position:
            return True
        return self.ts is not None and env.ts > self.ts


def parse_time(text: str) -> float:
    """Epoch seconds from epoch digits or ISO 8601 (UTC unless an offset is given)."""
    try:
        value = float(text)
        if math.isfinite(value):
            return value
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ReplayError(f"{text!r} is neither epoch seconds nor an ISO 8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_until(text: str) -> Until:
    """`#N` or `offset:N` is a log position (the first N events); anything else a time."""
    for prefix in ("#", "offset:"):
        if text.startswith(prefix):
            digits = text[len(prefix):]
            if not digits.isdigit():
                raise ReplayError(f"--until {text!r}: a position is {prefix}N with N a whole number")
            return Until(position=int(digits))
    return Until(ts=parse_time(text))


@dataclass(slots=True)
class Skipped:
    """An event a replay could not decode: where it was and why."""

    where: str
    reason: str


def jsonl_events(path: Path, skipped: list[Skipped]) -> Iterator[Envelope]:
    """Envelopes of an exported log; undecodable lines are recorded in `skipped` by file:line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ReplayError(f"{path}: {exc.strerror}") from None
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield decode(line)
            except EventValidationError as exc:
                skipped.append(Skipped(f"{path}:{lineno}", str(exc)))


def first_time(elog: EventLog, topic: str = EVENTS) -> float | None:
    """The event time of the topic's first (decodable) event, the log's start, reading one
    record at a time rather than a batch (None: no event)."""
    for _record, env in EventLog(elog.log, batch=1).read(topic):
        return env.ts
    return None


def log_events(elog: EventLog, topic: str = EVENTS) -> Iterator[Envelope]:
    """Envelopes of a topic of the configured log (bad records go to its DLQ as usual)."""
    require_one_partition(elog.log, topic)
    for _record, env in elog.read(topic):
        yield env


def replay(events: Iterable[Envelope], settings: SettingsLike, until: Until | None = None,
           on_event: Callable[[Ledger, Envelope, list[Envelope]], Any] | None = None,
           on_reject: Callable[[Envelope, EventRejectedError], Any] | None = None, *,
           ledger: Ledger | None = None, first: int = 0,
           on_conflict: Callable[[str], Any] | None = None) -> Ledger:
    """Fold `events` into a fresh ledger (or into `ledger`, restored from a snapshot that
    covers the first `first` events) until `until`; `on_event` sees every applied event,
    `on_reject` every event the ledger rejected (default: a warning naming it and why; the
    ledger counts them in `rejected`), `on_conflict` (when given) each event whose id an
    earlier one of `events` had with other content, which the ledger drops as a duplicate:
    both versions named (`schemas.events.conflict`)."""
    if ledger is None:
        ledger = Ledger(settings)
    seen: dict[str, tuple[bytes, int]] = {}
    with long_fold():
        for index, env in enumerate(events, first):
            if until is not None and until.reached(index, env):
                break
            if on_conflict is not None:
                _check_conflict(seen, index, env, on_conflict)
            try:
                derived = ledger.apply(env)
            except EventRejectedError as exc:
                if on_reject is not None:
                    on_reject(env, exc)
                else:
                    log.warning("%s", exc)
                continue
            if on_event is not None:
                on_event(ledger, env, derived)
    return ledger


def _check_conflict(seen: dict[str, tuple[bytes, int]], index: int, env: Envelope,
                    report: Callable[[str], Any]) -> None:
    """`replay`'s conflict check: each id's first content (a digest) and position, so a later
    event with the id and other content is named with both positions."""
    digest = content_digest(env)
    first = seen.setdefault(env.id, (digest, index))
    if first[0] != digest:
        report(f"event {env.id} at #{index} ({env.type}, ts {env.ts:.0f}) is a different event "
               f"than the one with that id at #{first[1]}: dropped as a duplicate, not folded")


@dataclass(slots=True)
class Folded:
    """A ledger folded from a log, the newest event time read, and whether it started from
    a snapshot (then only the tail's rejected events were named on the way)."""

    ledger: Ledger
    last_ts: float | None
    from_snapshot: bool


@dataclass(frozen=True, slots=True)
class Start:
    """Where a fold of the configured log starts: a restored ledger with the positions and
    number of events it covers and the newest event time among them, or the topic's start
    (`ledger` None)."""

    ledger: Ledger | None = None
    positions: dict[int, int] | None = None
    events: int = 0
    last_ts: float | None = None


def start_of(elog: EventLog, settings: SettingsLike, until: Until | None = None, *,
             topic: str = EVENTS, warn: Callable[[str], Any] | None = None,
             whatif: bool = False, many: int = SNAPSHOT_EVERY,
             needs: Collection[str] | None = None) -> Start:
    """The newest snapshot of `topic` at or before `until` usable under `settings`, restored
    (of its large rows only those a query `needs` read now: `SnapshotStore.restore`);
    else the topic's start, after one `warn` line saying why (none for a `whatif` fold
    refused only for its knobs: a what-if folds from the start by definition). A topic of
    at least `many` events with no snapshot at all (an imported or a migrated log) is folded
    from its start after one `warn` line naming the command that stores one."""
    from streams.snapshot import SnapshotStore

    require_one_partition(elog.log, topic)
    log = elog.log
    if not SnapshotStore.supports(log):
        return Start()
    store = SnapshotStore(log, topic)
    found = store.restore(
        settings, events=None if until is None else until.position,
        ts=None if until is None else until.ts, needs=needs)
    if found.ledger is not None and found.header is not None:
        head = found.header
        damage = store.damage_under(head) if warn is not None else None
        if damage is not None and warn is not None:
            warn(f"the log is damaged at {damage}, under the snapshot at "
                 f"{topic}@{head.events} this answer comes from (`poolledger log verify` "
                 "lists every problem; `poolledger log salvage` copies what is readable)")
        return Start(found.ledger, head.positions, head.events, head.max_ts)
    if found.problem is not None and warn is not None and not (
            whatif and found.problem.endswith("other knobs")):
        warn(f"{found.problem}; folding the whole log")
    elif found.problem is None and warn is not None and until is None and not whatif:
        events = sum(log.end_offsets(topic).values())
        if events >= many:
            warn(f"the log holds {events:,} events and no snapshot, so each query folds them "
                 "all; `poolledger log snapshot` stores one (then only later events are folded)")
    return Start()


def replay_log(elog: EventLog, settings: SettingsLike, until: Until | None = None, *,
               topic: str = EVENTS, warn: Callable[[str], Any] | None = None,
               whatif: bool = False, many: int = SNAPSHOT_EVERY,
               needs: Collection[str] | None = None,
               on_conflict: Callable[[str], Any] | None = None,
               progress: Callable[[int, int, float], Any] | None = None) -> Folded:
    """The ledger of a topic of the configured log at `until` (default: its end): from
    `start_of` (the newest usable snapshot at or before `until`), folding only the tail.
    `progress` (when given) hears (events folded, events to fold, event time) every
    `PROGRESS_EVERY` events of the tail."""
    start = start_of(elog, settings, until, topic=topic, warn=warn, whatif=whatif, many=many,
                     needs=needs)
    events: Iterable[Envelope] = (
        env for _rec, env in elog.read(topic, start_positions=start.positions))
    if progress is not None:
        total = sum(elog.log.end_offsets(topic).values()) - start.events
        events = _reporting(events, total, progress)
    tail = LastTime(events, start.last_ts)
    ledger = start.ledger if start.ledger is not None else Ledger(settings)
    ledger.first_version = elog.first_version(topic)
    folded = replay(tail, settings, until, ledger=ledger, first=start.events,
                    on_conflict=on_conflict)
    return Folded(folded, tail.ts, start.ledger is not None)


#: How many events a fold reports its progress after (a call per event would show in its rate).
PROGRESS_EVERY = 5000


def _reporting(events: Iterable[Envelope], total: int,
               progress: Callable[[int, int, float], Any]) -> Iterator[Envelope]:
    done = 0
    for env in events:
        done += 1
        if done % PROGRESS_EVERY == 0:
            progress(done, total, env.ts)
        yield env


class LastTime:
    """Passes events through, remembering the latest event time seen (the log's own time)."""

    def __init__(self, events: Iterable[Envelope], ts: float | None = None) -> None:
        self._events = events
        self.ts = ts

    def __iter__(self) -> Iterator[Envelope]:
        last = self.ts
        try:
            for env in self._events:
                if last is None or env.ts > last:
                    last = env.ts
                yield env
        finally:
            self.ts = last
