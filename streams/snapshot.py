"""Durable ledger snapshots in the embedded log, and the query path that folds only the tail.

The runner (`streams.runner`) stores the ledger with the log position it covers in the log's
own SQLite file (`EmbeddedLog.put_state`), in ONE transaction with its consumer-group commit
and the derived events it appends: the snapshot, its position and its output are durable
together or not at all.

A snapshot is a small JSON header row (format version, the digest of the knobs it was
folded under, the position, the number of events read, the newest event time read) and one
row per section of `Ledger.to_sections` (format 5): `.body` holds the small part of the
ledger's canonical document (`to_doc`, the form every runner is compared by and the golden
digests hash), and the accountant's submitter records, the limits' units in use, the
collector's ads, the job queue, the job ads, the job outcomes (`why`), the accountant's
per-slot match records and the limits' running jobs are rows of their own (`.accountant`,
`.limits`, `.reconcile` (the reconciliation rows, parsed with the first two), `.pool`, `.jobs`, `.job_ads`, `.outcomes`, `.matches`, `.running`). Why
sections: at 200,000 slots the ads, the queue and the per-slot records are most of the
bytes (bench/scale.py), and `userprio` reads none of them: `Ledger.from_sections` parses
the first three now, each from its own bytes, and the last six on first use (a tail to
fold, a read of the pool, the queue, the whole accountant or the limits). Why JSON
rather than pickle or msgpack: orjson writes it deterministically (sorted keys, shortest
float text that round-trips exactly), it restores to an identical ledger (equal `to_json`),
it is readable by anything that reads JSON, and the compiled core's classes need no pickling
support. Each row carries the log's CRC-32C, checked when the row is read: when the
snapshot is restored (every row is read then), except for a query's (`restore(needs=)`,
`poolledger userprio` and the other commands of `fold_log`): it reads the large rows it
names now (a bad one: the usual warning and full fold) and any other only on first use,
since reading them was most of userprio's time at 200,000 slots (a bad row read that late
ends the command with one line naming the row, exit 1). Only a snapshot that
covers the log to its end is parsed lazily: with a tail to fold every section is needed at
once, and parsing it in `restore` turns a bad one into the usual warning and full fold.

A reader (`userprio`, `replay --until`, `audit`, `why`, `status`, the negotiator, `gangliad`)
takes the newest snapshot at or before the point asked for and folds only the tail. A
snapshot of another format version, folded under other knobs, not matching the log
(positions past its end), or corrupt is not used: the whole log is folded instead, after ONE
warning line naming the reason. A log without a snapshot at or before that point (a point
before the oldest kept) is folded from its start; past 1,000,000 events one line names
`poolledger log snapshot`, which stores one.
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import orjson

from schemas.config import SettingsLike
from streams.core.ledger import LAZY_SECTIONS, SECTIONS, Ledger
from streams.gcpolicy import long_fold
from streams.log.embedded import Damage, EmbeddedLog
from streams.log.port import Log, LogError
from streams.log.topics import EVENTS

__all__ = ["CHECKED_UNDER", "FORMAT", "SnapshotHeader", "SnapshotStore", "VERIFY_BUDGET",
           "knobs_digest", "Usable"]

#: how many of the newest records under a snapshot a reader checks every time
#: (`damage_under`): their checksums cost ~0.1 s (measured: 100,000 in 0.55 s); every
#: record's presence is counted
CHECKED_UNDER = 20_000
#: how many older records, from the log's last-verified position up, a reader checks and then
#: records as verified (`damage_under`): ~1 s at most per query, so a large log's first
#: queries verify it in turns and later ones check only what was appended since
VERIFY_BUDGET = 200_000
#: the state row holding, per partition of a topic, the offset below which a reader checked
#: every record's checksum (`SnapshotStore.verified`)
_VERIFIED = "log-verified"

#: Bump when the body's meaning changes (a fold's state, the canonical form, the sections):
#: older snapshots are then refused as stale and the log is folded again. 2: sections;
#: 3: the job outcomes (streams.core.outcomes) as a section; 4: the accountant's match
#: records and the limits' running jobs as sections of their own; 5: the ledger's section
#: holds the clock's witnesses and the slots' last claim events (`Ledger._evidence_doc`), and
#: the reconciliation rows (streams.core.reconcile) are a section.
FORMAT = 5
_PREFIX = "ledger-snapshot"
#: Knobs that say where things are or how services are reached, never what a fold computes
#: (prefixes, upper case); every other knob set away from its default ties a snapshot.
_NOT_FOLDED = ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_KAFKA_", "POOLLEDGER_ES_URL",
               "POOLLEDGER_LIVE_WINDOW", "POOLLEDGER_PROMETHEUS_", "POOLLEDGER_GRAPHITE",
               "POOLLEDGER_DUCKDB_PATH", "POOLLEDGER_CONFIG", "POOLLEDGER_EVENTS_PARTITIONS",
               "POOLLEDGER_COMPILE",
               "GANGLIA", "ALLOW_", "DENY_", "LOG", "SPOOL")


def knobs_digest(settings: Any) -> str:
    """SHA-256 of every fold-relevant knob set away from its default (`condor_config`
    text, sorted): equal digests fold a log to equal ledgers."""
    lines = []
    for name in settings:
        upper = name.upper()
        if upper.startswith(_NOT_FOLDED) or not settings.is_set(name):
            continue
        lines.append(f"{upper}={settings.text(name)}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """What a snapshot covers: the events topic up to `positions` (`events` decoded events
    read, the newest with event time `max_ts`), folded under knobs `knobs`."""

    format: int
    knobs: str
    topic: str
    positions: dict[int, int]
    events: int
    max_ts: float | None

    def to_json(self) -> bytes:
        return orjson.dumps({"format": self.format, "knobs": self.knobs, "topic": self.topic,
                             "positions": {str(p): o for p, o in self.positions.items()},
                             "events": self.events, "max_ts": self.max_ts},
                            option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotHeader:
        d = orjson.loads(raw)
        return cls(int(d["format"]), str(d["knobs"]), str(d["topic"]),
                   {int(p): int(o) for p, o in d["positions"].items()}, int(d["events"]),
                   None if d["max_ts"] is None else float(d["max_ts"]))

    def within(self, events: int | None, ts: float | None) -> bool:
        """Whether a fold stopping before event number `events` or at the first event after
        time `ts` (`streams.replay.Until`) has read everything this snapshot covers."""
        if events is not None and self.events > events:
            return False
        return ts is None or self.max_ts is None or self.max_ts <= ts


@dataclass(frozen=True, slots=True)
class Usable:
    """A restored snapshot, or none (`ledger` None) and why the candidates were refused
    (`problem`; None when there was no candidate)."""

    ledger: Ledger | None
    header: SnapshotHeader | None
    problem: str | None


class SnapshotStore:
    """The snapshots of one events topic in an embedded log (`keep` newest are kept)."""

    def __init__(self, log: EmbeddedLog, topic: str = EVENTS, keep: int = 4) -> None:
        self.log = log
        self.topic = topic
        self.keep = keep

    @staticmethod
    def supports(log: Log) -> TypeGuard[EmbeddedLog]:
        """Only the embedded log stores snapshots (on Kafka the faust tables are the state)."""
        return isinstance(log, EmbeddedLog)

    def _name(self, events: int) -> str:
        return f"{_PREFIX}/{self.topic}/{events:015d}"

    def names(self) -> list[str]:
        """Stored snapshot names, oldest first (the name sorts by events covered)."""
        start = f"{_PREFIX}/{self.topic}/"
        return sorted({n.rsplit(".", 1)[0] for n in self.log.state_names() if n.startswith(start)})

    def save(self, ledger: Ledger, header: SnapshotHeader, group: str) -> None:
        """Store `ledger` as of `header`, commit `group` at its positions and drop the
        oldest beyond `keep`: all inside the caller's transaction (or one of its own)."""
        name = self._name(header.events)
        with self.log.transaction():
            for section, raw in ledger.to_sections().items():
                self.log.put_state(f"{name}.{_row(section)}", raw)
            self.log.put_state(f"{name}.head", header.to_json())
            self.log.commit(group, self.topic, header.positions)
            for old in self.names()[:-self.keep]:
                self.log.drop_state(f"{old}.head")
                for section in SECTIONS:
                    self.log.drop_state(f"{old}.{_row(section)}")

    def headers(self) -> Iterator[tuple[str, SnapshotHeader | None, str | None]]:
        """(name, header, problem) for every stored snapshot, newest first."""
        for name in reversed(self.names()):
            try:
                raw = self.log.state(f"{name}.head")
                if raw is None:
                    yield name, None, "its header is missing"
                    continue
                yield name, SnapshotHeader.from_json(raw), None
            except (LogError, ValueError, KeyError, TypeError) as exc:
                yield name, None, f"unreadable ({exc})"

    def damage_under(self, header: SnapshotHeader) -> Damage | None:
        """Damage under the snapshot of `header`, which a reader answering from it never
        reads: a record missing anywhere below its position (a count, no record read), one
        of the `CHECKED_UNDER` records below it that no longer checks out (~0.1 s), or one
        of the older ones not verified before: up to VERIFY_BUDGET of them from the log's
        last-verified position (`verified`), which then moves past them (a writable log
        remembers it). So every record is checked once after it is written, the newest at
        every query; damage done later to an older one is `poolledger log verify`'s."""
        marks = self.verified()
        moved = False
        for partition, end in sorted(header.positions.items()):
            gap = self.log.first_missing(self.topic, partition, end)
            if gap is not None:
                return gap
            recent = max(0, end - CHECKED_UNDER)
            mark = marks.get(partition, 0)
            if mark < recent:
                upto = min(recent, mark + VERIFY_BUDGET)
                damage = self._damage(partition, mark, upto)
                if damage is not None:
                    return damage
                marks[partition], moved = upto, True
            damage = self._damage(partition, recent, end)
            if damage is not None:
                return damage
        if moved and self.log.readonly is None:
            try:
                self.log.put_state(f"{_VERIFIED}/{self.topic}", orjson.dumps(
                    {str(p): o for p, o in sorted(marks.items())}))
            except LogError:
                pass  # not remembered (a writer holds the lock): the next query checks again
        return None

    def verified(self) -> dict[int, int]:
        """Per partition, the offset below which a reader checked every record of the
        topic (`damage_under`); 0 for none, or a row that does not read (checked again)."""
        try:
            raw = self.log.state(f"{_VERIFIED}/{self.topic}")
            return {} if raw is None else {int(p): int(o) for p, o in orjson.loads(raw).items()}
        except (LogError, ValueError, TypeError, AttributeError):
            return {}

    def _damage(self, partition: int, start: int, end: int) -> Damage | None:
        """The first damage among the records `start`..`end` of a partition, or None."""
        for item in self.log.scan(self.topic, partition, start):
            offset = item.first if isinstance(item, Damage) else item.offset
            if offset >= end:
                break
            if isinstance(item, Damage):
                return item
        return None

    def restore(self, settings: SettingsLike, *, events: int | None = None, ts: float | None = None,
                needs: Collection[str] | None = None) -> Usable:
        """The newest snapshot at or before (`events`, `ts`) usable under `settings`, restored;
        else why none is (the reason of the newest candidate refused; None when there is
        no candidate: none stored, or every one covers more than asked). `needs` (a query's:
        the large sections it reads) lets a snapshot that covers the log read its other large
        rows only if the ledger ever asks for them; None (a service's) reads every row now.
        A row read now that is bad refuses the snapshot (a warning and a full fold)."""
        digest = knobs_digest(settings)
        ends = self.log.end_offsets(self.topic)
        problem: str | None = None
        for name, header, bad in self.headers():
            if header is None:
                problem = problem or f"snapshot {name} is {bad}"
                continue
            if not header.within(events, ts):
                continue
            why = _refusal(header, digest, ends)
            if why is not None:
                problem = problem or f"snapshot {name} {why}"
                continue
            try:
                stored = set(self.log.state_names())
                for section in SECTIONS:
                    if f"{name}.{_row(section)}" not in stored:
                        raise ValueError(f"its {_row(section)} is missing")
                # a snapshot that covers the log is parsed lazily (a query may need only its
                # body); one with a tail to fold now, so a bad section costs a full fold here
                lazy = all(header.positions.get(p, 0) >= o for p, o in ends.items())
                rows = _Rows(self.log, name)
                later = () if needs is None or not lazy else set(LAZY_SECTIONS) - set(needs)
                rows.prefetch(s for s in SECTIONS if s not in later)
                with long_fold():  # many objects, no cycles: no collections while parsing
                    ledger = Ledger.from_sections(settings, rows, lazy=lazy)
                return Usable(ledger, header, None)
            except (LogError, ValueError, KeyError, TypeError) as exc:
                problem = problem or f"snapshot {name} is corrupt ({exc})"
        return Usable(None, None, problem)


class _Rows(Mapping[str, bytes]):
    """A snapshot's sections, each row read from the log (checksum verified) when asked
    for; one asked for after the log was closed (a command closes it once folded, then
    reads the ledger) from the file opened again. A row gone meanwhile (dropped for a newer
    snapshot) or damaged is a LogError naming it, never an empty section."""

    def __init__(self, log: EmbeddedLog, name: str) -> None:
        self._log = log
        self._name = name
        self._read: dict[str, bytes] = {}

    def prefetch(self, sections: Iterable[str]) -> None:
        """Read (and check) these rows now, while a bad one can still refuse the snapshot."""
        for section in sections:
            self._read[section] = self[section]

    def __getitem__(self, section: str) -> bytes:
        if section not in SECTIONS:
            raise KeyError(section)
        if section in self._read:
            return self._read[section]
        row = f"{self._name}.{_row(section)}"
        if self._log.closed:
            if not self._log.db.exists():  # never a new, empty log in its place
                raise LogError(f"{self._log.db} is gone: cannot read snapshot row {row!r}")
            with EmbeddedLog(self._log.root) as log:
                raw = log.state(row)
        else:
            raw = self._log.state(row)
        if raw is None:
            raise LogError(f"{self._log.db}: snapshot row {row!r} is gone (a newer snapshot "
                           "replaced it); run the command again")
        return raw

    def __iter__(self) -> Iterator[str]:
        return iter(SECTIONS)

    def __len__(self) -> int:
        return len(SECTIONS)


def _row(section: str) -> str:
    """The state row suffix of a section ("ledger" keeps format 1's name, `.body`)."""
    return "body" if section == "ledger" else section


def _refusal(header: SnapshotHeader, digest: str, ends: Mapping[int, int]) -> str | None:
    if header.format != FORMAT:
        return f"has format version {header.format}, this PoolLedger reads {FORMAT}"
    if header.knobs != digest:
        return "was folded under other knobs"
    if any(off > ends.get(p, 0) for p, off in header.positions.items()):
        return "covers positions past the log's end (the log was replaced)"
    return None


