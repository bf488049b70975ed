"""The sink runner: one consumer of the log shared by every sink (adstash, DuckDB, metrics).

A sink copies events out of the log to where users look (DESIGN.md "Sinks"). The runner reads
the topics a `Target` names, from its checkpoint, through `EventLog` (so a record that fails
to decode goes to the topic's DLQ exactly as everywhere else), hands batches to the target and
moves the checkpoint only after the target acknowledged them. Delivery is therefore
at-least-once; targets make it exactly-once in effect with deterministic document ids (ES) or
by storing the positions with their rows (DuckDB, via `Target.positions`). A document the target
refuses goes to the sink's own DLQ with the target's reason, and the stream goes on. A target
that is down stops progress, never the process: one log line, retries with capped exponential
backoff, the checkpoint stays where the last acknowledgement left it.
"""
from __future__ import annotations

import hashlib
import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, TextIO, runtime_checkable

import msgspec

from schemas.events import Envelope, encode
from streams.log.events import DeadLetter, EventLog
from streams.log.port import Log, Outgoing, TopicSpec
from streams.log.topics import dlq_topic
from streams.progress import Progress

__all__ = ["Positions", "Rejection", "SinkError", "SinkItem", "SinkReport", "SinkRunner",
           "StagedTarget", "Target", "TargetUnavailableError", "sink_group"]

log_ = logging.getLogger(__name__)

Positions = dict[str, dict[int, int]]  # topic -> partition -> NEXT offset


class SinkError(Exception):
    """Root of the sink runner's errors (targets raise their own subclasses of it)."""


class TargetUnavailableError(SinkError):
    """The target is down or unreachable and acknowledged nothing of the batch."""


class SinkItem(msgspec.Struct, frozen=True, gc=False):
    """One decoded event and where it was read (a Struct: built once per event on the
    runner's hot path, in a fifth of a frozen dataclass's time). For an event of a type the
    runner reads lean (`SinkRunner(lean=...)`), `event.data` is None and `raw` holds the
    record's stored bytes (validated: they decode to a valid event)."""

    topic: str
    partition: int
    offset: int
    event: Envelope
    raw: bytes = b""


@dataclass(frozen=True, slots=True)
class Rejection:
    """An item the target refused, with the target's own reason."""

    item: SinkItem
    reason: str


class Target(Protocol):
    """Where a sink writes. `name` gives the consumer group `poolledger.sink.<name>` and the
    sink's DLQ `poolledger.sink.<name>.dlq`; `topics` are the log topics it reads."""

    name: str
    topics: tuple[str, ...]

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        """Write the batch and return once the target acknowledged it (only the refused
        items are returned). `upto` is where the checkpoint will be after this batch (a
        transactional target stores it with its rows). `items` may be empty when only the
        positions move (past dead-lettered records). Raise TargetUnavailableError if
        nothing was acknowledged."""

    def positions(self) -> Positions | None:
        """The checkpoint the target stores itself, or None: the runner keeps it as the
        log's consumer-group offsets."""

    def close(self) -> None:
        """Release connections and files."""


@runtime_checkable
class StagedTarget(Target, Protocol):
    """A target whose batch is turned into what it writes (`stage`: Python work, holding the
    GIL) apart from the write (`deliver_staged`: outside the GIL, e.g. DuckDB). In overlap
    mode the runner stages each batch on its own thread, beside the previous batch's write,
    so the worker never waits for the GIL the reading thread holds. `stage` runs while a
    delivery is under way: it must not touch what `deliver_staged` writes to. Its `deliver`
    is `deliver_staged(stage(items), upto)`."""

    def stage(self, items: Sequence[SinkItem]) -> Any:
        """The batch as the target writes it (pure: nothing is written)."""

    def deliver_staged(self, staged: Any, upto: Positions) -> list[Rejection]:
        """`deliver` of a staged batch (its rejections name the items given to `stage`)."""


@dataclass(slots=True)
class SinkReport:
    """What one run did: items acknowledged, items refused (dead-lettered with the target's
    reason), records dead-lettered because they failed to decode, and the lag at the end."""

    delivered: int = 0
    rejected: int = 0
    dead_lettered_at_decode: int = 0
    lag: int = 0

    def add(self, other: SinkReport) -> None:
        self.delivered += other.delivered
        self.rejected += other.rejected
        self.dead_lettered_at_decode += other.dead_lettered_at_decode
        self.lag = other.lag


Anchors = dict[tuple[str, int], str]


def _digest(record: Any) -> str:
    return f"{record.offset}:{hashlib.blake2b(record.value, digest_size=16).hexdigest()}"


def anchors(log: Log, positions: Positions) -> Anchors:
    """Which log a store's positions count in: per partition read (`positions`: next offset),
    the offset and a digest of the last record read. A sink's own store (history.duckdb,
    adstash's --checkpoint_file) keeps them beside its positions (`anchors_hold`)."""
    out: Anchors = {}
    for topic, parts in positions.items():
        for partition, nxt in parts.items():
            last = log.read(topic, partition, nxt - 1, 1) if nxt > 0 else []
            if last and last[0].offset == nxt - 1:
                out[(topic, partition)] = _digest(last[0])
    return out


def anchors_hold(log: Log, stored: Anchors) -> bool:
    """Whether `log` still holds every anchored record as it was read: False for a log
    replaced by another since (a new run in the same directory, a salvage that renumbered),
    whose records at those offsets differ or are missing, even when it is as long. A log
    equal up to there (the same scenario and seed) holds: continuing on it is right."""
    present = set(log.topics())
    for (topic, partition), anchor in stored.items():
        offset = int(anchor.split(":", 1)[0])
        found = log.read(topic, partition, offset, 1) if topic in present else []
        if not found or _digest(found[0]) != anchor:
            return False
    return True


def sink_group(name: str) -> str:
    """The consumer group (and DLQ stem) of the sink named `name`."""
    return f"poolledger.sink.{name}"


@dataclass(slots=True)
class _Progress:
    """A catch-up's progress line (`streams.progress.Progress`: a terminal only, after 2 s):
    the records read of what all its topics held when it started, the rate and the time
    left."""

    bar: Progress
    total: int
    before: int = 0  # records read of the topics already drained

    def update(self, read: int, force: bool = False) -> None:
        done = self.before + read
        self.bar.update(done / max(self.total, 1), None, done, force=force)

    def end(self) -> None:
        """The line at the catch-up's end, when one was drawn on the way."""
        if self.bar.shown:
            self.update(0, force=True)


class SinkRunner:
    """Moves events from the log to one target, checkpointing after each acknowledgement.

    `batch` bounds the items per `deliver`; a down target is retried after `backoff` seconds,
    doubling up to `max_backoff`; `give_up_after` (seconds of one outage; None = never) makes
    `run_once` raise TargetUnavailableError instead of waiting for ever. `overlap` delivers
    each batch on a worker thread while the next one is read and decoded, for a target whose
    writes run outside the GIL (DuckDB): the wall time is then the slower of the two sides,
    not their sum. Batches are still delivered one at a time and in order, and the checkpoint
    (and the DLQ, and consumer-group offsets) move on this thread after each acknowledgement.
    A `StagedTarget` has each batch staged on this thread before it goes to the worker.
    `lean` names event types the target copies from their stored bytes (`SinkItem.raw`):
    they are validated like every event, then handed over without their decoded payload
    (`EventLog.read(lean=...)`), which is most of the cost of reading big ads.
    """

    def __init__(self, log: Log, target: Target, *, batch: int = 5000, backoff: float = 0.5,
                 max_backoff: float = 30.0, give_up_after: float | None = None,
                 progress: bool = True, overlap: bool = False,
                 lean: frozenset[str] = frozenset()) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.log = log
        self.target = target
        self.batch = batch
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.give_up_after = give_up_after
        self.group = sink_group(target.name)
        self.dlq = dlq_topic(self.group)
        self.events = EventLog(log)
        self._progress_stream: TextIO | None = sys.stderr if progress and sys.stderr.isatty() else None
        self._dlq_ready = False
        self.overlap = overlap
        # only an overlapped batch is worth staging apart (see StagedTarget)
        self._stager = target if overlap and isinstance(target, StagedTarget) else None
        self.lean = lean

    # -- positions ------------------------------------------------------------------------

    def positions(self) -> Positions:
        """The current checkpoint: the target's own, else the consumer group's offsets."""
        own = self.target.positions()
        if own is not None:
            return {t: dict(own.get(t, {})) for t in self.target.topics}
        return {t: self.log.committed(self.group, t) for t in self.target.topics}

    def lag(self) -> int:
        """Events between the checkpoint and the log's end, over the target's topics."""
        pos = self.positions()
        return sum(max(0, end - pos[t].get(p, 0))
                   for t in self.target.topics for p, end in self.log.end_offsets(t).items())

    # -- running --------------------------------------------------------------------------

    def run_once(self) -> SinkReport:
        """Catch up to the log's end (as it was when each topic was started), then return."""
        return self._catch_up(threading.Event())

    def follow(self, stop: threading.Event, poll_seconds: float = 1.0) -> SinkReport:
        """Deliver new events as they arrive until `stop` is set."""
        total = SinkReport()
        while not stop.is_set():
            report = self._catch_up(stop)
            total.add(report)
            if report.delivered + report.rejected + report.dead_lettered_at_decode == 0:
                stop.wait(poll_seconds)
        return total

    def _catch_up(self, stop: threading.Event) -> SinkReport:
        report = SinkReport()
        pos = self.positions()
        bar = Progress(self._progress_stream, after=2.0)
        total = 0 if bar.stream is None else sum(
            sum(self.log.end_offsets(t).values()) - sum(pos.get(t, {}).values())
            for t in self.target.topics)
        progress = _Progress(bar, total)
        try:
            for topic in self.target.topics:
                if stop.is_set():
                    break
                self._drain(topic, pos, report, stop, progress)
            progress.end()
        finally:
            bar.close()
        report.lag = self.lag()
        return report

    def _drain(self, topic: str, pos: Positions, report: SinkReport, stop: threading.Event,
               progress: _Progress) -> None:
        """Deliver `topic` from pos[topic] up to its end offsets taken now."""
        ends = self.log.end_offsets(topic)
        start = dict(pos.get(topic, {}))
        if all(start.get(p, 0) >= e for p, e in ends.items()):
            return
        own = self.target.positions() is not None
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"sink-{self.target.name}") \
            if self.overlap else None
        # the batch being delivered (overlap): settled before the next one is handed over
        pending: list[tuple[Future[list[Rejection] | None], list[SinkItem], dict[int, int]]] = []

        def settle() -> bool:
            if not pending:
                return True
            future, sent, upto = pending.pop()
            return self._settle(topic, sent, upto, future.result(), own, pos, report)

        def flush(items: list[SinkItem], cur: dict[int, int]) -> bool:
            # staged here, beside the previous batch's write
            batch = items if self._stager is None else self._stager.stage(items)
            if not settle():
                return False
            upto = {**pos, topic: dict(cur)}
            held = dict(pos.get(topic, {}))
            if worker is None:
                return self._settle(topic, items, upto[topic],
                                    self._deliver(batch, upto, held, stop), own, pos, report)
            pending.append((worker.submit(self._deliver, batch, upto, held, stop), items,
                            upto[topic]))
            return True

        try:
            cur = dict(start)
            items: list[SinkItem] = []
            dead_before = self.events.dlq_count
            for rec, env in self.events.read(topic, start, lean=self.lean):
                if rec.offset >= ends.get(rec.partition, 0):
                    if rec.partition == len(ends) - 1:
                        break  # beyond the snapshot: the next catch-up takes it
                    continue
                items.append(SinkItem(topic, rec.partition, rec.offset, env,
                                      b"" if env.data is not None else rec.value))
                cur[rec.partition] = rec.offset + 1
                if len(items) >= self.batch:
                    # every partition before this one was read to (at least) its snapshot end
                    for p in range(rec.partition):
                        cur[p] = max(cur.get(p, 0), ends[p])
                    if not flush(items, cur):
                        return
                    report.dead_lettered_at_decode += self.events.dlq_count - dead_before
                    dead_before = self.events.dlq_count
                    items = []
                    progress.update(sum(cur.values()) - sum(start.values()))
                    if stop.is_set():
                        settle()
                        return
            # the read ended: every partition was read to its snapshot end (bad records included)
            for p, e in ends.items():
                cur[p] = max(cur.get(p, 0), e)
            if not settle():
                return
            if items or cur != pos.get(topic, {}):
                flush(items, cur)
                settle()
            report.dead_lettered_at_decode += self.events.dlq_count - dead_before
        finally:
            if worker is not None:
                worker.shutdown(wait=True)  # never leave a write running past the catch-up
            progress.before += sum(ends.values()) - sum(start.values())

    def _deliver(self, batch: Any, upto: Positions, held: dict[int, int],
                 stop: threading.Event) -> list[Rejection] | None:
        """Deliver one batch (staged if `_stager`), retrying while the target is down; its
        rejections, or None when `stop` was set before the target came back. Touches only
        the target (it may run on the overlap worker)."""
        delay = self.backoff
        down_since: float | None = None
        while True:
            try:
                rejections = (self.target.deliver(batch, upto) if self._stager is None
                              else self._stager.deliver_staged(batch, upto))
                break
            except TargetUnavailableError as exc:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    log_.warning("sink %s: target unavailable (%s); retrying with backoff, "
                                 "checkpoint held at %s", self.target.name, exc, _describe(held))
                if self.give_up_after is not None and now - down_since >= self.give_up_after:
                    raise
                log_.info("sink %s: retrying in %.1f s", self.target.name, delay)
                if stop.wait(delay):
                    return None
                delay = min(delay * 2, self.max_backoff)
        if down_since is not None:
            log_.warning("sink %s: target back after %.1f s", self.target.name,
                         time.monotonic() - down_since)
        return rejections

    def _settle(self, topic: str, items: list[SinkItem], cur: dict[int, int],
                rejections: list[Rejection] | None, own: bool, pos: Positions,
                report: SinkReport) -> bool:
        """After an acknowledgement: dead-letter the batch's rejections and move the
        checkpoint. False when the delivery stopped unacknowledged."""
        if rejections is None:
            return False
        if rejections:
            self._dead_letter(rejections)
        if not own:
            self.log.commit(self.group, topic, cur)
        pos[topic] = dict(cur)
        report.delivered += len(items) - len(rejections)
        report.rejected += len(rejections)
        return True

    def _dead_letter(self, rejections: Sequence[Rejection]) -> None:
        """Append refused items to the sink's DLQ: reason, event id and the raw event."""
        if not self._dlq_ready:
            self.log.create_topic(TopicSpec(self.dlq, 1))
            self._dlq_ready = True
        out: list[Outgoing] = []
        for r in rejections:
            it = r.item
            reason = f"{self.target.name} rejected event {it.event.id}: {r.reason}"
            out.append((it.event.id.encode(), DeadLetter(
                reason, it.raw or encode(it.event), it.topic, it.partition, it.offset, None,
                it.event.ts).to_json(), it.event.ts))
        self.log.append(self.dlq, out)
        log_.warning("sink %s: %d event(s) refused, sent to %s; first: %s", self.target.name,
                     len(rejections), self.dlq, rejections[0].reason)

    def dead_letters(self) -> list[DeadLetter]:
        """The sink's DLQ entries."""
        return self.events.dead_letters(self.group)

    def close(self) -> None:
        self.target.close()


def _describe(positions: dict[int, int]) -> str:
    return ", ".join(f"[{p}]@{o}" for p, o in sorted(positions.items())) or "the start"
