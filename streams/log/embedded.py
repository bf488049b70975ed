"""The embedded log: a durable, serverless, one-machine implementation of the log port.

It lets a single-machine pool (and every test) run the same processors as the Kafka
deployment without a broker. Layout under `root`:

    topics/<topic>/topic.json            {"partitions": n, "compact": bool}
    topics/<topic>/<p>/<base:020d>.log   segment: CRC-framed record batches
    topics/<topic>/<p>/<base:020d>.index sparse (offset, position, max-ts-before) entries:
                                         the offset index and the time index in one file
    topics/<topic>/<p>/writer.lock       flock taken per append; holds the last writer's token
    groups/<quoted group>/<topic>.json   committed offsets, replaced atomically

A segment is a sequence of frames, one per appended chunk (Kafka's record batch):

    frame  = size u32 | crc u32 | base_offset i64 | count u32 | last_delta u32
             | max_ts f64 | flags u32 | records            (crc covers everything after it)
    record = ts f64 | value_len u32 | key_len i32 (-1: no key) | key | value
             (flag SPARSE: each record starts with its offset delta u32 — compacted frames)

Offsets are implicit and dense (base_offset + index in frame). A frame is written with one
`writev`, so an append that returned is in the page cache and survives a kill -9 of the
process (`fsync=True` also survives power loss). A torn tail (a partly written frame, or one
whose CRC fails) is invisible to readers and truncated by the next append.
The indexes are derived data: missing or stale entries are rebuilt on open.

Concurrency: appends take the partition's `flock` for their duration, so several processes
may append (a pipeline and an importer, two readers dead-lettering); the common case of one
writer costs a few syscalls per append, because a writer whose token is still in the lock
file knows nobody else wrote and skips re-reading the files. Readers in other processes only
take whole frames whose CRC checks out from the active segment's tail, so they never see a
record that is still being written or was torn.

Partitioning: keyed records go to `zlib.crc32(key) % partitions` (stable across processes
and Python versions, unlike `hash()`); unkeyed records go to partition 0, so pool-wide
events keep one total order.

Compaction: `compact(topic)` is explicit (nothing runs in the background); it keeps the latest
record per key in sealed segments with their original offsets (tombstones, i.e. empty values,
are kept as the latest value of their key); readers that kept a view of a rewritten segment
reload it. There is no time/size retention yet.
"""
from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import struct
import tempfile
import time
import zlib
from array import array
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence, TypeVar
from urllib.parse import quote

from streams.log.port import (
    Appended,
    LogError,
    Outgoing,
    Record,
    TopicNotFoundError,
    TopicSpec,
)

__all__ = ["EmbeddedLog", "partition_for_key", "DEFAULT_SEGMENT_BYTES"]

T = TypeVar("T")

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
INDEX_INTERVAL = 4096  # bytes of log between sparse index entries
FRAME_BYTES = 1024 * 1024  # an appended chunk is cut into frames of about this size
READ_CHUNK = 1024 * 1024  # reads fetch at least this many bytes per syscall

_FRAME = struct.Struct("<IIqIIdI")  # size, crc, base_offset, count, last_delta, max_ts, flags
_FRAME_TAIL = struct.Struct("<qIIdI")  # the header after size+crc (covered by the crc)
_HDR = _FRAME.size
_REC = struct.Struct("<dIi")  # ts, value_len, key_len
_REC_SPARSE = struct.Struct("<IdIi")  # offset delta, ts, value_len, key_len
_IDX = struct.Struct("<qqd")  # offset, position, max timestamp of the records before
_FLAG_SPARSE = 1
_NEG_INF = -math.inf
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def partition_for_key(key: bytes | None, partitions: int) -> int:
    """The partition of a record: crc32(key) % partitions; unkeyed records go to 0."""
    return 0 if key is None else zlib.crc32(key) % partitions


def _check_topic_name(topic: str) -> None:
    if not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise LogError(f"invalid topic name {topic!r}: use 1-249 of [A-Za-z0-9._-]")


def _write_all(fd: int, bufs: list[bytes]) -> int:
    """writev all buffers, finishing a short write (a signal, a nearly full disk) by looping;
    returns the bytes written."""
    total = sum(map(len, bufs))
    done = os.writev(fd, bufs) if len(bufs) <= 512 else 0
    if done < total:
        rest = memoryview(b"".join(bufs))[done:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return total


@contextlib.contextmanager
def atomic_file(path: Path, fsync: bool = False, buffering: int = -1) -> Iterator[BinaryIO]:
    """A file written aside and renamed over `path` on success, so readers see the old or
    the new content, never a mix; on failure the partial file is removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    """Write a small file atomically (see `atomic_file`)."""
    with atomic_file(path, fsync) as f:
        f.write(data)


class _StaleViewError(LogError):
    """A segment file was replaced (compaction) since this process loaded its view."""


class _Segment:
    """In-memory view of one segment file: its valid size, next offset and sparse index."""

    __slots__ = ("base", "path", "_fd", "ino", "size", "next_offset", "max_ts",
                 "idx_off", "idx_pos", "idx_ts", "idx_written")

    def __init__(self, base: int, path: Path) -> None:
        self.base = base
        self.path = path
        self._fd = -1  # opened on use; sealed segments are closed again after reads
        self.ino = 0  # the file this view describes (compaction replaces files)
        self.size = 0  # end of the last whole, valid frame
        self.next_offset = base
        self.max_ts = _NEG_INF
        self.idx_off = array("q")
        self.idx_pos = array("q")
        self.idx_ts = array("d")
        self.idx_written = 0  # entries known to be in the .index file

    @property
    def fd(self) -> int:
        if self._fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise _StaleViewError(f"{self.path} was removed") from None
            ino = os.fstat(fd).st_ino
            if self.ino and ino != self.ino:
                os.close(fd)
                raise _StaleViewError(f"{self.path} was rewritten")
            self._fd, self.ino = fd, ino
        return self._fd

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".index")

    def add_entry(self, offset: int, pos: int) -> bool:
        """Index the frame at `pos` if it is far enough from the last entry."""
        if self.idx_pos and pos - self.idx_pos[-1] < INDEX_INTERVAL:
            return False
        self.idx_off.append(offset)
        self.idx_pos.append(pos)
        self.idx_ts.append(self.max_ts)
        return True

    def frames(self, pos: int, with_body: bool) -> Iterator[tuple[int, int, int, int, int, float, int, bytes, int]]:
        """Whole frames from `pos` to the valid size: (pos, size, crc, base, last_delta,
        max_ts, flags, buffer, offset of the frame in the buffer)."""
        end = self.size
        buf = b""
        buf_start = pos
        while pos + _HDR <= end:
            rel = pos - buf_start
            if rel + _HDR > len(buf):
                buf = os.pread(self.fd, min(max(READ_CHUNK, _HDR), end - pos), pos)
                buf_start, rel = pos, 0
            size, crc, base, _count, last_delta, max_ts, flags = _FRAME.unpack_from(buf, rel)
            if size < _HDR or pos + size > end:
                raise LogError(f"{self.path}: corrupt frame header at byte {pos}")
            if with_body and rel + size > len(buf):
                buf = os.pread(self.fd, max(READ_CHUNK, size), pos)
                buf_start, rel = pos, 0
            yield pos, size, crc, base, last_delta, max_ts, flags, buf, rel
            pos += size

    def scan(self, verify: bool) -> bool:
        """Extend the view over whole frames written after `size`; returns True if it grew.

        Stops at the first incomplete frame, bad header or (with `verify`) bad CRC: that is
        the torn tail a writer truncates.
        """
        fd = self.fd
        file_size = os.fstat(fd).st_size
        pos = self.size
        grew = False
        chunk = READ_CHUNK if verify else 64 * 1024  # header hops need little
        buf = b""
        buf_start = pos
        while pos + _HDR <= file_size:
            rel = pos - buf_start
            if rel + _HDR > len(buf):
                buf = os.pread(fd, chunk, pos)
                buf_start, rel = pos, 0
                if len(buf) < _HDR:
                    break
            size, crc, base, count, last_delta, max_ts, flags = _FRAME.unpack_from(buf, rel)
            if (size < _HDR or pos + size > file_size or base < self.next_offset
                    or count == 0 or last_delta < count - 1 or flags & ~_FLAG_SPARSE):
                break
            if verify:
                if rel + size > len(buf):
                    buf = os.pread(fd, max(READ_CHUNK, size), pos)
                    buf_start, rel = pos, 0
                    if len(buf) < size:
                        break
                if zlib.crc32(memoryview(buf)[rel + 8:rel + size]) != crc:
                    break
            self.add_entry(base, pos)
            self.max_ts = max(self.max_ts, max_ts)
            self.next_offset = base + last_delta + 1
            pos += size
            self.size = pos
            grew = True
        return grew

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1


def _load_segment(path: Path, base: int, verify: bool) -> _Segment:
    """Open a segment, trust the index entries that check out and scan the rest."""
    seg = _Segment(base, path)
    file_size = os.fstat(seg.fd).st_size
    try:
        raw = seg.index_path.read_bytes()
    except FileNotFoundError:
        raw = b""
    last_pos = -1
    last_off = base - 1
    kept = 0
    for off, pos, ts in _IDX.iter_unpack(raw[:len(raw) - len(raw) % _IDX.size]):
        if pos <= last_pos or off <= last_off or pos + _HDR > file_size or off < base:
            break
        seg.idx_off.append(off)
        seg.idx_pos.append(pos)
        seg.idx_ts.append(ts)
        last_pos, last_off = pos, off
        kept += 1
    if kept:
        head = os.pread(seg.fd, _HDR, seg.idx_pos[-1])
        if len(head) < _HDR or _FRAME.unpack_from(head)[2] != seg.idx_off[-1]:
            del seg.idx_off[:], seg.idx_pos[:], seg.idx_ts[:]
            kept = 0
    if kept:
        # Resume from the last indexed frame: its entry holds the max before it.
        seg.size = seg.idx_pos[-1]
        seg.next_offset = seg.idx_off[-1]
        seg.max_ts = seg.idx_ts[-1]
        del seg.idx_off[-1], seg.idx_pos[-1], seg.idx_ts[-1]
    seg.scan(verify)
    seg.idx_written = kept if len(raw) == kept * _IDX.size else -1
    if not verify and seg.size != file_size:
        # Only the active segment may end in a torn frame; here it is damage, said loudly.
        seg.close()
        raise LogError(f"{path}: damaged at byte {seg.size} of {file_size} (a sealed segment "
                       "must end with a whole frame)")
    return seg


class _Partition:
    """All segments of one partition. `owned`: this view was recovered under the write lock
    and this instance's token is in the lock file, i.e. nobody else has appended since."""

    __slots__ = ("dir", "segments", "bases", "owned", "lock_fd", "wfd", "ifd", "cursor")

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.segments: list[_Segment] = []
        self.bases: list[int] = []
        self.owned = False
        self.lock_fd = -1
        self.wfd = -1
        self.ifd = -1
        self.cursor = (-1, 0, 0)  # (next offset, segment number, frame position) of the last read

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    def segment_files(self) -> list[int]:
        return sorted(int(p.name[:-4]) for p in self.dir.iterdir()
                      if p.name.endswith(".log") and p.name[:-4].isdigit())

    def load(self) -> None:
        """Open every segment; the active one's tail is CRC-checked so that a torn frame is
        never handed out (sealed segments are checked as they are read)."""
        bases = self.segment_files() or [0]
        for i, base in enumerate(bases):
            path = self.dir / f"{base:020d}.log"
            if not path.exists():  # an empty partition that never had a segment
                path.touch()
            seg = _load_segment(path, base, i == len(bases) - 1)
            self.segments.append(seg)
            self.bases.append(base)
        self.release()

    def release(self, keep: int = -1) -> None:
        """Close sealed segments' files (but segment `keep`) so that fds stay few."""
        for i in range(len(self.segments) - 1):
            if i != keep:
                self.segments[i].close()

    def refresh(self) -> None:
        """Reader side: pick up frames and segments the writer added since the last look."""
        if self.segments[-1].scan(True):
            return
        newer = [b for b in self.segment_files() if b > self.bases[-1]]
        for i, base in enumerate(newer):
            self.segments[-1].scan(True)  # finish the segment the writer sealed
            self.segments.append(_load_segment(self.dir / f"{base:020d}.log", base,
                                               i == len(newer) - 1))
            self.bases.append(base)

    def close_files(self) -> None:
        """Forget the view (it is reloaded from disk on next use); keep the lock file."""
        for seg in self.segments:
            seg.close()
        for fd in (self.wfd, self.ifd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.segments, self.bases = [], []
        self.wfd = self.ifd = -1
        self.owned = False
        self.cursor = (-1, 0, 0)

    def close(self) -> None:
        self.close_files()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


class EmbeddedLog:
    """A durable local log with the `Log` port's semantics; see the module docstring."""

    def __init__(self, root: Path | str, *, fsync: bool = False,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, lock_timeout: float = 30.0) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.lock_timeout = lock_timeout
        self._token = os.urandom(8)  # marks this instance as a partition's last writer
        self._topics_dir = self.root / "topics"
        self._groups_dir = self.root / "groups"
        self._topics_dir.mkdir(parents=True, exist_ok=True)
        self._groups_dir.mkdir(parents=True, exist_ok=True)
        self._specs: dict[str, TopicSpec] = {}
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"EmbeddedLog({str(self.root)!r})"

    def __enter__(self) -> EmbeddedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topics -------------------------------------------------------------------------

    def create_topic(self, spec: TopicSpec) -> None:
        """Create the topic (atomically: a complete directory is renamed into place)."""
        _check_topic_name(spec.name)
        if spec.partitions < 1:
            raise LogError(f"topic {spec.name!r}: partitions must be >= 1, not {spec.partitions}")
        final = self._topics_dir / spec.name
        if (final / "topic.json").exists():
            return
        tmp = Path(tempfile.mkdtemp(dir=self._topics_dir, prefix=".new-"))
        try:
            for p in range(spec.partitions):
                (tmp / str(p)).mkdir()
                (tmp / str(p) / f"{0:020d}.log").touch()
            meta = {"name": spec.name, "partitions": spec.partitions, "compact": spec.compact}
            (tmp / "topic.json").write_text(json.dumps(meta))
            try:
                os.rename(tmp, final)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise LogError(f"cannot create topic {spec.name!r}: {e}") from e
                # Another process created it first: fine, creation is idempotent.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if self.fsync:
            self._fsync_dir(self._topics_dir)

    def topics(self) -> list[str]:
        return sorted(p.name for p in self._topics_dir.iterdir()
                      if not p.name.startswith(".") and (p / "topic.json").exists())

    def spec(self, topic: str) -> TopicSpec:
        """The topic's stored spec (partitions, compact flag)."""
        spec = self._specs.get(topic)
        if spec is None:
            _check_topic_name(topic)
            try:
                meta = json.loads((self._topics_dir / topic / "topic.json").read_text())
            except FileNotFoundError:
                raise TopicNotFoundError(f"topic {topic!r} does not exist in {self.root}") from None
            except (OSError, ValueError) as e:
                raise LogError(f"topic {topic!r}: unreadable topic.json: {e}") from e
            spec = TopicSpec(topic, int(meta["partitions"]), bool(meta.get("compact", False)))
            self._specs[topic] = spec
        return spec

    def partitions(self, topic: str) -> int:
        return self.spec(topic).partitions

    # -- partitions ---------------------------------------------------------------------

    def _part(self, topic: str, partition: int) -> _Partition:
        part = self._parts.get((topic, partition))
        if part is None:
            if self._closed:
                raise LogError(f"{self!r} is closed")
            n = self.partitions(topic)
            if not 0 <= partition < n:
                raise LogError(f"topic {topic!r} has no partition {partition} (it has {n})")
            part = _Partition(self._topics_dir / topic / str(partition))
            self._parts[(topic, partition)] = part
        if not part.segments:  # new, or closed to resync after a failed append
            part.load()
        return part

    @contextlib.contextmanager
    def _locked(self, topic: str, partition: int) -> Iterator[_Partition]:
        """Hold the partition's write lock; recover the view if another writer came between."""
        part = self._part(topic, partition)
        if part.lock_fd < 0:
            part.lock_fd = os.open(part.dir / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        delay = 0.0005
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(part.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LogError(f"{topic}[{partition}] in {self.root}: another process has held "
                                   f"the write lock for over {self.lock_timeout:g}s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        try:
            if not part.owned or os.pread(part.lock_fd, 8, 0) != self._token:
                self._recover(part)
                # Claim the partition before writing, so a crash below still tells the
                # next writer that the files may hold more than its view.
                os.pwrite(part.lock_fd, self._token, 0)
            yield part
        except BaseException:
            part.close_files()  # resync from disk: the view may be ahead of the files
            raise
        finally:
            fcntl.flock(part.lock_fd, fcntl.LOCK_UN)

    def _recover(self, part: _Partition) -> None:
        """Reload under the lock: truncate a torn tail, repair indexes, open for append."""
        part.close_files()
        part.load()
        for seg in part.segments:
            if seg.idx_written != len(seg.idx_off):
                self._rewrite_index(seg)
        active = part.segments[-1]
        part.wfd = os.open(active.path, os.O_RDWR | os.O_APPEND)
        if os.fstat(part.wfd).st_size > active.size:
            os.ftruncate(part.wfd, active.size)  # the torn tail of a killed writer
        part.ifd = os.open(active.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        part.owned = True

    def _fresh(self, part: _Partition) -> None:
        """Bring a view up to date unless this instance was the last to append."""
        if not (part.owned and os.pread(part.lock_fd, 8, 0) == self._token):
            part.refresh()

    def _rewrite_index(self, seg: _Segment) -> None:
        data = b"".join(_IDX.pack(o, p, t) for o, p, t in zip(seg.idx_off, seg.idx_pos, seg.idx_ts))
        _atomic_write(seg.index_path, data, self.fsync)
        seg.idx_written = len(seg.idx_off)

    def _roll(self, part: _Partition) -> _Segment:
        """Seal the active segment and start a new one at the next offset."""
        base = part.next_offset
        path = part.dir / f"{base:020d}.log"
        os.close(part.wfd)
        os.close(part.ifd)
        part.wfd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        seg = _Segment(base, path)
        part.ifd = os.open(seg.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        part.segments.append(seg)
        part.bases.append(base)
        if self.fsync:
            self._fsync_dir(part.dir)
        return seg

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- append -------------------------------------------------------------------------

    def append(self, topic: str, records: Sequence[Outgoing]) -> list[Appended]:
        """Append; every record is written to the OS (fsync'd with `fsync=True`) on return."""
        n = self.partitions(topic)
        if not records:
            return []
        if n == 1:
            first = self._append_partition(topic, 0, records)
            return [Appended(0, o) for o in range(first, first + len(records))]
        crc = zlib.crc32
        targets = [0 if r[0] is None else crc(r[0]) % n for r in records]
        by_part: dict[int, list[Outgoing]] = {}
        for p, r in zip(targets, records):
            lst = by_part.get(p)
            if lst is None:
                by_part[p] = [r]
            else:
                lst.append(r)
        next_off = {p: self._append_partition(topic, p, recs) for p, recs in by_part.items()}
        out = []
        for p in targets:
            o = next_off[p]
            next_off[p] = o + 1
            out.append(Appended(p, o))
        return out

    def _append_partition(self, topic: str, partition: int, records: Sequence[Outgoing]) -> int:
        """Frame, write and index `records`; returns the offset of the first one."""
        with self._locked(topic, partition) as part:
            return self._append_frames(part, topic, records)

    def _append_frames(self, part: _Partition, topic: str, records: Sequence[Outgoing]) -> int:
        first = part.next_offset
        seg = part.segments[-1]
        pack = _REC.pack
        bufs: list[bytes] = []
        idx: list[bytes] = []
        chunk: list[bytes] = []
        add = chunk.append
        size = 0
        count = 0
        max_ts = _NEG_INF
        base = first
        pending = 0  # bytes in `bufs` not yet written
        for key, value, ts in records:
            if ts > max_ts:
                max_ts = ts
            elif ts != ts:
                raise LogError(f"{topic}: a record's timestamp is NaN")
            if key is None:
                add(pack(ts, len(value), -1))
                add(value)
                size += 16 + len(value)
            else:
                add(pack(ts, len(value), len(key)))
                add(key)
                add(value)
                size += 16 + len(key) + len(value)
            count += 1
            if size >= FRAME_BYTES:
                seg, pending = self._frame(part, seg, bufs, idx, chunk, base, count, max_ts, size, pending)
                base += count
                chunk.clear()
                size = count = 0
                max_ts = _NEG_INF
        if count:
            seg, pending = self._frame(part, seg, bufs, idx, chunk, base, count, max_ts, size, pending)
        self._flush(part, seg, bufs, idx)
        return first

    def _frame(self, part: _Partition, seg: _Segment, bufs: list[bytes], idx: list[bytes],
               chunk: list[bytes], base: int, count: int, max_ts: float, size: int,
               pending: int) -> tuple[_Segment, int]:
        """Turn one chunk into a frame queued in `bufs`, rolling the segment when full."""
        body = b"".join(chunk)
        tail = _FRAME_TAIL.pack(base, count, count - 1, max_ts, 0)
        frame_size = _HDR + size
        if seg.size + pending > 0 and seg.size + pending + frame_size > self.segment_bytes:
            self._flush(part, seg, bufs, idx)
            pending = 0
            seg = self._roll(part)
        pos = seg.size + pending
        if not seg.idx_pos or pos - seg.idx_pos[-1] >= INDEX_INTERVAL:
            idx.append(_IDX.pack(base, pos, seg.max_ts))
            seg.idx_off.append(base)
            seg.idx_pos.append(pos)
            seg.idx_ts.append(seg.max_ts)
        crc = zlib.crc32(body, zlib.crc32(tail))
        bufs.append(struct.pack("<II", frame_size, crc) + tail)
        bufs.append(body)
        seg.max_ts = max(seg.max_ts, max_ts)
        seg.next_offset = base + count
        return seg, pending + frame_size

    def _flush(self, part: _Partition, seg: _Segment, bufs: list[bytes], idx: list[bytes]) -> None:
        """One writev of the queued frames, then their index entries (index after data)."""
        if not bufs:
            return
        try:
            seg.size += _write_all(part.wfd, bufs)
            if self.fsync:
                os.fdatasync(part.wfd)
        except OSError as e:
            # The view is dropped by _locked; the next append truncates what reached disk.
            raise LogError(f"append to {part.dir} failed: {e}") from e
        if idx:
            _write_all(part.ifd, idx)
            seg.idx_written += len(idx)
        bufs.clear()
        idx.clear()

    # -- read ---------------------------------------------------------------------------

    def _viewing(self, topic: str, partition: int, fn: Callable[[_Partition], T]) -> T:
        """Run fn on the partition's view, reloading it once if compaction replaced files."""
        for attempt in range(2):
            part = self._part(topic, partition)
            try:
                return fn(part)
            except _StaleViewError:
                part.close_files()
                if attempt:
                    raise
            finally:
                part.release(part.cursor[1])
        raise AssertionError("unreachable")

    def read(self, topic: str, partition: int, offset: int, max_records: int = 10_000) -> list[Record]:
        if offset < 0:
            raise LogError(f"{topic}[{partition}]: negative offset {offset}")

        def run(part: _Partition) -> list[Record]:
            if offset >= part.next_offset:
                self._fresh(part)
            if offset >= part.next_offset or max_records <= 0:
                return []
            return self._read(part, topic, partition, offset, max_records)

        return self._viewing(topic, partition, run)

    def _read(self, part: _Partition, topic: str, partition: int, offset: int,
              max_records: int) -> list[Record]:
        out: list[Record] = []
        c_off, c_seg, c_pos = part.cursor
        if c_off == offset:
            si, pos = c_seg, c_pos
        else:
            si = max(bisect.bisect_right(part.bases, offset) - 1, 0)
            pos = -1
        while si < len(part.segments) and len(out) < max_records:
            seg = part.segments[si]
            if offset < seg.next_offset:
                if pos < 0:
                    i = bisect.bisect_right(seg.idx_off, offset) - 1
                    pos = seg.idx_pos[i] if i >= 0 else 0
                pos, offset = self._read_segment(topic, partition, seg, pos, offset,
                                                 max_records, out)
                if len(out) >= max_records:
                    part.cursor = (offset, si, pos)
                    return out
            si += 1
            pos = -1
        part.cursor = (offset, len(part.segments) - 1, part.segments[-1].size) if out else part.cursor
        return out

    def _read_segment(self, topic: str, partition: int, seg: _Segment, pos: int, offset: int,
                      max_records: int, out: list[Record]) -> tuple[int, int]:
        """Append records >= offset from the frames at `pos` on; returns (frame position,
        next offset) to resume from."""
        unpack = _REC.unpack_from
        for fpos, size, crc, base, last_delta, _max_ts, flags, buf, rel in seg.frames(pos, True):
            if base + last_delta < offset:
                continue
            if zlib.crc32(memoryview(buf)[rel + 8:rel + size]) != crc:
                raise LogError(f"{seg.path}: corrupt frame at byte {fpos} (CRC mismatch)")
            p = rel + _HDR
            end = rel + size
            if flags & _FLAG_SPARSE:
                unpack_s = _REC_SPARSE.unpack_from
                while p < end:
                    delta, ts, vlen, klen = unpack_s(buf, p)
                    p += 20
                    if klen >= 0:
                        key: bytes | None = buf[p:p + klen]
                        p += klen
                    else:
                        key = None
                    off = base + delta
                    if off >= offset:
                        out.append(Record(topic, partition, off, key, buf[p:p + vlen], ts))
                        offset = off + 1
                        if len(out) >= max_records:
                            return (fpos if p + vlen < end else fpos + size), offset
                    p += vlen
                offset = base + last_delta + 1
                continue
            off = base
            if offset > base:  # skip into the frame without building records
                while off < offset:
                    _ts, vlen, klen = unpack(buf, p)
                    p += 16 + vlen + (klen if klen > 0 else 0)
                    off += 1
            room = max_records - len(out)
            append = out.append
            while p < end:
                ts, vlen, klen = unpack(buf, p)
                p += 16
                if klen >= 0:
                    key = buf[p:p + klen]
                    p += klen
                else:
                    key = None
                append(Record(topic, partition, off, key, buf[p:p + vlen], ts))
                p += vlen
                off += 1
                room -= 1
                if not room:
                    return (fpos if p < end else fpos + size), off
            offset = off
        return seg.size, offset

    def offset_for_time(self, topic: str, partition: int, ts: float) -> int:
        def run(part: _Partition) -> int:
            self._fresh(part)
            return self._offset_for_time(part, ts)

        return self._viewing(topic, partition, run)

    @staticmethod
    def _offset_for_time(part: _Partition, ts: float) -> int:
        for seg in part.segments:
            if seg.max_ts < ts:
                continue
            # The last index entry whose records-before are all < ts: scan from there.
            i = bisect.bisect_left(seg.idx_ts, ts) - 1
            pos = seg.idx_pos[i] if i >= 0 else 0
            for fpos, size, crc, base, last_delta, max_ts, flags, buf, rel in seg.frames(pos, True):
                if max_ts < ts:
                    continue
                sparse = flags & _FLAG_SPARSE
                p, end, k = rel + _HDR, rel + size, 0
                while p < end:
                    if sparse:
                        delta, rts, vlen, klen = _REC_SPARSE.unpack_from(buf, p)
                        p += 20
                    else:
                        delta = k
                        rts, vlen, klen = _REC.unpack_from(buf, p)
                        p += 16
                    if rts >= ts:
                        return base + delta
                    p += vlen + (klen if klen > 0 else 0)
                    k += 1
        return part.next_offset

    def end_offsets(self, topic: str) -> dict[int, int]:
        out = {}
        for p in range(self.partitions(topic)):
            def run(part: _Partition) -> int:
                self._fresh(part)
                return part.next_offset

            out[p] = self._viewing(topic, p, run)
        return out

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First stored offset per partition (above 0 only after compaction removed a prefix)."""
        out = {}
        for p in range(self.partitions(topic)):
            first = self.read(topic, p, 0, 1)
            out[p] = first[0].offset if first else self._part(topic, p).next_offset
        return out

    # -- consumer groups ------------------------------------------------------------------

    def _group_file(self, group: str, topic: str) -> Path:
        if not group:
            raise LogError("consumer group name must not be empty")
        _check_topic_name(topic)
        return self._groups_dir / quote(group, safe="").replace(".", "%2E") / f"{topic}.json"

    def commit(self, group: str, topic: str, positions: Mapping[int, int]) -> None:
        n = self.partitions(topic)
        path = self._group_file(group, topic)
        current = self.committed(group, topic)
        for p, off in positions.items():
            if not 0 <= p < n or off < 0:
                raise LogError(f"cannot commit {topic}[{p}]@{off} for group {group!r}")
            current[int(p)] = int(off)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({str(p): o for p, o in sorted(current.items())}).encode()
        _atomic_write(path, data, self.fsync)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        try:
            raw = self._group_file(group, topic).read_text()
        except FileNotFoundError:
            return {}
        try:
            return {int(p): int(o) for p, o in json.loads(raw).items()}
        except (ValueError, AttributeError) as e:
            raise LogError(f"group {group!r} offsets for {topic!r} are unreadable: {e}") from e

    # -- compaction -----------------------------------------------------------------------

    def compact(self, topic: str) -> int:
        """Keep only the latest record per key in the sealed segments of a compact topic.

        Offsets are kept (reads skip the holes); the active segment is left alone. Returns
        the number of records removed. Needs the write lock of every partition.
        """
        if not self.spec(topic).compact:
            raise LogError(f"topic {topic!r} is not a compact topic")
        removed = 0
        for p in range(self.partitions(topic)):
            with self._locked(topic, p) as part:
                latest: dict[bytes, int] = {}
                for seg in part.segments:
                    for r in self._segment_records(topic, p, seg):
                        if r.key is not None:
                            latest[r.key] = r.offset
                for seg in part.segments[:-1]:
                    records = self._segment_records(topic, p, seg)
                    kept = [r for r in records if r.key is None or latest[r.key] == r.offset]
                    if len(kept) < len(records):
                        removed += len(records) - len(kept)
                        self._rewrite_segment(seg, kept)
                part.close_files()  # reloaded on next use, with the rewritten files
        return removed

    def _segment_records(self, topic: str, partition: int, seg: _Segment) -> list[Record]:
        out: list[Record] = []
        self._read_segment(topic, partition, seg, 0, 0, 1 << 62, out)
        return out

    def _rewrite_segment(self, seg: _Segment, kept: list[Record]) -> None:
        """Replace a sealed segment by sparse frames of the kept records (index rebuilt)."""
        seg.index_path.unlink(missing_ok=True)  # a crash below leaves it to be rebuilt
        if not kept:
            seg.path.unlink()
            return
        parts: list[bytes] = []
        i = 0
        while i < len(kept):
            chunk = kept[i:i + 4096]
            i += len(chunk)
            base = chunk[0].offset
            body = b"".join(
                _REC_SPARSE.pack(r.offset - base, r.timestamp, len(r.value),
                                 -1 if r.key is None else len(r.key)) + (r.key or b"") + r.value
                for r in chunk)
            tail = _FRAME_TAIL.pack(base, len(chunk), chunk[-1].offset - base,
                                    max(r.timestamp for r in chunk), _FLAG_SPARSE)
            parts.append(struct.pack("<II", _HDR + len(body), zlib.crc32(body, zlib.crc32(tail))) + tail)
            parts.append(body)
        _atomic_write(seg.path, b"".join(parts), self.fsync)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close files and release the write locks (another process may then write)."""
        for part in self._parts.values():
            part.close()
        self._parts.clear()
        self._specs.clear()
        self._closed = True
