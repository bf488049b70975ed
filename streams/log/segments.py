"""Read-only access to the segment logs of earlier PoolLedger versions (`poolledger log migrate`).

Until the embedded log moved to SQLite (`streams.log.embedded`), it stored each partition as
segment files of CRC-framed record batches:

    topics/<topic>/topic.json            {"partitions": n, "compact": bool}
    topics/<topic>/<p>/<base:020d>.log   segments; <base> is the offset of their first record
    groups/<quoted group>/<topic>.json   committed offsets {"<partition>": next offset}

    frame  = size u32 | crc u32 | base_offset i64 | count u32 | last_delta u32
             | max_ts f64 | flags u32 | records            (zlib crc32 of everything after it)
    record = ts f64 | value_len u32 | key_len i32 (-1: no key) | key | value
             (flag SPARSE: each record starts with its offset delta u32 — compacted frames)

The `.index` files were derived data and are not needed to read. This reader exists so that a
migration names every record it cannot carry over: a frame whose CRC fails, a header that does
not parse, a segment that is missing (its offsets lie between two files) — each is reported
with its file, byte and offsets instead of being skipped. Only a frame cut short at the very
end of a partition's last segment is an incomplete last write (the writer died in `write`):
it is reported as such and carries no acknowledged record.

`write_segment_log` writes the same frames (one per appended batch) so that the log benchmark
can measure this format beside SQLite in the same run; nothing else writes segment logs.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Generator, Iterator, Sequence
from urllib.parse import unquote

from streams.log.port import LogError, Outgoing, Record, TopicSpec

__all__ = ["SegmentDamage", "SegmentLog", "is_segment_log", "write_segment_log"]

_FRAME = struct.Struct("<IIqIIdI")  # size, crc, base_offset, count, last_delta, max_ts, flags
_HDR = _FRAME.size
_REC = struct.Struct("<dIi")  # ts, value_len, key_len
_REC_SPARSE = struct.Struct("<IdIi")  # offset delta, ts, value_len, key_len
_FLAG_SPARSE = 1


@dataclass(frozen=True, slots=True)
class SegmentDamage:
    """Offsets `first`..`last` (inclusive; `last` None: up to an unknown end) that cannot be
    read, where and why. `incomplete`: the torn tail of a last write, never acknowledged."""

    topic: str
    partition: int
    first: int
    last: int | None
    where: str
    reason: str
    incomplete: bool = False

    def __str__(self) -> str:
        span = f"offset {self.first}" if self.last == self.first else \
            f"offsets {self.first}-{'end' if self.last is None else self.last}"
        return f"{self.where}: {self.topic}[{self.partition}] {span}: {self.reason}"


def is_segment_log(root: Path) -> bool:
    """Whether `root` holds a segment log (a `topics/` directory of the old layout)."""
    return any((root / "topics").glob("*/topic.json"))


class SegmentLog:
    """A segment log under `root`, read without changing a byte."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.ends: dict[tuple[str, int], int] = {}  # end offset of each partition read through

    def topics(self) -> list[TopicSpec]:
        out = []
        for meta_path in sorted((self.root / "topics").glob("*/topic.json")):
            try:
                meta = json.loads(meta_path.read_text())
                out.append(TopicSpec(meta_path.parent.name, int(meta["partitions"]),
                                     bool(meta.get("compact", False))))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise LogError(f"{meta_path}: unreadable topic description: {e}") from e
        return out

    def groups(self) -> Iterator[tuple[str, str, dict[int, int]]]:
        """(group, topic, committed next offsets) of every consumer group."""
        for path in sorted((self.root / "groups").glob("*/*.json")):
            try:
                positions = {int(p): int(o) for p, o in json.loads(path.read_text()).items()}
            except (OSError, ValueError, AttributeError) as e:
                raise LogError(f"{path}: unreadable group offsets: {e}") from e
            yield unquote(path.parent.name), path.stem, positions

    def read(self, spec: TopicSpec, partition: int) -> Iterator[Record | SegmentDamage]:
        """Every record of a partition in offset order, and a `SegmentDamage` for each part that
        cannot be read; once read through, the partition's end offset is in `self.ends`."""
        directory = self.root / "topics" / spec.name / str(partition)
        bases = sorted(int(p.name[:-4]) for p in directory.glob("*.log") if p.name[:-4].isdigit())
        expect = 0  # the next offset the previous segment promises
        for i, base in enumerate(bases):
            path = directory / f"{base:020d}.log"
            if base > expect and not spec.compact:
                # compaction may delete a whole sealed segment; elsewhere it is a loss
                yield SegmentDamage(spec.name, partition, expect, base - 1, str(directory),
                             f"missing: no segment holds them (before {path.name})")
            elif base < expect:
                yield SegmentDamage(spec.name, partition, base, expect - 1, str(path),
                             f"the segment overlaps the previous one (which ends at {expect - 1})")
            expect = max(expect, base)
            following = bases[i + 1] if i + 1 < len(bases) else None
            expect = yield from self._segment(spec, partition, path, expect, following)
        self.ends[(spec.name, partition)] = expect

    def _segment(self, spec: TopicSpec, partition: int, path: Path, expect: int,
                 following: int | None) -> Generator[Record | SegmentDamage, None, int]:
        """The segment's records and damage; returns the offset after its last frame."""
        last = following is None
        try:
            data = path.read_bytes()
        except OSError as e:
            raise LogError(f"{path}: cannot read: {e.strerror}") from e
        pos = 0
        while pos < len(data):
            where = f"{path} byte {pos}"
            if pos + _HDR > len(data):
                yield SegmentDamage(spec.name, partition, expect, expect, where,
                             f"a frame cut short ({len(data) - pos} bytes): incomplete last write, "
                             "discarded" if last else "a frame cut short", incomplete=last)
                return expect
            size, crc, base, count, last_delta, _max_ts, flags = _FRAME.unpack_from(data, pos)
            if (size < _HDR or count == 0 or last_delta < count - 1 or flags & ~_FLAG_SPARSE
                    or base < expect or (base != expect and not spec.compact
                                         and not flags & _FLAG_SPARSE)):
                yield SegmentDamage(spec.name, partition, expect,
                             None if following is None else following - 1, where,
                             "unreadable frame header: the rest of the segment is lost")
                return expect if following is None else following
            if pos + size > len(data):
                torn = last
                yield SegmentDamage(spec.name, partition, base, base + last_delta, where,
                             "incomplete last write (frame cut short), discarded" if torn
                             else "frame runs past the end of the segment", incomplete=torn)
                return base + last_delta + 1 if not torn else expect
            if zlib.crc32(memoryview(data)[pos + 8:pos + size]) != crc:
                torn = last and pos + size == len(data)
                yield SegmentDamage(spec.name, partition, base, base + last_delta, where,
                             "CRC mismatch" + (" in the last frame (an incomplete last write?)"
                                               if torn else ""))
            else:
                yield from self._records(spec.name, partition, data, pos, size, base, flags)
            expect = base + last_delta + 1
            pos += size
        return expect

    @staticmethod
    def _records(topic: str, partition: int, buf: bytes, pos: int, size: int, base: int,
                 flags: int) -> Iterator[Record]:
        p, end, k = pos + _HDR, pos + size, 0
        sparse = flags & _FLAG_SPARSE
        while p < end:
            if sparse:
                delta, ts, vlen, klen = _REC_SPARSE.unpack_from(buf, p)
                p += _REC_SPARSE.size
            else:
                delta = k
                ts, vlen, klen = _REC.unpack_from(buf, p)
                p += _REC.size
            key = None
            if klen >= 0:
                key = buf[p:p + klen]
                p += klen
            yield Record(topic, partition, base + delta, key, buf[p:p + vlen], ts)
            p += vlen
            k += 1


def write_segment_log(root: Path, topic: str, batches: Sequence[Sequence[Outgoing]],
                      segment_bytes: int = 64 * 1024 * 1024) -> None:
    """Write one-partition `topic` in the segment format, one frame per batch (the old
    writer's layout without its indexes); for the benchmark's baseline."""
    directory = root / "topics" / topic / "0"
    directory.mkdir(parents=True, exist_ok=True)
    (root / "topics" / topic / "topic.json").write_text(
        json.dumps({"name": topic, "partitions": 1, "compact": False}))
    offset = size = 0
    fd = os.open(directory / f"{0:020d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for batch in batches:
            body = b"".join(_REC.pack(ts, len(v), -1 if k is None else len(k)) + (k or b"") + v
                            for k, v, ts in batch)
            tail = struct.pack("<qIIdI", offset, len(batch), len(batch) - 1,
                               max(ts for _, _, ts in batch), 0)
            frame = struct.pack("<II", _HDR + len(body), zlib.crc32(body, zlib.crc32(tail))) + tail
            if size and size + len(frame) + len(body) > segment_bytes:
                os.close(fd)
                fd = os.open(directory / f"{offset:020d}.log", os.O_WRONLY | os.O_CREAT, 0o644)
                size = 0
            os.writev(fd, [frame, body])
            size += len(frame) + len(body)
            offset += len(batch)
    finally:
        os.close(fd)
