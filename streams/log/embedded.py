"""The embedded log: a durable, serverless, one-machine implementation of the log port.

It lets a single-machine pool (and every test) run the same processors as the Kafka
deployment without a broker. It is one SQLite database, `<root>/log.sqlite`, in WAL mode.

Why SQLite rather than files of our own: its transactions, crash recovery and multi-process
locking are the most tested of any embedded store, so an append is all-or-nothing (a process
killed inside one leaves no trace of it), readers in other processes never see half an append,
and sink checkpoints or ledger snapshots can later be committed atomically with the consumer
positions they describe (`transaction()`). That safety costs speed against the segment files
it replaced (bench/log_throughput.py measures both in one run); the old format is still
readable (`streams.log.segments`, `poolledger log migrate`).

Tables:

    topics(id, name, partitions, compact)
    partitions(id, topic, partition, next_offset)     next_offset: the partition's end offset
    records(id, key, value, ts, crc)                  id = partition id << 40 | offset
    groups(grp, partition, next_offset)               committed consumer positions
    state(name, value, crc)                           checkpoints/snapshots (see transaction())

Records live in one rowid table whose integer key encodes (partition, offset): a read is a
range scan of the primary b-tree, the cheapest access SQLite has. Against a WITHOUT ROWID
table keyed (topic, partition, offset), interleaved A/B on this (busy) machine, 200k events in
batches of 5,000: best of 3, 112k vs 92k appends/s and 509k vs 411k raw reads/s.

Integrity. SQLite checksums neither pages nor rows, so every record carries a CRC-32C of its
id, timestamp, key and value, verified on every read; offsets of a non-compacted partition are
dense from 0 to next_offset. A checksum mismatch, a missing offset, or a database SQLite itself
finds damaged ("file is not a database", "malformed") raises `LogCorruptError` naming the file
and the topic[partition]@offset, on reads and on writes (before its first append to a
partition, a writer checks that partition once), and nothing is ever rewritten to hide it:
`poolledger log verify` lists every problem, `poolledger log salvage DEST` copies what is
readable. The only thing ever discarded is an append that never committed (SQLite rolls it
back); `wal_tail_frames` lets `verify` report one.

Copies and readers. Until SQLite folds them into the file (every ~40 MB), the latest commits
live only in `log.sqlite-wal`, so a copy of `log.sqlite` alone can lose them: `backup()` copies
with SQLite's backup API, and `log.commits` beside the database (written after each commit,
outside the WAL) records the committed end offsets, which `missing_commits()` compares with the
log's. A process that may not write the log (another user's data directory, a read-only file
system, or directories others could change: `streams.log.files`) opens it read-only and every
read works; a write fails with one line saying why.

Durability: `synchronous=NORMAL` in WAL mode survives a kill -9 of the process once an append
has returned (the transaction is in the WAL, in the page cache); `fsync=True` (FULL) also
survives power loss. Several processes may append at once (a pipeline and an importer or a
dead-lettering reader): SQLite's write lock serializes them, waiting up to `lock_timeout`.

Partitioning: keyed records go to `zlib.crc32(key) % partitions` (stable across processes
and Python versions, unlike `hash()`); unkeyed records go to partition 0, so pool-wide
events keep one total order.

Compaction: `compact(topic)` is explicit (nothing runs in the background); it keeps the latest
record per key with its original offset (tombstones, i.e. empty values, are kept as the latest
value of their key); reads skip the holes. There is no time/size retention yet.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import re
import shutil
import sqlite3
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import orjson
from crc32c import crc32c

from streams.log.port import (
    Appended,
    LogError,
    Outgoing,
    Record,
    TopicNotFoundError,
    TopicSpec,
)
from streams.log.files import UnsafePathError, atomic_file, check_parents, open_private
from streams.log.segments import is_segment_log

# atomic_file: re-exported from streams.log.files, where it moved (its importers here stay valid)
__all__ = ["DB_NAME", "COMMITS_NAME", "Damage", "EmbeddedLog", "LogCorruptError", "atomic_file",
           "looks_like_log_dir", "partition_for_key", "wal_tail_frames"]

log_ = logging.getLogger(__name__)

DB_NAME = "log.sqlite"
COMMITS_NAME = "log.commits"
_OFFSET_BITS = 40  # offsets below 2**40 per partition; partition ids below 2**23
_MAX_OFFSET = (1 << _OFFSET_BITS) - 1
_CRC_HEAD = struct.Struct("<qdi")  # id, ts, key length (-1: no key): what the crc covers first
_SCAN_BATCH = 5_000
# 16 KiB pages: ~18% less CPU per appended record than SQLite's default 4 KiB (measured for
# 5,000-record batches of ~310-byte events); records still fit a page, so damage stays local.
_PAGE_SIZE = 16384
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL, compact INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partitions(id INTEGER PRIMARY KEY, topic INTEGER NOT NULL,
    partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, UNIQUE(topic, partition));
CREATE TABLE IF NOT EXISTS records(id INTEGER PRIMARY KEY, key BLOB, value BLOB NOT NULL,
    ts REAL NOT NULL, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS groups(grp TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, PRIMARY KEY(grp, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state(name TEXT PRIMARY KEY, value BLOB NOT NULL,
    crc INTEGER NOT NULL);
"""
# `state` is a rowid table: in a WITHOUT ROWID one (before) the rows are the key's b-tree cells,
# and SQLite reads a cell's whole payload to compare keys when it overflows, so finding any
# name read the megabytes of the snapshot sections beside it (measured: 2.4 s for a 186-byte
# header next to a 200,000-slot snapshot; bench/scale.py). An older file is converted by its
# first `put_state`.
_STATE_ROWID = """
CREATE TABLE state_rowid(name TEXT PRIMARY KEY, value BLOB NOT NULL, crc INTEGER NOT NULL);
INSERT INTO state_rowid SELECT name, value, crc FROM state;
DROP TABLE state;
ALTER TABLE state_rowid RENAME TO state
"""
_SELECT = "SELECT id, key, value, ts, crc FROM records WHERE id >= ? AND id < ? ORDER BY id LIMIT ?"


class LogCorruptError(LogError):
    """The log's file is damaged; the message names the file and the position."""


@dataclass(frozen=True, slots=True)
class Damage:
    """Offsets `first`..`last` of a partition that cannot be read, and why."""

    topic: str
    partition: int
    first: int
    last: int
    reason: str

    def __str__(self) -> str:
        span = f"@{self.first}" if self.first == self.last else f" offsets {self.first}-{self.last}"
        return f"{self.topic}[{self.partition}]{span}: {self.reason}"


def partition_for_key(key: bytes | None, partitions: int) -> int:
    """The partition of a record: crc32(key) % partitions; unkeyed records go to 0."""
    return 0 if key is None else zlib.crc32(key) % partitions


def looks_like_log_dir(path: Path) -> bool:
    """Whether `path` holds nothing but an embedded log (of this or the segment format)."""
    names = {p.name for p in path.iterdir()}
    return names <= {"topics", "groups", DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", COMMITS_NAME}


def _why_read_only(root: Path) -> str:
    """Why this process may not write the log in `root`, in a user's words."""
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
        owner = root.stat().st_uid
    except OSError as e:
        return f"cannot check {root}: {e.strerror}"
    try:
        me, them = pwd.getpwuid(os.getuid()).pw_name, pwd.getpwuid(owner).pw_name
    except KeyError:
        me, them = f"uid {os.getuid()}", f"uid {owner}"
    return f"{me} may not write {root}, owned by {them}; queries still read it"


def _unsafe(db: Path) -> UnsafePathError | None:
    """Why the log at `db` must not be written by this process (its directories let others
    replace its files, or `db` is a link), or None. Such a log is still read."""
    try:
        check_parents(db)
    except UnsafePathError as exc:
        return exc
    if db.is_symlink():
        return UnsafePathError(f"{db}: a symbolic link; refused (PoolLedger never writes "
                               "through a link)")
    return None


def _marker_ends(raw: bytes) -> dict[str, int]:
    """The `topic[partition]` -> end offset pairs of a commit marker ({} if unreadable: a
    marker cut by a crash weakens the check, it never fails a log)."""
    try:
        marked = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return {str(k): v for k, v in marked.items() if type(v) is int} if isinstance(marked, dict) else {}


def _check_topic_name(topic: str) -> None:
    if not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise LogError(f"invalid topic name {topic!r}: use 1-249 of [A-Za-z0-9._-]")


def _record_crc(rid: int, key: bytes | None, value: bytes, ts: float) -> int:
    """CRC-32C of (id, ts, key length) | key | value; one call over a joined buffer is faster
    than three chained ones for records of a few hundred bytes."""
    if key is None:
        return crc32c(_CRC_HEAD.pack(rid, ts, -1) + value)
    return crc32c(_CRC_HEAD.pack(rid, ts, len(key)) + key + value)


def _row_problem(row: tuple[Any, ...]) -> str | None:
    """Why a stored record row is not what was appended (None: it checks out)."""
    rid, key, value, ts, crc = row
    try:
        if _record_crc(rid, key, value, ts) == crc:
            return None
    except (TypeError, struct.error):
        return "a field has the wrong type (the record was altered on disk)"
    return "checksum mismatch (the record was altered on disk)"


def wal_tail_frames(db: Path) -> int:
    """Frames at the end of `db`'s write-ahead log after its last commit: an append that never
    committed (in progress in another process, or interrupted by a crash; SQLite ignores it)."""
    try:
        with open(f"{db}-wal", "rb") as f:
            head = f.read(32)
            if len(head) < 32:
                return 0
            page_size, salts = struct.unpack(">I", head[8:12])[0], head[16:24]
            pending = 0
            while len(frame := f.read(24)) == 24:
                if frame[8:16] != salts:
                    break  # a frame of an earlier generation of the WAL: not part of this one
                pending = 0 if struct.unpack(">I", frame[4:8])[0] else pending + 1  # commit frame?
                f.seek(page_size, os.SEEK_CUR)
            return pending
    except FileNotFoundError:
        return 0


class EmbeddedLog:
    """A durable local log with the `Log` port's semantics; see the module docstring."""

    def __init__(self, root: Path | str, *, fsync: bool = False, lock_timeout: float = 30.0) -> None:
        self.root = Path(root)
        self.db = self.root / DB_NAME
        self.fsync = fsync
        self.lock_timeout = lock_timeout
        if not self.db.exists() and is_segment_log(self.root):
            raise LogError(f"{self.root} holds a segment log of an earlier PoolLedger version; "
                           "convert it with `poolledger log migrate`")
        #: why this process may only read the log (None: it may write), see `_read_only`
        self.readonly: str | None = None
        self._unsafe: UnsafePathError | None = None  # why writing here is refused, if it is
        self._copy: tempfile.TemporaryDirectory[str] | None = None
        try:
            if self.db.exists() and not (os.access(self.db, os.W_OK) and os.access(self.root, os.W_OK)):
                self.readonly = _why_read_only(self.root)
            elif (unsafe := _unsafe(self.db)) is not None:
                if not self.db.exists():  # a new log: its creation is a write
                    raise unsafe
                self.readonly, self._unsafe = str(unsafe), unsafe
            if self.readonly is not None:
                self._conn: sqlite3.Connection | None = self._read_only()
            else:
                self.root.mkdir(parents=True, exist_ok=True)
                self._conn = sqlite3.connect(self.db, timeout=lock_timeout, isolation_level=None,
                                             check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise LogError(f"cannot open the log {self.db}: {e}") from e
        self._depth = 0  # nesting of transaction()
        self._ends: dict[str, int] = {}  # end offsets the open transaction wrote, for log.commits
        self._marker: int | None = None  # log.commits, opened by the first commit
        self._specs: dict[str, TopicSpec] = {}
        self._pids: dict[tuple[str, int], int] = {}
        self._checked: set[int] = set()  # partitions verified before this instance's first write
        with self._sql("opening the log"):
            conn = self._conn
            conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            conn.execute("PRAGMA cache_size=-65536")  # 64 MiB
            if self.readonly is None:
                # Fold the WAL into the file every ~40 MB rather than every 4 MB: each fold
                # ends in an fsync, which dominated appends (measured: ~180k -> ~280k events/s).
                conn.execute(f"PRAGMA wal_autocheckpoint={40 * 1024 * 1024 // _PAGE_SIZE}")
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute(f"PRAGMA page_size={_PAGE_SIZE}")  # only a new file takes it
                    conn.execute("PRAGMA journal_mode=WAL")
            if conn.execute("SELECT count(*) FROM sqlite_schema WHERE name='state'").fetchone()[0] == 0:
                with self.transaction():
                    for statement in _SCHEMA.split(";"):
                        conn.execute(statement)
            self._old_state = self._state_without_rowid()

    def _read_only(self) -> sqlite3.Connection:
        """A connection for a caller who may not write the log (an auditor reading another
        user's data directory, an archived log on read-only media). SQLite's `mode=ro` reads
        the WAL through its `-shm` index, which it cannot create in a directory it may not
        write: then a log without a WAL (every commit in the file) is opened `immutable`,
        and one whose WAL holds commits is read from a private copy of the two files, so
        what was committed is never left out."""
        uri = self.db.absolute().as_uri()
        try:
            conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=self.lock_timeout,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
            return conn
        except sqlite3.OperationalError as e:
            if e.sqlite_errorname not in ("SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY",
                                          "SQLITE_READONLY_CANTINIT", "SQLITE_READONLY"):
                raise
        wal = Path(f"{self.db}-wal")
        if not wal.exists() or wal.stat().st_size == 0:
            return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None,
                                   check_same_thread=False)
        self._copy = tempfile.TemporaryDirectory(prefix="poolledger-ro-")
        copy = Path(self._copy.name) / DB_NAME
        shutil.copyfile(self.db, copy)
        shutil.copyfile(wal, f"{copy}-wal")
        return sqlite3.connect(copy, isolation_level=None, check_same_thread=False)

    def _state_without_rowid(self) -> bool:
        row = self.conn.execute("SELECT sql FROM sqlite_schema WHERE name='state'").fetchone()
        return row is not None and "WITHOUT ROWID" in row[0].upper()

    def __repr__(self) -> str:
        return f"EmbeddedLog({str(self.root)!r})"

    @property
    def closed(self) -> bool:
        """Whether `close` was called (a reader that outlives it opens the file again)."""
        return self._conn is None

    def __enter__(self) -> EmbeddedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- SQLite plumbing ------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LogError(f"{self!r} is closed")
        return self._conn

    @contextlib.contextmanager
    def _sql(self, where: str) -> Iterator[None]:
        """Translate SQLite's errors: a held write lock, a damaged file (named, with `where`)."""
        try:
            yield
        except sqlite3.OperationalError as e:
            if e.sqlite_errorname in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                raise LogError(f"{self.db}: another process has held the write lock for over "
                               f"{self.lock_timeout:g}s") from None
            raise self._damaged(where, e) from e
        except sqlite3.DatabaseError as e:
            raise self._damaged(where, e) from e

    def _damaged(self, where: str, e: sqlite3.Error) -> LogError:
        if e.sqlite_errorname in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or "malformed" in str(e):
            return LogCorruptError(f"{self.db}: {where}: {e}")
        if e.sqlite_errorname == "SQLITE_FULL":  # SQLite's words for ENOSPC: say the OS's
            return LogError(f"{self.db}: {where}: {os.strerror(errno.ENOSPC)} ({e})")
        if (e.sqlite_errorname or "").startswith("SQLITE_READONLY"):
            return self._read_only_error(where)
        return LogError(f"{self.db}: {where}: {e}")

    def _read_only_error(self, where: str) -> LogError:
        if self._unsafe is not None:
            return self._unsafe
        why = self.readonly or _why_read_only(self.root)
        return LogError(f"{self.db}: {where}: the log is read-only ({why})")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One SQLite write transaction around everything done in the block (nestable).

        Appends, `commit` and `put_state` inside it become durable together or not at all:
        this is how a sink checkpoint or a ledger snapshot is stored atomically with the
        consumer positions (or records) it describes:

            with log.transaction():
                log.commit("sink-es", EVENTS, positions)
                log.put_state("sink-es", checkpoint_bytes)
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        conn = self.conn
        if self.readonly is not None:
            raise self._read_only_error("cannot write")
        with self._sql("beginning a write"):
            conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        self._ends.clear()
        try:
            yield
        except BaseException:
            self._depth = 0
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            with self._sql("committing"):
                conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        if self._ends:
            self._mark_commits(self._ends)

    # -- the commit marker ----------------------------------------------------------------

    def _mark_commits(self, ends: Mapping[str, int]) -> None:
        """Record committed end offsets in `log.commits`, beside the database and outside its
        WAL: a copy of `log.sqlite` without the WAL that held the last commits (after a kill
        -9, or by a backup tool skipping `*-wal`) then ends before the marker, and `verify`
        says so. Written after the commit, merged by maximum, so it never claims more than
        was committed (two writers racing may leave it lower: a weaker check, never a false
        one)."""
        try:
            if self._marker is None:
                self._marker = open_private(self.root / COMMITS_NAME, os.O_RDWR | os.O_CREAT)
            current = os.pread(self._marker, 1 << 20, 0)
            marked = _marker_ends(current)
            for key, end in ends.items():
                marked[key] = max(end, marked.get(key, 0))
            # in place, padded (JSON allows trailing blanks): one write, no rename (~10 us)
            os.pwrite(self._marker, orjson.dumps(marked, option=orjson.OPT_SORT_KEYS)
                      .ljust(len(current)), 0)
        except OSError as e:  # the append is committed: only the later check is weaker
            log_.warning("%s: cannot record the commit: %s", self.root / COMMITS_NAME, e.strerror)
        except UnsafePathError as e:
            log_.warning("cannot record the commit: %s", e)

    def commit_marker(self) -> dict[str, int] | None:
        """The end offsets `log.commits` records by `topic[partition]` (None: no marker)."""
        try:
            return _marker_ends((self.root / COMMITS_NAME).read_bytes())
        except OSError:
            return None

    def missing_commits(self) -> list[str]:
        """Each partition that ends before the end its writers committed (`log.commits`):
        the commits a lost WAL held."""
        ends = {f"{t}[{p}]": end for t in self.topics() for p, end in self.end_offsets(t).items()}
        out = []
        for key, want in sorted((self.commit_marker() or {}).items()):
            end = ends.get(key, 0)
            if end < want:
                out.append(f"{key} ends at offset {end}, but its writers committed up to offset "
                           f"{want - 1} ({COMMITS_NAME}): the write-ahead log that held them is "
                           f"missing (was {DB_NAME} copied without {DB_NAME}-wal? copy a log with "
                           "`poolledger log backup`)")
        return out

    def backup(self, dest: Path) -> Path:
        """A consistent copy of the whole log, WAL contents included, made with SQLite's
        backup API into the directory `dest` (new or empty), with its commit marker; works
        on a read-only log too. Returns the new database's path."""
        dest.mkdir(parents=True, exist_ok=True)
        check_parents(dest / DB_NAME)
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{DB_NAME}.")
        os.fchmod(fd, 0o644)  # as SQLite makes a log (under the usual umask)
        os.close(fd)
        try:
            target = sqlite3.connect(tmp)
            try:
                with self._sql("backing up"):
                    self.conn.backup(target)
            finally:
                target.close()
            os.replace(tmp, dest / DB_NAME)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with EmbeddedLog(dest) as copy:
            copy._mark_commits({f"{t}[{p}]": end for t in copy.topics()
                                for p, end in copy.end_offsets(t).items()})
        return dest / DB_NAME

    # -- topics -------------------------------------------------------------------------

    def create_topic(self, spec: TopicSpec) -> None:
        _check_topic_name(spec.name)
        if spec.partitions < 1:
            raise LogError(f"topic {spec.name!r}: partitions must be >= 1, not {spec.partitions}")
        if spec.name in self.topics():
            return  # idempotent, and without a write: a reader of a read-only log ensures topics
        with self.transaction(), self._sql(f"creating topic {spec.name}"):
            conn = self.conn
            cur = conn.execute("INSERT OR IGNORE INTO topics(name, partitions, compact) VALUES (?,?,?)",
                               (spec.name, spec.partitions, int(spec.compact)))
            if cur.rowcount:
                tid = cur.lastrowid
                conn.executemany("INSERT INTO partitions(topic, partition, next_offset) VALUES (?,?,0)",
                                 [(tid, p) for p in range(spec.partitions)])

    def topics(self) -> list[str]:
        with self._sql("listing topics"):
            return sorted(r[0] for r in self.conn.execute("SELECT name FROM topics"))

    def spec(self, topic: str) -> TopicSpec:
        """The topic's stored spec (partitions, compact flag)."""
        spec = self._specs.get(topic)
        if spec is None:
            _check_topic_name(topic)
            with self._sql(f"reading topic {topic}"):
                row = self.conn.execute("SELECT partitions, compact FROM topics WHERE name=?",
                                        (topic,)).fetchone()
            if row is None:
                raise TopicNotFoundError(f"topic {topic!r} does not exist in {self.root}")
            spec = TopicSpec(topic, int(row[0]), bool(row[1]))
            self._specs[topic] = spec
        return spec

    def partitions(self, topic: str) -> int:
        return self.spec(topic).partitions

    def _pid(self, topic: str, partition: int) -> int:
        """The partition's id (the high bits of its records' ids)."""
        pid = self._pids.get((topic, partition))
        if pid is None:
            n = self.partitions(topic)
            if not 0 <= partition < n:
                raise LogError(f"topic {topic!r} has no partition {partition} (it has {n})")
            with self._sql(f"reading {topic}[{partition}]"):
                row = self.conn.execute(
                    "SELECT p.id FROM partitions p JOIN topics t ON p.topic = t.id "
                    "WHERE t.name = ? AND p.partition = ?", (topic, partition)).fetchone()
            if row is None:
                raise LogCorruptError(f"{self.db}: {topic}[{partition}]: the partition's row is missing")
            pid = self._pids[(topic, partition)] = int(row[0])
        return pid

    def _end(self, pid: int, where: str) -> int:
        with self._sql(where):
            row = self.conn.execute("SELECT next_offset FROM partitions WHERE id=?", (pid,)).fetchone()
        if row is None:
            raise LogCorruptError(f"{self.db}: {where}: the partition's row is missing")
        return int(row[0])

    # -- append -------------------------------------------------------------------------

    def append(self, topic: str, records: Sequence[Outgoing]) -> list[Appended]:
        """Append in one transaction: all records are durable on return, or none is stored."""
        n = self.partitions(topic)
        if not records:
            return []
        with self.transaction():
            if n == 1:
                first = self._insert(topic, 0, records)
                return [Appended(0, o) for o in range(first, first + len(records))]
            crc = zlib.crc32
            targets = [0 if r[0] is None else crc(r[0]) % n for r in records]
            by_part: dict[int, list[Outgoing]] = {}
            for p, r in zip(targets, records):
                by_part.setdefault(p, []).append(r)
            next_off = {p: self._insert(topic, p, recs) for p, recs in by_part.items()}
        out = []
        for p in targets:
            o = next_off[p]
            next_off[p] = o + 1
            out.append(Appended(p, o))
        return out

    def append_to(self, topic: str, partition: int, records: Sequence[Outgoing]) -> int:
        """Append to one given partition (salvage keeps records where they were); returns the
        offset of the first."""
        with self.transaction():
            return self._insert(topic, partition, records)

    def _insert(self, topic: str, partition: int, records: Sequence[Outgoing]) -> int:
        """Store records at the partition's end (inside a transaction); returns the first offset."""
        pid = self._pid(topic, partition)
        self._check_before_write(topic, partition, pid)
        where = f"appending to {topic}[{partition}]"
        first = self._end(pid, where)
        if first + len(records) > _MAX_OFFSET:
            raise LogError(f"{topic}[{partition}]: more than {_MAX_OFFSET} records")
        rid = (pid << _OFFSET_BITS) + first
        rows: list[tuple[int, bytes | None, bytes, float, int]] = []
        head = _CRC_HEAD.pack
        add = rows.append
        for key, value, ts in records:
            if ts != ts:
                raise LogError(f"{topic}: a record's timestamp is NaN")
            ts += 0.0  # SQLite stores -0.0 as 0: the checksum must be of what it stores
            if key is None:
                add((rid, key, value, ts, crc32c(head(rid, ts, -1) + value)))
            else:
                add((rid, key, value, ts, crc32c(head(rid, ts, len(key)) + key + value)))
            rid += 1
        with self._sql(where):
            conn = self.conn
            conn.executemany("INSERT INTO records VALUES (?,?,?,?,?)", rows)
            conn.execute("UPDATE partitions SET next_offset=? WHERE id=?", (first + len(rows), pid))
        self._ends[f"{topic}[{partition}]"] = first + len(rows)
        return first

    def restore(self, topic: str, partition: int, records: Sequence[Record],
                end_offset: int | None = None) -> None:
        """Store records of another log at their own offsets (migration): each at or after the
        partition's end, densely unless the topic is compact; the end becomes `end_offset`
        (default: after the last record)."""
        pid = self._pid(topic, partition)
        dense = not self.spec(topic).compact
        where = f"restoring {topic}[{partition}]"
        with self.transaction():
            end = self._end(pid, where)
            rows = []
            for r in records:
                if r.offset < end or (dense and r.offset != end) or r.offset > _MAX_OFFSET:
                    raise LogError(f"{topic}[{partition}]@{r.offset}: expected offset "
                                   f"{'' if dense else '>= '}{end}")
                rid = (pid << _OFFSET_BITS) + r.offset
                rows.append((rid, r.key, r.value, r.timestamp,
                             _record_crc(rid, r.key, r.value, r.timestamp)))
                end = r.offset + 1
            if end_offset is not None:
                if end_offset < end or (dense and end_offset != end):
                    raise LogError(f"{topic}[{partition}]: end offset {end_offset} does not "
                                   f"follow the records (next {end})")
                end = end_offset
            with self._sql(where):
                self.conn.executemany("INSERT INTO records VALUES (?,?,?,?,?)", rows)
                self.conn.execute("UPDATE partitions SET next_offset=? WHERE id=?", (end, pid))
            self._ends[f"{topic}[{partition}]"] = end

    def _check_before_write(self, topic: str, partition: int, pid: int) -> None:
        """A writer refuses a damaged partition: the first write of this instance verifies it."""
        if pid in self._checked:
            return
        for item in self.scan(topic, partition):
            if isinstance(item, Damage):
                raise LogCorruptError(f"{self.db}: {item}; refusing to write")
        self._checked.add(pid)

    # -- read ---------------------------------------------------------------------------

    def containing(self, topic: str, partition: int, needle: bytes, offset: int = 0) -> int | None:
        """The first offset from `offset` whose value holds the bytes `needle` (None: none),
        found by SQLite itself (`instr` over the range, no row handed to Python): what finds
        an event's first version by its id (`EventLog.first_version`). The caller reads the
        record with `read`, which checks it."""
        pid = self._pid(topic, partition)
        where = f"{topic}[{partition}]@{offset}"
        end = self._end(pid, where)
        base = pid << _OFFSET_BITS
        with self._sql(f"searching {where}"):
            row = self.conn.execute(
                "SELECT id FROM records WHERE id >= ? AND id < ? AND instr(value, ?) > 0 "
                "ORDER BY id LIMIT 1", (base + offset, base + end, needle)).fetchone()
        return None if row is None else int(row[0]) - base

    def read(self, topic: str, partition: int, offset: int, max_records: int = 10_000) -> list[Record]:
        if offset < 0:
            raise LogError(f"{topic}[{partition}]: negative offset {offset}")
        pid = self._pid(topic, partition)
        where = f"{topic}[{partition}]@{offset}"
        end = self._end(pid, where)
        if offset >= end or max_records <= 0:
            return []
        base = pid << _OFFSET_BITS
        try:
            rows = self.conn.execute(_SELECT, (base + offset, base + end, max_records)).fetchall()
        except sqlite3.DatabaseError as e:
            # Name the first damaged offset, not just where this read started.
            for item in self.scan(topic, partition, offset):
                if isinstance(item, Damage):
                    raise LogCorruptError(f"{self.db}: {item}") from e
            raise self._damaged(f"reading {where}", e) from e
        dense = not self.spec(topic).compact
        out: list[Record] = []
        append = out.append
        head = _CRC_HEAD.pack
        expect = base + offset
        try:
            for rid, key, value, ts, crc in rows:
                if rid != expect and dense or crc != crc32c(
                        head(rid, ts, -1) + value if key is None else head(rid, ts, len(key)) + key + value):
                    break
                append(Record(topic, partition, rid - base, key, value, ts))
                expect = rid + 1
        except (TypeError, struct.error):
            pass  # a field of the wrong type: named below
        if len(out) < len(rows):
            row = rows[len(out)]
            off = row[0] - base
            if off != expect - base and dense:
                raise self._corrupt(topic, partition, expect - base, off - 1, "missing (offsets must be dense)")
            raise self._corrupt(topic, partition, off, off, _row_problem(row) or "unreadable")
        if dense and len(out) < max_records and expect < base + end:
            raise self._corrupt(topic, partition, expect - base, end - 1, "missing (offsets must be dense)")
        return out

    def _corrupt(self, topic: str, partition: int, first: int, last: int, reason: str) -> LogCorruptError:
        return LogCorruptError(f"{self.db}: {Damage(topic, partition, first, last, reason)}")

    def scan(self, topic: str, partition: int, start: int = 0) -> Iterator[Record | Damage]:
        """Every record of a partition from `start` that checks out and a `Damage` for each
        offset range that does not (bad checksum, missing, unreadable page): the whole-log
        check behind `verify` and `salvage`. Raises only if the partition's end is unreadable."""
        pid = self._pid(topic, partition)
        end = self._end(pid, f"scanning {topic}[{partition}]")
        base = pid << _OFFSET_BITS
        dense = not self.spec(topic).compact
        expect = start
        while expect < end:
            items: list[tuple[int, tuple[Any, ...] | None, str | None]]
            try:
                rows = self.conn.execute(_SELECT, (base + expect, base + end, _SCAN_BATCH)).fetchall()
                hi = (rows[-1][0] - base + 1) if len(rows) == _SCAN_BATCH else end
                items = [(row[0] - base, row, None) for row in rows]
            except sqlite3.DatabaseError:
                # A damaged page in this range: read it id by id to keep every readable record.
                hi = min(expect + _SCAN_BATCH, end)
                items = []
                for off in range(expect, hi):
                    try:
                        row = self.conn.execute("SELECT id, key, value, ts, crc FROM records "
                                                "WHERE id=?", (base + off,)).fetchone()
                    except sqlite3.DatabaseError as e:
                        items.append((off, None, f"unreadable: {e}"))
                        continue
                    if row is not None:
                        items.append((off, row, None))
            for off, row, problem in items:
                if off > expect and dense:
                    yield Damage(topic, partition, expect, off - 1, "missing (offsets must be dense)")
                if row is not None and problem is None:
                    problem = _row_problem(row)
                if problem or row is None:
                    yield Damage(topic, partition, off, off, problem or "unreadable")
                else:
                    yield Record(topic, partition, off, row[1], row[2], row[3])
                expect = off + 1
            if hi > expect and dense:
                yield Damage(topic, partition, expect, hi - 1, "missing (offsets must be dense)")
            expect = max(expect, hi)
        with self._sql(f"scanning {topic}[{partition}]"):
            beyond = self.conn.execute("SELECT count(*) FROM records WHERE id >= ? AND id < ?",
                                       (base + end, base + _MAX_OFFSET)).fetchone()[0]
        if beyond:
            yield Damage(topic, partition, end, end, f"{beyond} record(s) stored beyond the end "
                         "offset (the partition's end was altered on disk)")

    def first_missing(self, topic: str, partition: int, end: int) -> Damage | None:
        """The first offset below `end` with no record in a dense partition, or None: a
        count of the primary key's range (no record is read), halved towards the gap, so
        a reader can afford it over everything a snapshot stands for."""
        if self.spec(topic).compact:
            return None
        base = self._pid(topic, partition) << _OFFSET_BITS
        where = f"counting {topic}[{partition}]"

        def count(lo: int, hi: int) -> int:
            with self._sql(where):
                return int(self.conn.execute("SELECT count(*) FROM records WHERE id >= ? AND "
                                             "id < ?", (base + lo, base + hi)).fetchone()[0])

        lo, hi = 0, end
        if count(lo, hi) == hi - lo:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if count(lo, mid) < mid - lo:
                hi = mid
            else:
                lo = mid
        return Damage(topic, partition, lo, lo, "missing (offsets must be dense)")

    def offset_for_time(self, topic: str, partition: int, ts: float) -> int:
        pid = self._pid(topic, partition)
        where = f"{topic}[{partition}]: time {ts}"
        end = self._end(pid, where)
        base = pid << _OFFSET_BITS
        with self._sql(where):
            row = self.conn.execute("SELECT min(id) FROM records WHERE id >= ? AND id < ? AND ts >= ?",
                                    (base, base + end, ts)).fetchone()
        return end if row[0] is None else int(row[0]) - base

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: self._end(self._pid(topic, p), f"{topic}[{p}] end offset")
                for p in range(self.partitions(topic))}

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First stored offset per partition (above 0 only after compaction removed a prefix)."""
        out = {}
        for p in range(self.partitions(topic)):
            first = self.read(topic, p, 0, 1)
            out[p] = first[0].offset if first else self.end_offsets(topic)[p]
        return out

    # -- consumer groups and state ----------------------------------------------------------

    def commit(self, group: str, topic: str, positions: Mapping[int, int]) -> None:
        if not group:
            raise LogError("consumer group name must not be empty")
        n = self.partitions(topic)
        rows = []
        for p, off in positions.items():
            if not 0 <= p < n or off < 0:
                raise LogError(f"cannot commit {topic}[{p}]@{off} for group {group!r}")
            rows.append((group, self._pid(topic, int(p)), int(off)))
        with self.transaction(), self._sql(f"committing group {group!r} on {topic}"):
            self.conn.executemany("INSERT OR REPLACE INTO groups VALUES (?,?,?)", rows)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        if not group:
            raise LogError("consumer group name must not be empty")
        self.partitions(topic)
        with self._sql(f"reading group {group!r} on {topic}"):
            rows = self.conn.execute(
                "SELECT p.partition, g.next_offset FROM groups g JOIN partitions p ON g.partition = p.id "
                "JOIN topics t ON p.topic = t.id WHERE g.grp = ? AND t.name = ?", (group, topic)).fetchall()
        return {int(p): int(o) for p, o in rows}

    def groups(self) -> list[tuple[str, str, dict[int, int]]]:
        """Every consumer group's committed positions: (group, topic, {partition: offset})."""
        out: dict[tuple[str, str], dict[int, int]] = {}
        with self._sql("reading consumer groups"):
            for grp, topic, p, off in self.conn.execute(
                    "SELECT g.grp, t.name, p.partition, g.next_offset FROM groups g JOIN partitions p "
                    "ON g.partition = p.id JOIN topics t ON p.topic = t.id ORDER BY 1, 2, 3"):
                out.setdefault((grp, topic), {})[int(p)] = int(off)
        return [(g, t, pos) for (g, t), pos in out.items()]

    def put_state(self, name: str, value: bytes) -> None:
        """Store a named blob (a sink checkpoint, a ledger snapshot); see `transaction()`."""
        with self.transaction(), self._sql(f"storing state {name!r}"):
            # an older file's state table is converted by its first writer of state (only:
            # opening, reading, `verify` and `salvage` never rewrite a log)
            if self._old_state and self._state_without_rowid():
                for statement in _STATE_ROWID.split(";"):
                    self.conn.execute(statement)
            self._old_state = False
            self.conn.execute("INSERT OR REPLACE INTO state VALUES (?,?,?)",
                              (name, value, crc32c(value, crc32c(name.encode()))))

    def state(self, name: str) -> bytes | None:
        """The blob stored under `name` (None if none), checksum verified."""
        with self._sql(f"reading state {name!r}"):
            row = self.conn.execute("SELECT value, crc FROM state WHERE name=?", (name,)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], bytes) or crc32c(row[0], crc32c(name.encode())) != row[1]:
            raise LogCorruptError(f"{self.db}: state {name!r}: checksum mismatch")
        return bytes(row[0])

    def drop_state(self, name: str) -> None:
        """Remove the blob stored under `name` (nothing if none); see `transaction()`."""
        with self.transaction(), self._sql(f"dropping state {name!r}"):
            self.conn.execute("DELETE FROM state WHERE name=?", (name,))

    def state_names(self) -> list[str]:
        with self._sql("listing state"):
            return [r[0] for r in self.conn.execute("SELECT name FROM state ORDER BY name")]

    # -- maintenance ----------------------------------------------------------------------

    def compact(self, topic: str) -> int:
        """Keep only the latest record per key of a compact topic (offsets are kept; reads skip
        the holes). Returns the number of records removed."""
        if not self.spec(topic).compact:
            raise LogError(f"topic {topic!r} is not a compact topic")
        removed = 0
        with self.transaction():
            for p in range(self.partitions(topic)):
                pid = self._pid(topic, p)
                self._check_before_write(topic, p, pid)
                lo, hi = pid << _OFFSET_BITS, (pid + 1) << _OFFSET_BITS
                with self._sql(f"compacting {topic}[{p}]"):
                    removed += self.conn.execute(
                        "DELETE FROM records WHERE id >= ?1 AND id < ?2 AND key IS NOT NULL AND id NOT IN "
                        "(SELECT max(id) FROM records WHERE id >= ?1 AND id < ?2 AND key IS NOT NULL "
                        "GROUP BY key)", (lo, hi)).rowcount
        return removed

    def check_file(self) -> list[str]:
        """SQLite's own structural check of the whole file (b-trees, free pages): the problems
        it finds (empty: the file is sound)."""
        try:
            rows = [r[0] for r in self.conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as e:
            return [str(e)]
        return [] if rows == ["ok"] else rows

    def close(self) -> None:
        """Close the database (the last process to close folds the WAL into the file)."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if self._copy is not None:
            self._copy.cleanup()
            self._copy = None
        if self._marker is not None:
            os.close(self._marker)
            self._marker = None
        self._specs.clear()
        self._pids.clear()
