"""The embedded runner: the ledger folded in one process over any log port (embedded by default).

It resumes from a snapshot that holds the state AND the input positions in one atomically
written file, so a crash between applying and checkpointing replays events the snapshot has
not seen and nothing twice (the ledger also drops duplicate ids). Derived events are appended
to the derived topic before the snapshot moves, so the checkpoint only advances after the
target acknowledged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import orjson

from schemas.events import Envelope
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger, SettingsLike
from streams.gcpolicy import long_fold
from streams.log.embedded import atomic_file
from streams.log.events import EventLog
from streams.log.topics import DERIVED, EVENTS, require_one_partition

SNAPSHOT_NAME = "ledger.snapshot.json"


class EmbeddedRunner:
    """Folds the events topic into a ledger, appends derived events, checkpoints to disk."""

    def __init__(self, elog: EventLog, settings: SettingsLike, state_dir: Path,
                 topic: str = EVENTS, derived_topic: str = DERIVED,
                 checkpoint_every: int = 50_000) -> None:
        self.elog = elog
        self.settings = settings
        self.topic = topic
        self.derived_topic = derived_topic
        self.path = state_dir / SNAPSHOT_NAME
        self.checkpoint_every = checkpoint_every
        self.positions: dict[int, int] = {}
        self.ledger = Ledger(settings)
        state_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            doc = orjson.loads(self.path.read_bytes())
            self.positions = {int(p): int(o) for p, o in doc["positions"].items()}
            self.ledger = Ledger.from_json(settings, orjson.dumps(doc["ledger"]))

    def run_once(self, progress: Callable[[int], None] | None = None) -> int:
        """Fold everything available now; returns the number of records consumed. An event
        the ledger rejects goes to `<topic>.dlq` with its reason; folding goes on."""
        require_one_partition(self.elog.log, self.topic)
        consumed = 0
        pending: list[Envelope] = []
        # Everything below these ends is read below, decoded or dead-lettered.
        ends = self.elog.log.end_offsets(self.topic)
        with long_fold():
            for record, env in self.elog.read(self.topic, start_positions=self.positions):
                try:
                    pending.extend(self.ledger.apply(env))
                except EventRejectedError as exc:
                    self.elog.reject(self.topic, record, exc)
                self.positions[record.partition] = record.offset + 1
                consumed += 1
                if consumed % self.checkpoint_every == 0:
                    self._checkpoint(pending)
                    pending = []
                    if progress:
                        progress(consumed)
        # Records that failed to decode went to the DLQ; move past them too.
        for partition, end in ends.items():
            self.positions[partition] = max(self.positions.get(partition, 0), end)
        self._checkpoint(pending)
        if progress:
            progress(consumed)
        return consumed

    def _checkpoint(self, derived: list[Envelope]) -> None:
        if derived:
            self.elog.append(self.derived_topic, derived)
        doc = {"positions": {str(p): o for p, o in self.positions.items()},
               "ledger": self.ledger.to_doc()}
        with atomic_file(self.path) as f:
            f.write(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
        self.elog.log.commit("poolledger-embedded", self.topic, self.positions)
