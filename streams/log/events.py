"""Event envelopes over any `Log`: encode on append, decode on read, dead-letter bad input.

Invariant 5 (DESIGN.md): bad input never stops the pipeline and is never silently lost. A
record that fails to decode or validate is appended to `<topic>.dlq` — with its raw bytes
(base64), the reason and where it came from — before any later record is handed out, and
reading continues. The same holds for `.jsonl` imports: a bad line goes to the DLQ, never to
the main topic, and is counted so the CLI can exit non-zero.
"""
from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Sequence

import orjson

from schemas.errors import EventValidationError
from schemas.events import (AUTHORITY_TYPES, Envelope, conflict, content_digest, decode, encode,
                            partition_key, reissued)
from streams.core.errors import EventRejectedError
from streams.log.embedded import EmbeddedLog
from streams.log.files import atomic_file
from streams.log.port import (Appended, Log, LogError, Outgoing, Record, TopicNotFoundError,
                              TopicSpec)
from streams.log.topics import dlq_topic, ensure_topics

if TYPE_CHECKING:  # the Kafka adapter (and kafka-python) load only when a kafka:// URL is used
    from streams.log.kafka import SaslLogin

__all__ = ["EventLog", "DeadLetter", "open_log", "ensure_topics"]

log_ = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ entry: the rejected bytes, why, and where they came from."""

    reason: str
    raw: bytes
    topic: str
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None
    timestamp: float | None = None
    path: str | None = None
    line: int | None = None

    def to_json(self) -> bytes:
        return orjson.dumps({
            "reason": self.reason, "topic": self.topic, "partition": self.partition,
            "offset": self.offset, "timestamp": self.timestamp, "path": self.path,
            "line": self.line, "raw_b64": base64.b64encode(self.raw).decode(),
            "key_b64": None if self.key is None else base64.b64encode(self.key).decode()})

    @classmethod
    def from_json(cls, value: bytes) -> DeadLetter:
        d: dict[str, Any] = orjson.loads(value)
        key = d.get("key_b64")
        return cls(reason=d["reason"], raw=base64.b64decode(d["raw_b64"]), topic=d["topic"],
                   partition=d.get("partition"), offset=d.get("offset"),
                   key=None if key is None else base64.b64decode(key),
                   timestamp=d.get("timestamp"), path=d.get("path"), line=d.get("line"))


class EventLog:
    """Moves event envelopes over a `Log` (keyed by `partition_key`, timestamped by `ts`)."""

    def __init__(self, log: Log, *, batch: int = 10_000) -> None:
        self.log = log
        self.batch = batch
        self.dlq_count = 0  # records and lines sent to a DLQ by this instance
        # (topic, partition, offset) already in a DLQ, so re-reading a topic adds no duplicates
        self._dead: dict[str, set[tuple[int, int]]] = {}

    # -- append ---------------------------------------------------------------------------

    def append(self, topic: str, envelopes: Iterable[Envelope]) -> list[Appended]:
        """Encode and append envelopes, in chunks of `batch`."""
        return self.append_raw(topic, (
            (partition_key(env).encode() or None, encode(env), env.ts) for env in envelopes))

    def append_raw(self, topic: str, lines: Iterable[Outgoing]) -> list[Appended]:
        """Append already-encoded (key, value, ts) records, in chunks of `batch`."""
        if isinstance(lines, Sequence) and len(lines) <= self.batch:
            return self.log.append(topic, lines)
        out: list[Appended] = []
        chunk: list[Outgoing] = []
        for item in lines:
            chunk.append(item)
            if len(chunk) >= self.batch:
                out += self.log.append(topic, chunk)
                chunk = []
        if chunk:
            out += self.log.append(topic, chunk)
        return out

    # -- read -----------------------------------------------------------------------------

    def read(self, topic: str, start_positions: Mapping[int, int] | None = None,
             until_ts: float | None = None, lean: frozenset[str] = frozenset(),
             ) -> Iterator[tuple[Record, Envelope]]:
        """Decoded events of `topic` from `start_positions` (default: the beginning),
        partition by partition; records that fail validation go to `<topic>.dlq`.

        `until_ts` keeps only events with `ts <= until_ts` (event time need not be monotonic,
        so this filters rather than stops). Events of a type in `lean` are validated as every
        other (a bad one is dead-lettered) but come out with `data=None`: for a reader that
        copies their stored bytes (`Record.value`) and never looks at the payload. Dropping a
        decoded job ad at once rather than holding a chunk of them halves the decode's cost
        (80-attribute dicts kept alive by the thousand miss the caches; bench/history.py).
        """
        start = start_positions or {}
        for partition in range(self.log.partitions(topic)):
            offset = start.get(partition, 0)
            while True:
                chunk = self.log.read(topic, partition, offset, self.batch)
                if not chunk:
                    break
                offset = chunk[-1].offset + 1
                good: list[tuple[Record, Envelope]] = []
                bad: list[DeadLetter] = []
                for rec in chunk:
                    try:
                        env = decode(rec.value)
                    except EventValidationError as exc:
                        if until_ts is None or rec.timestamp <= until_ts:
                            bad.append(DeadLetter(str(exc), rec.value, topic, rec.partition,
                                                  rec.offset, rec.key, rec.timestamp))
                        continue
                    if until_ts is None or env.ts <= until_ts:
                        if env.type in lean:
                            env = Envelope(env.id, env.type, env.v, env.ts, env.source, env.seq,
                                           None)
                        good.append((rec, env))
                if bad:
                    self.dead_letter(topic, bad)
                yield from good

    def first_version(self, topic: str) -> Callable[[str], Envelope | None]:
        """The ledger's port to `topic` (`Ledger.first_version`): the first valid event the
        topic holds with an id, or None. Asked only for a duplicate older than the ledger's
        window, so it scans: the records whose bytes hold the id as a JSON string (SQLite's
        `instr` on the embedded log, a byte search of each record elsewhere; an imported line
        is stored as written, so not the `"id":` before it), decoded to confirm."""
        def first(event_id: str) -> Envelope | None:
            needle = orjson.dumps(event_id)
            for partition in range(self.log.partitions(topic)):
                for rec in self._holding(topic, partition, needle):
                    try:
                        env = decode(rec.value)
                    except EventValidationError:
                        continue  # dead-lettered when it was read: never an event
                    if env.id == event_id:
                        return env
            return None
        return first

    def _holding(self, topic: str, partition: int, needle: bytes) -> Iterator[Record]:
        """The records of `topic[partition]` whose value holds `needle`, in offset order."""
        log, offset = self.log, 0
        if isinstance(log, EmbeddedLog):
            while (found := log.containing(topic, partition, needle, offset)) is not None:
                yield from log.read(topic, partition, found, 1)
                offset = found + 1
            return
        while chunk := log.read(topic, partition, offset, self.batch):
            yield from (rec for rec in chunk if needle in rec.value)
            offset = chunk[-1].offset + 1

    def dead_letter(self, topic: str, letters: Sequence[DeadLetter]) -> None:
        """Count, log and append to `<topic>.dlq` (skipping records it already holds). A
        reader of a read-only log names them instead: they stay in the log, where its next
        writer dead-letters them."""
        dlq = dlq_topic(topic)
        if isinstance(self.log, EmbeddedLog) and self.log.readonly is not None:
            for d in letters:
                self.dlq_count += 1
                log_.warning("not folded (the log is read-only, so not dead-lettered to %s): "
                             "%s[%s]@%s: %s", dlq, d.topic, d.partition, d.offset, d.reason)
            return
        seen = self._dead.get(topic)
        if seen is None:
            self.log.create_topic(TopicSpec(dlq, 1))
            seen = self._dead[topic] = {
                (d.partition, d.offset) for d in self.dead_letters(topic)
                if d.topic == topic and d.partition is not None and d.offset is not None}
        fresh = []
        for d in letters:
            self.dlq_count += 1
            where = (f"{d.path}" if d.path is not None
                     else f"{d.topic}[{d.partition}]@{d.offset}")
            log_.warning("dead-lettered %s to %s: %s", where, dlq, d.reason)
            if d.partition is not None and d.offset is not None:
                if (d.partition, d.offset) in seen:
                    continue
                seen.add((d.partition, d.offset))
            # import rejects have no event time: stamp them with when they were rejected
            fresh.append((d.key, d.to_json(), d.timestamp if d.timestamp is not None else time.time()))
        if fresh:
            self.log.append(dlq, fresh)

    def reject(self, topic: str, record: Record, exc: EventRejectedError) -> None:
        """Dead-letter a record the ledger would not fold, with the event id and reason."""
        self.dead_letter(topic, [DeadLetter(str(exc), record.value, topic, record.partition,
                                            record.offset, record.key, record.timestamp)])

    def dead_letters(self, topic: str) -> list[DeadLetter]:
        """The entries of `<topic>.dlq` ([] when there is none)."""
        dlq = dlq_topic(topic)
        try:
            n = self.log.partitions(dlq)
        except TopicNotFoundError:
            return []
        out = []
        for p in range(n):
            offset = 0
            while chunk := self.log.read(dlq, p, offset, self.batch):
                out += [DeadLetter.from_json(r.value) for r in chunk]
                offset = chunk[-1].offset + 1
        return out

    # -- .jsonl ---------------------------------------------------------------------------

    def export_jsonl(self, topic: str, path: Path | str) -> int:
        """Write every valid event of `topic` as one line of its stored JSON; returns the
        count. The file appears complete or not at all (written aside, then renamed)."""
        path = Path(path)
        self.log.partitions(topic)  # a missing topic fails before any file is touched
        try:
            with atomic_file(path, buffering=1 << 20) as f:
                return self.write_jsonl(topic, f)
        except OSError as exc:
            raise LogError(f"cannot write {path}: {exc.strerror}") from exc

    def write_jsonl(self, topic: str, f: BinaryIO) -> int:
        """Write every valid event of `topic` to `f`, one line of its stored JSON each (a
        pipe for `log export -`); returns the count."""
        n = 0
        for rec, env in self.read(topic):
            f.write(rec.value if b"\n" not in rec.value else encode(env))
            f.write(b"\n")
            n += 1
        return n

    def import_jsonl(self, path: Path | str, topic: str, *, issuer: str | None = None,
                     refusal: str = "needs ADMINISTRATOR") -> tuple[int, int]:
        """Append each valid line of a `.jsonl` file to `topic` (byte for byte); a bad line
        goes to `<topic>.dlq` with reason "path:line: why". Returns (imported, rejected).

        An event that changes priorities or knobs (`AUTHORITY_TYPES`) is appended as issued
        by `issuer`, the importer's identity holding ADMINISTRATOR (the `by` it carried kept
        as `claimed_by`); without an issuer it is rejected with `refusal` as its reason."""
        path = Path(path)
        self.log.partitions(topic)
        imported = rejected = 0
        good: list[Outgoing] = []
        bad: list[DeadLetter] = []
        # the topic's events by id (a digest of each): an id it holds with other content is
        # refused naming both versions (an identical one is appended; the folds drop it)
        held = {env.id: content_digest(env) for _rec, env in self.read(topic)}
        try:
            f = path.open("rb")
        except OSError as exc:
            raise LogError(f"cannot read {path}: {exc.strerror}") from exc
        with f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                try:
                    env = decode(line)
                except EventValidationError as exc:
                    bad.append(DeadLetter(f"{path}:{lineno}: {exc}", line, topic,
                                          path=str(path), line=lineno))
                    rejected += 1
                    continue
                if env.type in AUTHORITY_TYPES:
                    if issuer is None:
                        bad.append(DeadLetter(f"{path}:{lineno}: {env.type} {env.id!r}: "
                                              f"{refusal}", line, topic, path=str(path),
                                              line=lineno))
                        rejected += 1
                        continue
                    mine = reissued(env, issuer)
                    if mine is not env:
                        env, line = mine, encode(mine)
                digest = content_digest(env)
                known = held.setdefault(env.id, digest)
                if known != digest:
                    old = next((e for _r, e in self.read(topic) if e.id == env.id), None)
                    why = (conflict(old, env) if old is not None else
                           f"event {env.id} appears twice in this file with different content")
                    bad.append(DeadLetter(f"{path}:{lineno}: {why}", line, topic, path=str(path),
                                          line=lineno))
                    rejected += 1
                    continue
                good.append((partition_key(env).encode() or None, line, env.ts))
                if len(good) >= self.batch:
                    imported += len(self.log.append(topic, good))
                    good = []
                if len(bad) >= self.batch:
                    self.dead_letter(topic, bad)
                    bad = []
        if good:
            imported += len(self.log.append(topic, good))
        if bad:
            self.dead_letter(topic, bad)
        return imported, rejected


def open_log(broker: str | None, home: Path, sasl: SaslLogin | None = None) -> Log:
    """The log a URL names: `kafka://HOST:PORT[,HOST:PORT]` -> Kafka (authenticated with
    `sasl` when given); None/"" -> the embedded log in `home/log`; `file:///DIR` -> an
    embedded log in DIR."""
    if not broker:
        return EmbeddedLog(Path(home) / "log")
    scheme, sep, rest = broker.partition("://")
    if sep and scheme == "kafka":
        from streams.log.kafka import KafkaLog, parse_broker_url

        return KafkaLog(parse_broker_url(broker), sasl=sasl)
    if sep and scheme == "file" and rest.startswith("/"):
        return EmbeddedLog(Path(rest))
    raise LogError(f"unsupported log URL {broker!r}: use kafka://HOST:PORT, file:///DIR, "
                   "or no URL for the embedded log")
