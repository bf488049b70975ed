"""The embedded log beyond the port contract: crash safety, processes, time reads, compaction."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from streams.log.embedded import EmbeddedLog, partition_for_key
from streams.log.port import LogError, Outgoing, TopicSpec, iter_topic

T0 = 1_763_800_000.0


def value_of(offset: int) -> bytes:
    """A record body derived from its offset, so any damage or misplacement is visible."""
    return (b"rec-%09d-" % offset) + bytes([offset % 251]) * (100 + offset % 200)


def records(start: int, n: int) -> list[Outgoing]:
    return [(b"k%d" % (i % 5), value_of(i), T0 + i) for i in range(start, start + n)]


def assert_intact(log: EmbeddedLog, topic: str, upto: int) -> None:
    got = list(iter_topic(log, topic))
    assert [r.offset for r in got] == list(range(len(got)))
    assert len(got) >= upto
    for r in got:
        assert r.value == value_of(r.offset) and r.timestamp == T0 + r.offset
        assert r.key == b"k%d" % (r.offset % 5)


# --------------------------------------------------------------------------- crash safety

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from streams.log.embedded import EmbeddedLog
    from tests.test_embedded_log import records
    log = EmbeddedLog(Path(sys.argv[1]))
    offset = sum(log.end_offsets("t").values())
    while True:
        landed = log.append("t", records(offset, 997))
        offset = landed[-1].offset + 1
        print(landed[-1].offset, flush=True)
""")


def start_writer(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])


def test_kill_9_loses_no_acknowledged_record(tmp_path: Path) -> None:
    root = tmp_path / "log"
    EmbeddedLog(root).create_topic(TopicSpec("t", 1))
    acked = -1
    for round_ in range(3):  # kill, reopen and continue, a few times
        proc = start_writer(root)
        assert proc.stdout is not None
        target = acked + 20_000 + round_ * 7_919
        while acked < target:
            line = proc.stdout.readline()
            assert line, "writer died early"
            acked = int(line)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the writer is busy appending
        proc.wait()
        log = EmbeddedLog(root)
        assert log.end_offsets("t")[0] >= acked + 1
        assert log.end_offsets("t")[0] % 997 == 0  # only whole appends are visible
        assert_intact(log, "t", acked + 1)
        log.close()


# --------------------------------------------------------------------------- processes

READER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from streams.log.embedded import EmbeddedLog
    from tests.test_embedded_log import value_of
    log = EmbeddedLog(Path(sys.argv[1]))
    want, offset, polls = int(sys.argv[2]), 0, 0
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while offset < want and time.monotonic() < deadline:
        chunk = log.read("t", 0, offset, 1000)
        polls += not chunk
        for r in chunk:
            assert r.offset == offset and r.value == value_of(offset), (r.offset, offset)
            offset += 1
    print(polls, offset, flush=True)
""")


def test_reader_in_another_process_sees_only_whole_records(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = EmbeddedLog(root)
    log.create_topic(TopicSpec("t", 1))
    want = 40_000
    reader = subprocess.Popen([sys.executable, "-c", READER, str(root), str(want)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[1])
    assert reader.stdout is not None
    assert reader.stdout.readline() == "ready\n"  # reading concurrently from here on
    rng = random.Random(7)
    offset = 0
    while offset < want:
        n = min(rng.randint(1, 700), want - offset)
        log.append("t", records(offset, n))
        offset += n
        time.sleep(0.002)  # let the reader catch up with the tail now and then
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    polls, seen = map(int, out.split())
    assert seen == want
    assert polls > 20  # it really read while the writer was writing


def test_writers_in_one_process_take_turns(tmp_path: Path) -> None:
    root = tmp_path / "log"
    first = EmbeddedLog(root)
    first.create_topic(TopicSpec("t", 1))
    second = EmbeddedLog(root)
    landed = []
    for i in range(0, 400, 20):  # alternate: each must see the other's appends
        landed += (first if i % 40 else second).append("t", records(i, 20))
    assert [a.offset for a in landed] == list(range(400))
    assert_intact(first, "t", 400)
    assert_intact(second, "t", 400)
    assert first.end_offsets("t") == second.end_offsets("t") == {0: 400}


APPENDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from streams.log.embedded import EmbeddedLog
    log = EmbeddedLog(Path(sys.argv[1]))
    me = sys.argv[2].encode()
    for i in range(300):
        log.append("t", [(me, b"%d" % (i * 10 + j), 1.0) for j in range(10)])
""")


def test_appenders_in_several_processes_interleave_safely(tmp_path: Path) -> None:
    root = tmp_path / "log"
    EmbeddedLog(root).create_topic(TopicSpec("t", 1))
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(root), name],
                              cwd=Path(__file__).parents[1]) for name in ("a", "b", "c")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    got = list(iter_topic(EmbeddedLog(root), "t"))
    assert [r.offset for r in got] == list(range(9000))
    for name in (b"a", b"b", b"c"):
        assert [r.value for r in got if r.key == name] == [b"%d" % i for i in range(3000)]


def test_a_held_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    import sqlite3

    log = EmbeddedLog(tmp_path / "log", lock_timeout=0.2)
    log.create_topic(TopicSpec("t", 1))
    other = sqlite3.connect(log.db, isolation_level=None)  # another writer, mid-transaction
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(LogError, match="held the write lock"):
        log.append("t", [(None, b"x", T0)])
    assert log.read("t", 0, 0) == []  # reading never waits for the lock
    other.execute("ROLLBACK")
    other.close()
    assert [a.offset for a in log.append("t", [(None, b"x", T0)])] == [0]


# --------------------------------------------------------------------------- reads

def test_reads_across_appends(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = EmbeddedLog(root)
    log.create_topic(TopicSpec("t", 1))
    for start in range(0, 5000, 250):
        log.append("t", records(start, 250))
    assert_intact(log, "t", 5000)
    for offset in (0, 1, 249, 250, 251, 1999, 2000, 4999):
        (r,) = log.read("t", 0, offset, 1)
        assert r.offset == offset and r.value == value_of(offset)
    log.append("t", records(5000, 3000))  # a big append
    assert_intact(log, "t", 8000)
    log.close()
    assert_intact(EmbeddedLog(root), "t", 8000)


def test_time_based_reads_match_brute_force(tmp_path: Path) -> None:
    """offset_for_time = the first offset with ts >= t, also for late (out of order) events."""
    root = tmp_path / "log"
    log = EmbeddedLog(root)
    log.create_topic(TopicSpec("t", 1))
    rng = random.Random(3)
    stamps: list[float] = []
    clock = T0
    while len(stamps) < 4000:
        batch = []
        for _ in range(rng.randint(1, 60)):
            clock += rng.random()
            ts = clock - (rng.random() * 30 if rng.random() < 0.1 else 0.0)  # some are late
            batch.append((None, b"x" * rng.randint(10, 200), ts))
            stamps.append(ts)
        log.append("t", batch)

    def brute(t: float) -> int:
        return next((i for i, s in enumerate(stamps) if s >= t), len(stamps))

    probes = [T0 - 1, T0, max(stamps), max(stamps) + 0.001] + \
        [rng.uniform(T0 - 5, clock + 5) for _ in range(300)] + rng.sample(stamps, 100)
    for t in probes:
        assert log.offset_for_time("t", 0, t) == brute(t), t
    log.close()
    reopened = EmbeddedLog(root)
    for t in probes[:100]:
        assert reopened.offset_for_time("t", 0, t) == brute(t), t
    first = brute(probes[5])
    (r,) = reopened.read("t", 0, first, 1)
    assert r.timestamp == stamps[first]


# --------------------------------------------------------------------------- the rest

def test_partitioning_is_stable_crc32() -> None:
    """Partition choice is part of the on-disk format: it must never change."""
    assert partition_for_key(b"alice@example.org", 4) == zlib.crc32(b"alice@example.org") % 4
    assert partition_for_key(b"alice@example.org", 4) == 3
    assert partition_for_key(None, 4) == 0


def test_compaction_keeps_the_latest_value_per_key(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = EmbeddedLog(root)
    log.create_topic(TopicSpec("ads", 1, compact=True))
    latest: dict[bytes, int] = {}
    for i in range(3000):
        key = b"slot%d@ep" % (i % 40)
        log.append("ads", [(key, b"ad-%d" % i, T0 + i)])
        latest[key] = i
    log.create_topic(TopicSpec("plain", 1))
    with pytest.raises(LogError, match="not a compact topic"):
        log.compact("plain")
    removed = log.compact("ads")
    assert removed > 2000
    got = list(iter_topic(log, "ads"))
    assert len(got) == 3000 - removed
    assert [r.offset for r in got] == sorted(r.offset for r in got)
    final = {r.key: r.offset for r in got}
    assert final == latest
    assert all(r.value == b"ad-%d" % r.offset and r.timestamp == T0 + r.offset for r in got)
    assert log.end_offsets("ads") == {0: 3000}
    assert log.read("ads", 0, 5, 1)[0].offset >= 5  # a compacted-away offset reads onwards
    assert log.offset_for_time("ads", 0, T0 + 2990.5) == 2991
    assert [a.offset for a in log.append("ads", [(b"new", b"x", T0)])] == [3000]
    log.close()
    assert {r.key: r.offset for r in iter_topic(EmbeddedLog(root), "ads")} == {**latest, b"new": 3000}


def test_a_reader_sees_compaction_by_another_writer(tmp_path: Path) -> None:
    root = tmp_path / "log"
    writer = EmbeddedLog(root)
    writer.create_topic(TopicSpec("ads", 1, compact=True))
    for i in range(0, 2000, 10):
        writer.append("ads", [(b"k%d" % (j % 500), b"v%d" % j, T0 + j) for j in range(i, i + 10)])
    reader = EmbeddedLog(root)
    assert len(list(iter_topic(reader, "ads"))) == 2000  # before compaction: every record
    for i in range(2000, 2600, 10):
        writer.append("ads", [(b"k%d" % (j % 500), b"v%d" % j, T0 + j) for j in range(i, i + 10)])
    removed = writer.compact("ads")
    assert removed > 1000
    got = list(iter_topic(reader, "ads"))
    assert len(got) == 2600 - removed
    assert {r.key: r.value for r in got} == {b"k%d" % (j % 500): b"v%d" % j for j in range(2600)}


def test_group_offsets_survive_reopen_and_odd_names(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log", fsync=True)
    log.create_topic(TopicSpec("t", 2))
    for group in ("negotiator", "../escape", "a/b", ".", "naïve group"):
        log.commit(group, "t", {0: 3, 1: 4})
    log.close()
    again = EmbeddedLog(tmp_path / "log")
    for group in ("negotiator", "../escape", "a/b", ".", "naïve group"):
        assert again.committed(group, "t") == {0: 3, 1: 4}
    assert not (tmp_path / "escape").exists()
    with pytest.raises(LogError):
        again.commit("g", "t", {2: 1})


def test_invalid_topic_names_are_refused(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    for name in ("", "..", "a/b", "white space", "x" * 250):
        with pytest.raises(LogError):
            log.create_topic(TopicSpec(name, 1))


def test_fsync_mode_appends_and_reads(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log", fsync=True)
    log.create_topic(TopicSpec("t", 1))
    t = time.perf_counter()
    for start in range(0, 200, 20):
        log.append("t", records(start, 20))
    assert time.perf_counter() - t < 30
    assert_intact(log, "t", 200)


def test_a_reader_holds_few_file_descriptors(tmp_path: Path) -> None:
    """However long the log, a reader keeps the database, its WAL and shared memory open."""
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic(TopicSpec("t", 1))
    for start in range(0, 3000, 50):
        log.append("t", records(start, 50))
    log.close()
    before = len(os.listdir("/proc/self/fd"))
    reader = EmbeddedLog(tmp_path / "log")
    assert_intact(reader, "t", 3000)
    reader.offset_for_time("t", 0, T0 + 1234)
    assert len(os.listdir("/proc/self/fd")) - before <= 3
    reader.close()



def test_an_older_state_table_without_rowid_is_converted_by_its_first_state_write(
        tmp_path: Path) -> None:
    """Snapshot sections are megabytes: in a WITHOUT ROWID table (the old layout) finding
    any state row read the big rows beside it; an old file becomes a rowid table, rows kept,
    when state is next written (opening and reading it change no byte)."""
    big = bytes(range(256)) * 40_000
    with EmbeddedLog(tmp_path) as log:
        log.put_state("a.head", b"small")
        log.put_state("a.pool", big)
    conn = sqlite3.connect(tmp_path / "log.sqlite", isolation_level=None)
    conn.executescript("""
        CREATE TABLE state_old(name TEXT PRIMARY KEY, value BLOB NOT NULL,
            crc INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO state_old SELECT name, value, crc FROM state;
        DROP TABLE state; ALTER TABLE state_old RENAME TO state;""")
    assert "WITHOUT ROWID" in conn.execute(
        "SELECT sql FROM sqlite_schema WHERE name='state'").fetchone()[0]
    conn.close()
    before = (tmp_path / "log.sqlite").read_bytes()
    with EmbeddedLog(tmp_path) as log:
        assert log.state("a.head") == b"small" and log.state("a.pool") == big  # CRCs checked
    assert (tmp_path / "log.sqlite").read_bytes() == before
    with EmbeddedLog(tmp_path) as log:
        log.put_state("b.head", b"new")
        assert log.state("a.head") == b"small" and log.state("a.pool") == big
        assert log.state_names() == ["a.head", "a.pool", "b.head"]
        sql = log.conn.execute("SELECT sql FROM sqlite_schema WHERE name='state'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql.upper()
