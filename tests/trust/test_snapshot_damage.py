"""Issue 28 item 14, complete: damage anywhere under a snapshot, not only among its newest
CHECKED_UNDER records, is named by a query answering from it; each record's checksum is
checked once (from the log's last-verified position, VERIFY_BUDGET per query), the newest
every time."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import streams.snapshot
from schemas.events import AdInvalidated, make_event
from schemas.settings import load_settings
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.port import TopicSpec
from streams.log.topics import DERIVED, EVENTS
from streams.replay import start_of
from streams.runner import EmbeddedRunner
from streams.snapshot import CHECKED_UNDER, SnapshotStore

N = CHECKED_UNDER + 10_000


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A log of N events with a snapshot covering them all."""
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec(EVENTS))
    elog.log.create_topic(TopicSpec(DERIVED))
    t = 1_763_800_000.0
    elog.append(EVENTS, [make_event(AdInvalidated("Machine", f"s{i % 50}@ep.example.org"),
                                    ts=t + i, source=f"collector@cm{i % 2}", seq=i // 2 + 1)
                         for i in range(N)])
    EmbeddedRunner(elog, load_settings(env={})).run_once()
    elog.log.close()
    return tmp_path / "log"


def _spoil(root: Path, offset: int, by: int = 1) -> None:
    """Alter the stored checksum of the record at `offset` by `by` (-1 undoes it)."""
    con = sqlite3.connect(root / "log.sqlite")
    try:
        con.execute("UPDATE records SET crc = crc + ? WHERE id = (SELECT (p.id << 40) + ? FROM "
                    "partitions p, topics t WHERE t.name = ? AND p.topic = t.id)", (by, offset, EVENTS))
        con.commit()
    finally:
        con.close()


def _warnings(root: Path) -> list[str]:
    elog = EventLog(EmbeddedLog(root))
    try:
        warned: list[str] = []
        start = start_of(elog, load_settings(env={}), warn=warned.append)
        assert start.ledger is not None and start.events == N  # answered from the snapshot
        return warned
    finally:
        elog.log.close()


def test_damage_older_than_the_newest_records_under_a_snapshot_is_named(home: Path) -> None:
    _spoil(home, 100)  # 29,900 records below the snapshot's position: not among the newest
    warned = _warnings(home)
    assert len(warned) == 1 and warned[0].startswith(
        f"the log is damaged at {EVENTS}[0]@100: checksum mismatch"), warned


def test_each_record_is_verified_once_from_the_last_verified_position(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget of 4,000 records a query, damage at offset 6,000 is found by the
    second query, which starts where the first stopped; the mark is remembered in the log."""
    monkeypatch.setattr(streams.snapshot, "VERIFY_BUDGET", 4_000)
    _spoil(home, 6_000)
    assert _warnings(home) == []
    log = EmbeddedLog(home)
    try:
        assert SnapshotStore(log).verified() == {0: 4_000}
    finally:
        log.close()
    warned = _warnings(home)
    assert len(warned) == 1 and f"{EVENTS}[0]@6000: checksum mismatch" in warned[0], warned
    _spoil(home, 6_000, -1)  # repaired: the next queries verify the rest, in turns
    for _ in range(3):
        assert _warnings(home) == []
    _spoil(home, 2_000)  # below the mark: verified once, not read by a query again
    assert _warnings(home) == []
    log = EmbeddedLog(home)
    try:
        assert SnapshotStore(log).verified() == {0: N - CHECKED_UNDER}
    finally:
        log.close()
