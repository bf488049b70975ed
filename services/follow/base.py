"""The follower base: a file of a real pool read from a stored position into events on the log.

Why one base: the job event log, the history files and Accountantnew.log are all files that
HTCondor appends to, rotates (renames aside and starts anew) or truncates, and a follower must
survive every one of those and a kill -9 without losing or doubling an event. What differs is
only how a stretch of bytes becomes events (`Follower.read`).

Position. What a follower has consumed is a `Position`: the file's identity (device, inode and
a digest of its first bytes), the byte offset after the last thing converted, the per-source
sequence number of the last event it made, and the converter's own carry-over (a job's
submitter and slot, the accountant's records). On the embedded log the position is stored with
`put_state` in the SAME transaction as the events and dead letters it produced, so after a
kill -9 the log and the position agree: the follower resumes exactly after the last committed
event. On Kafka there is no such transaction: the events are appended first, then the position
is written (atomically) to `<home>/follow/<name>.json`; a crash in between re-reads the same
bytes from the same position with the same carry, so the same events come out with the same
ids (`<source>:<seq>`, or ids derived from the data), and the ledger's dedup by id drops the
second copy.

Rotation and truncation. Each poll compares the path's identity with the position's:
- same file, size below the offset (or its first bytes changed): truncated in place, as
  `copytruncate` does; read again from 0, said in the report;
- another file at the path: rotated. The old file is looked for by its identity among the
  path's siblings (EVENT_LOG's `.old`, history's `history.<time>`), finished from the stored
  offset if found, then the new file is read from 0. An old file that is gone (Accountantnew.log
  is replaced by a rename over it) cannot be finished, and the report says so.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import orjson

from schemas.events import Envelope, Payload, make_event
from streams.log.embedded import EmbeddedLog, atomic_file
from streams.log.events import DeadLetter, EventLog
from streams.log.topics import EVENTS

__all__ = ["Chunk", "FollowError", "FollowReport", "Follower", "Position", "file_identity"]

log_ = logging.getLogger(__name__)

#: bytes of a file's beginning whose digest tells a rewritten file from the one followed
HEAD_BYTES = 1024


class FollowError(Exception):
    """A follower cannot go on (its file unreadable, its stored position unusable)."""


@dataclass
class Position:
    """How far a follower has read, and everything it needs to go on from there."""

    path: str
    dev: int = 0
    ino: int = 0
    head: str = ""
    offset: int = 0
    seq: int = 0
    carry: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return orjson.dumps({"path": self.path, "dev": self.dev, "ino": self.ino,
                             "head": self.head, "offset": self.offset, "seq": self.seq,
                             "carry": self.carry})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Position:
        try:
            d = orjson.loads(raw)
            return cls(str(d["path"]), int(d["dev"]), int(d["ino"]), str(d["head"]),
                       int(d["offset"]), int(d["seq"]), dict(d["carry"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise FollowError(f"{where}: the stored position is unreadable ({exc}); "
                              "remove it to read the file again from its start") from None


@dataclass
class Chunk:
    """What `Follower.read` made of a stretch of a file."""

    events: list[Envelope]
    dead: list[DeadLetter]
    #: the offset after the last byte consumed (a partial record at the end is not)
    offset: int


@dataclass
class FollowReport:
    """What the polls did: events appended, dead letters, rotations and truncations seen."""

    events: int = 0
    dead: int = 0
    rotations: int = 0
    truncations: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, other: FollowReport) -> None:
        self.events += other.events
        self.dead += other.dead
        self.rotations += other.rotations
        self.truncations += other.truncations
        self.notes += other.notes


def file_identity(path: Path, upto: int) -> tuple[int, int, int, str]:
    """(device, inode, size, digest of the first min(upto, HEAD_BYTES) bytes) of a file."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head = f.read(min(upto, HEAD_BYTES))
    return st.st_dev, st.st_ino, st.st_size, hashlib.sha256(head).hexdigest()[:16]


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _digest_at(path: Path, upto: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(min(upto, HEAD_BYTES))).hexdigest()[:16]


class Follower:
    """Follows one file into the events topic (see the module doc); subclasses convert."""

    #: the follower's kind, part of its state's name and of its events' source
    kind: ClassVar[str] = ""

    def __init__(self, elog: EventLog, path: Path, *, name: str | None = None,
                 home: Path | None = None, batch: int = 5_000) -> None:
        self.elog = elog
        self.path = Path(os.path.abspath(path))
        self.name = name or str(self.path)
        self.batch = batch
        #: the events' source: `<kind>@<name>`, their ids `<source>:<seq>` unless data-derived
        self.source = f"{self.kind}@{self.name}"
        self.state_name = f"follow:{self.kind}:{self.name}"
        self._embedded = elog.log if isinstance(elog.log, EmbeddedLog) else None
        if self._embedded is None and home is None:
            raise FollowError("a follower on Kafka needs a data directory for its position")
        safe = hashlib.sha256(self.state_name.encode()).hexdigest()[:16]
        self._file = (home / "follow" / f"{self.kind}-{safe}.json") if home is not None else None
        self.pos = self._load()
        #: polls so far (a converter may wait a poll for what follows a record)
        self.polls = 0

    # -- the position store ---------------------------------------------------------------

    def _load(self) -> Position:
        if self._embedded is not None:
            raw = self._embedded.state(self.state_name)
            where = f"{self._embedded.db}: state {self.state_name!r}"
        else:
            assert self._file is not None
            raw = self._file.read_bytes() if self._file.exists() else None
            where = str(self._file)
        if raw is None:
            return Position(str(self.path))
        pos = Position.from_bytes(raw, where)
        if pos.path != str(self.path):
            raise FollowError(f"{where}: the position stored under this name follows "
                              f"{pos.path}, not {self.path}: give another --name")
        return pos

    def _commit(self, events: list[Envelope], dead: list[DeadLetter], pos: Position) -> None:
        """Append `events` and `dead` and store `pos`: one transaction on the embedded log;
        append, then the position file, on Kafka (a crash between repeats the same ids)."""
        blob = pos.to_bytes()
        if self._embedded is not None:
            with self._embedded.transaction():
                if events:
                    self.elog.append(EVENTS, events)
                if dead:
                    self.elog.dead_letter(EVENTS, dead)
                self._embedded.put_state(self.state_name, blob)
            return
        if events:
            self.elog.append(EVENTS, events)
        if dead:
            self.elog.dead_letter(EVENTS, dead)
        assert self._file is not None
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(self._file, fsync=True) as f:
            f.write(blob)

    # -- what subclasses provide ----------------------------------------------------------

    def read(self, path: Path, pos: Position, final: bool) -> Chunk:
        """Convert what `path` holds from `pos.offset` on (at most about `self.batch` events),
        updating `pos.carry` in place and numbering events with `event(..., pos)`; `final`
        says no more will ever be appended to this file (it was rotated away), so a record
        left incomplete at its end is dead-lettered."""
        raise NotImplementedError

    def new_file(self, carry: dict[str, Any]) -> None:
        """The followed path now holds another file (or the same one truncated): forget what
        belonged to the old file's content (`carry` is updated in place)."""

    def finish(self, pos: Position) -> tuple[list[Envelope], list[DeadLetter]]:
        """Events held back waiting for what might follow them, given up on (the end of a
        `--once` run, the end of a rotated file): their events and dead letters."""
        return [], []

    # -- helpers for subclasses -----------------------------------------------------------

    def event(self, payload: Payload, ts: float, pos: Position, id: str | None = None) -> Envelope:
        """The next event of this follower's source (its seq counted in `pos`)."""
        pos.seq += 1
        return make_event(payload, ts=ts, source=self.source, seq=pos.seq, id=id)

    def dead_letter(self, path: Path, offset: int, reason: str, raw: bytes,
                    line: int | None = None) -> DeadLetter:
        """A dead letter naming the file and the byte offset (and line) it could not read."""
        where = f"{path}:{line}" if line is not None else str(path)
        return DeadLetter(f"{where} (byte {offset}): {reason}", raw[:65536], EVENTS,
                          path=str(path), line=line)

    # -- polling --------------------------------------------------------------------------

    def _copy(self) -> Position:
        p = self.pos
        return Position(p.path, p.dev, p.ino, p.head, p.offset, p.seq,
                        orjson.loads(orjson.dumps(p.carry)))

    def _find_old(self) -> Path | None:
        """The file the position was reading, under the name it was rotated to (a sibling of
        the followed path whose device and inode match), or None when it is gone."""
        p = self.pos
        parent = self.path.parent
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            return None
        for n in names:
            if not n.startswith(self.path.name) or n == self.path.name:
                continue
            cand = parent / n
            try:
                st = cand.stat()
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (p.dev, p.ino) and st.st_size >= p.offset:
                try:
                    if _digest_at(cand, p.offset) == p.head:
                        return cand
                except OSError:
                    continue
        return None

    def _drain(self, path: Path, final: bool, report: FollowReport,
               stop: Callable[[], bool]) -> None:
        """Read `path` from the position to its end, committing chunk by chunk."""
        while not stop():
            pos = self._copy()
            start = pos.offset
            chunk = self.read(path, pos, final)
            if chunk.offset == start and not chunk.events and not chunk.dead:
                return
            pos.offset = chunk.offset
            pos.head = _digest_at(path, pos.offset)
            if _identity(path) != (pos.dev, pos.ino):
                return  # renamed while read: the next poll reads it under its new name
            self._commit(chunk.events, chunk.dead, pos)
            self.pos = pos
            report.events += len(chunk.events)
            report.dead += len(chunk.dead)

    def poll(self, stop: Callable[[], bool] = lambda: False) -> FollowReport:
        """Read everything new (across a rotation or truncation) and append it."""
        report = FollowReport()
        self.polls += 1
        try:
            dev, ino, size, _ = file_identity(self.path, 0)
        except FileNotFoundError:
            return report  # between a rotation's rename and the new file: next poll
        except OSError as exc:
            raise FollowError(f"{self.path}: cannot read: {exc.strerror}") from None
        try:
            self._poll(dev, ino, size, report, stop)
        except FileNotFoundError:
            pass  # renamed or removed while read: the next poll sees what replaced it
        for note in report.notes:
            log_.info("%s", note)
        return report

    def _poll(self, dev: int, ino: int, size: int, report: FollowReport,
              stop: Callable[[], bool]) -> None:
        p = self.pos
        if p.dev == 0 and p.ino == 0:
            self._restart(dev, ino, report, note=None)
        elif (dev, ino) != (p.dev, p.ino):
            old = self._find_old()
            if old is not None:
                self._drain(old, True, report, stop)
                report.notes.append(f"{self.path}: rotated; finished the old file as {old} "
                                    f"at byte {self.pos.offset}")
            else:
                report.notes.append(f"{self.path}: replaced; the old file is gone, read up to "
                                    f"byte {p.offset}")
            report.rotations += 1
            self._restart(dev, ino, report, note=None)
        elif size < p.offset or _digest_at(self.path, p.offset) != p.head:
            report.truncations += 1
            self._restart(dev, ino, report,
                          note=f"{self.path}: truncated (now {size} bytes, was read to byte "
                               f"{p.offset}); reading it again from its start")
        self._drain(self.path, False, report, stop)

    def _restart(self, dev: int, ino: int, report: FollowReport, note: str | None) -> None:
        """Point the position at the start of the file now at the path (stored at once, so a
        crash right after a rotation does not finish the old file a second time)."""
        pos = self._copy()
        self.new_file(pos.carry)
        pos.dev, pos.ino, pos.offset, pos.head = dev, ino, 0, _digest_at(self.path, 0)
        self._commit([], [], pos)
        self.pos = pos
        if note:
            report.notes.append(note)

    def flush(self) -> FollowReport:
        """The end of a `--once` run: append what `finish` holds back, and say what the file
        holds past the position (a record not complete yet: left for the next run)."""
        report = FollowReport()
        pos = self._copy()
        events, dead = self.finish(pos)
        if events or dead:
            self._commit(events, dead, pos)
            self.pos = pos
        report.events, report.dead = len(events), len(dead)
        try:
            size = self.path.stat().st_size
        except OSError:
            return report
        if (self.pos.dev, self.pos.ino) == _identity(self.path) and size > self.pos.offset:
            report.notes.append(f"{self.path}: {size - self.pos.offset} bytes after byte "
                                f"{self.pos.offset} are not a complete record yet; left for "
                                "the next run")
        return report

    def run(self, interval: float, stop: Callable[[], bool],
            on_report: Callable[[FollowReport], None] | None = None) -> FollowReport:
        """Poll every `interval` seconds until `stop()`."""
        total = FollowReport()
        while not stop():
            report = self.poll(stop)
            total.add(report)
            if on_report is not None and (report.events or report.dead or report.notes):
                on_report(report)
            deadline = time.monotonic() + interval
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.2, interval))
        return total
