"""The embedded runner: the ONE driver that folds a log's events topic into the product's ledger.

`poolledger run` (services.mainloop) drives it after every append, tests and benchmarks call
`run_once`. It reads every record past its positions, folds the decoded events into the
ledger (an event the ledger rejects goes to `<topic>.dlq` with its reason; an undecodable
record went there on reading), and collects the derived events. `checkpoint` appends those
to the derived topic and, every `snapshot_every` events and at `snapshot()`, stores a
durable snapshot of the ledger with the positions it covers (`streams.snapshot`): derived
events, snapshot and consumer-group commit in ONE SQLite transaction of the embedded log,
so a crash anywhere leaves them consistent, and a restart resumes from the snapshot folding
only what it has not seen (the ledger also drops duplicate ids).

Policy: a snapshot every 1,000,000 events read (about 2 % of the fold's time on the bench
log) and at the end of `run_once` / `poolledger run`; the 4 newest are kept, so `replay
--until` a recent point also starts from one. On Kafka the faust tables hold the state; this
runner then folds without snapshots.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from schemas.config import SettingsLike
from schemas.events import Envelope
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.gcpolicy import long_fold
from streams.log.events import EventLog
from streams.log.port import Record
from streams.log.topics import DERIVED, EVENTS, require_one_partition
from streams.snapshot import FORMAT, SnapshotHeader, SnapshotStore, knobs_digest

__all__ = ["EmbeddedRunner", "GROUP", "SNAPSHOT_EVERY"]

GROUP = "poolledger-embedded"
SNAPSHOT_EVERY = 1_000_000

#: called after each event the ledger applied (the main loop feeds its named negotiators)
OnEvent = Callable[[Record, Envelope], None]


class EmbeddedRunner:
    """Folds `topic` into `self.ledger`; derived events go to `derived_topic` (None: kept
    nowhere); snapshots go into the log when it is an embedded one.

    By default it resumes from the newest usable snapshot (none, or one folded under other
    knobs: from the topic's start). `start` folds from those positions instead, on a fresh
    ledger that then covers only part of the topic, so it writes no snapshots.
    """

    def __init__(self, elog: EventLog, settings: SettingsLike, *, topic: str = EVENTS,
                 derived_topic: str | None = DERIVED, group: str = GROUP,
                 snapshot_every: int = SNAPSHOT_EVERY,
                 start: Mapping[int, int] | None = None) -> None:
        self.elog = elog
        self.settings = settings
        self.topic = topic
        self.derived_topic = derived_topic
        self.group = group
        self.snapshot_every = snapshot_every
        require_one_partition(elog.log, topic)
        log = elog.log
        self.store = SnapshotStore(log, topic) if SnapshotStore.supports(log) else None
        self.ledger = Ledger(settings)
        self.positions: dict[int, int] = {}
        self.events = 0  # decoded events read (`replay --until #N` counts these)
        self.max_ts: float | None = None
        self.pending: list[Envelope] = []
        self._unsnapped = 0
        if start is not None:
            self.positions = dict(start)
            self.store = None
        elif self.store is not None:
            found = self.store.restore(settings)
            if found.ledger is not None and found.header is not None:
                self.ledger = found.ledger
                self.positions = dict(found.header.positions)
                self.events, self.max_ts = found.header.events, found.header.max_ts
        self.ledger.first_version = elog.first_version(topic)

    def fold(self, on_event: OnEvent | None = None, every: int = 0,
             progress: Callable[[int], None] | None = None) -> int:
        """Fold every record past the positions; returns the number of events read. With
        `every`, `checkpoint` (and `progress`) run after each `every` events."""
        consumed = 0
        ledger, elog = self.ledger, self.elog
        with long_fold():
            for record, env in elog.read(self.topic, start_positions=self.positions):
                if self.max_ts is None or env.ts > self.max_ts:
                    self.max_ts = env.ts
                try:
                    self.pending.extend(ledger.apply(env))
                except EventRejectedError as exc:
                    elog.reject(self.topic, record, exc)
                else:
                    if on_event is not None:
                        on_event(record, env)
                self.positions[record.partition] = record.offset + 1
                self.events += 1
                self._unsnapped += 1
                consumed += 1
                if every and consumed % every == 0:
                    self.checkpoint()
                    if progress is not None:
                        progress(consumed)
        return consumed

    def run_once(self, progress: Callable[[int], None] | None = None,
                 every: int = 50_000) -> int:
        """Fold everything available now and snapshot; returns the number of events read."""
        ends = self.elog.log.end_offsets(self.topic)
        consumed = self.fold(every=every, progress=progress)
        # Records that failed to decode went to the DLQ; move past them too.
        for partition, end in ends.items():
            self.positions[partition] = max(self.positions.get(partition, 0), end)
        self.snapshot()
        if progress is not None:
            progress(consumed)
        return consumed

    def checkpoint(self) -> None:
        """Append the pending derived events; snapshot when `snapshot_every` events have been
        read since the last one."""
        if self.store is not None and self._unsnapped >= self.snapshot_every:
            self.snapshot()
        else:
            self._append_derived()

    def snapshot(self) -> None:
        """Derived events, the ledger's snapshot and the group commit, atomically."""
        if self.store is None:
            self._append_derived()
            return
        header = SnapshotHeader(FORMAT, knobs_digest(self.settings), self.topic,
                                dict(self.positions), self.events, self.max_ts)
        with self.store.log.transaction():
            self._append_derived()
            self.store.save(self.ledger, header, self.group)
        self._unsnapped = 0

    def _append_derived(self) -> None:
        if self.pending and self.derived_topic:
            self.elog.append(self.derived_topic, self.pending)
        self.pending.clear()
