"""Issue 10, reproduction 1 in the SQLite log: damage anywhere makes every reader and writer
refuse with one line naming the file and topic[partition]@offset, nothing is truncated or
rewritten, `log verify`/`log salvage` name exactly the offsets lost; an append cut short is
discarded and reported; segment logs of earlier versions migrate, or name their damage."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from schemas.events import JobStarted, make_event
from streams.log.embedded import DB_NAME, EmbeddedLog, LogCorruptError
from streams.log.port import LogError, TopicSpec, iter_topic
from tests.test_cli import write_log
from tests.test_embedded_log import assert_intact, records, value_of

ROOT = Path(__file__).parents[1]
FIXTURE = Path(__file__).parent / "data" / "segment-log"
T0 = 1_763_800_000.0


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home), *args],
                          capture_output=True, text=True, cwd=ROOT)


def one_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a refusal: no traceback, naming what it must."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def make_log(root: Path, n: int = 3000) -> Path:
    log = EmbeddedLog(root)
    log.create_topic(TopicSpec("t", 1))
    for start in range(0, n, 500):
        log.append("t", records(start, min(500, n - start)))
    log.close()
    db = root / DB_NAME
    assert not Path(f"{db}-wal").exists()  # closed: everything is in the one file
    return db


def flip(db: Path, at: int, n: int = 1) -> bytes:
    """Invert `n` bytes of the file at `at`; returns the damaged content."""
    data = bytearray(db.read_bytes())
    for i in range(at, at + n):
        data[i] ^= 0xFF
    db.write_bytes(bytes(data))
    return bytes(data)


def flip_value(db: Path, offset: int) -> bytes:
    """Alter one byte inside the stored value of record `offset`."""
    at = db.read_bytes().index(value_of(offset)) + 20
    return flip(db, at)


def lost_offsets(stdout: str) -> set[int]:
    """Offsets named on the `LOST` lines of `log salvage`."""
    out: set[int] = set()
    for line in stdout.splitlines():
        if line.strip().startswith("LOST"):
            span = line.split("]", 1)[1].split(":", 1)[0].strip()
            if span.startswith("@"):
                out.add(int(span[1:]))
            else:
                first, last = span.removeprefix("offsets ").split("-")
                out.update(range(int(first), int(last) + 1))
    return out


# --------------------------------------------------------------------------- damage

def test_a_flipped_value_is_refused_by_readers_and_writers_naming_the_offset(tmp_path: Path) -> None:
    db = make_log(tmp_path / "log")
    damaged = flip_value(db, 1234)
    log = EmbeddedLog(tmp_path / "log")
    assert log.read("t", 0, 0, 1234)[-1].offset == 1233  # what lies before is served
    with pytest.raises(LogCorruptError) as err:
        log.read("t", 0, 1000, 500)
    assert str(db) in str(err.value) and "t[0]@1234" in str(err.value)
    assert "checksum mismatch" in str(err.value)
    with pytest.raises(LogCorruptError, match=r"t\[0\]@1234.*refusing to write"):
        log.append("t", records(3000, 1))
    log.close()
    assert db.read_bytes() == damaged  # nothing truncated, nothing rewritten


def test_a_deleted_record_is_a_named_gap(tmp_path: Path) -> None:
    db = make_log(tmp_path / "log")
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM records WHERE id = (SELECT min(id) FROM records) + 700")
    conn.close()
    with pytest.raises(LogCorruptError, match=r"t\[0\]@700: missing"):
        list(iter_topic(EmbeddedLog(tmp_path / "log"), "t"))
    res = cli(tmp_path, "log", "verify")
    assert res.returncode == 1 and "t[0]@700: missing" in res.stderr


def test_flipped_bytes_mid_file_verify_and_salvage_name_the_exact_losses(tmp_path: Path) -> None:
    """Reproduction 1 (new form): 16 bytes flipped in the middle of the log's file."""
    db = make_log(tmp_path / "log")
    damaged = flip(db, db.stat().st_size // 2, 16)
    with pytest.raises(LogError) as err:
        list(iter_topic(EmbeddedLog(tmp_path / "log"), "t"))
    assert str(db) in str(err.value) and "t[0]" in str(err.value)

    verify = cli(tmp_path, "log", "verify")
    assert verify.returncode == 1 and "Traceback" not in verify.stderr
    assert "t[0]" in verify.stdout and "problem(s)" in verify.stdout

    salvage = cli(tmp_path, "log", "salvage", str(tmp_path / "rescued"))
    assert salvage.returncode == 1, salvage.stderr
    lost = lost_offsets(salvage.stdout)
    assert 0 < len(lost) < 100
    copied = list(iter_topic(EmbeddedLog(tmp_path / "rescued"), "t"))
    assert len(copied) + len(lost) == 3000
    kept = sorted(set(range(3000)) - lost)
    assert [r.value for r in copied] == [value_of(o) for o in kept]  # byte-identical, in order
    assert db.read_bytes() == damaged and db.stat().st_size == len(damaged)


def test_a_page_of_garbage_loses_exactly_the_records_on_it(tmp_path: Path) -> None:
    db = make_log(tmp_path / "log")
    data = bytearray(db.read_bytes())
    size = int.from_bytes(data[16:18], "big")  # the page size, from SQLite's file header
    page = len(data) // 2 // size * size  # a leaf page of records, in the middle
    on_page = {o for o in range(3000) if page <= data.index(value_of(o)) < page + size}
    assert 5 < len(on_page) < 100
    data[page:page + size] = bytes(range(256)) * (size // 256)
    db.write_bytes(bytes(data))
    first = min(on_page)
    with pytest.raises(LogCorruptError, match=rf"t\[0\]@{first}: unreadable: database disk image is malformed"):
        list(iter_topic(EmbeddedLog(tmp_path / "log"), "t"))
    res = cli(tmp_path, "log", "salvage", str(tmp_path / "rescued"))
    assert res.returncode == 1
    assert lost_offsets(res.stdout) == on_page
    kept = [o for o in range(3000) if o not in on_page]
    assert [r.value for r in iter_topic(EmbeddedLog(tmp_path / "rescued"), "t")] == [value_of(o) for o in kept]
    verify = cli(tmp_path, "log", "verify")
    assert verify.returncode == 1
    assert f"t[0] offsets {first}-{max(on_page)}: unreadable" in verify.stderr
    assert db.read_bytes() == bytes(data)


def test_salvage_reports_exactly_the_flipped_record_and_moves_positions(tmp_path: Path) -> None:
    root = tmp_path / "log"
    db = make_log(root)
    log = EmbeddedLog(root)
    log.commit("negotiator", "t", {0: 2000})
    log.close()
    flip_value(db, 1234)
    rescued_home = tmp_path / "rescued"
    res = cli(tmp_path, "log", "salvage", str(rescued_home / "log"))
    assert res.returncode == 1
    assert lost_offsets(res.stdout) == {1234}
    assert "t[0]: copied 2999 of 3000 offsets" in res.stdout
    rescued = EmbeddedLog(rescued_home / "log")
    assert rescued.committed("negotiator", "t") == {0: 1999}  # the same event comes next
    assert rescued.read("t", 0, 1999, 1)[0].value == value_of(2000)
    assert cli(rescued_home, "log", "verify").returncode == 0
    again = cli(tmp_path, "log", "salvage", str(rescued_home / "log"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_userprio_edit_and_readers_refuse_a_damaged_log_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert cli(home, "log", "import", str(write_log(tmp_path / "events.jsonl"))).returncode == 0
    db = home / "log" / DB_NAME
    with EmbeddedLog(home / "log") as log:
        value = log.read("poolledger.events", 0, 5, 1)[0].value
        for name in log.state_names():  # no snapshot: the readers read every record
            log.drop_state(name)
    data = bytearray(db.read_bytes())
    at = data.index(value) + len(value) // 2
    data[at] ^= 0x01  # one bit
    db.write_bytes(bytes(data))
    where = f"{db}: poolledger.events[0]@5: checksum mismatch"
    edit = cli(home, "userprio", "-setfactor", "alice@example.org", "2")
    assert edit.returncode == 1
    one_line(edit, where)
    for args in (["replay"], ["log", "export", str(tmp_path / "out.jsonl")]):
        res = cli(home, *args)
        assert res.returncode == 1
        one_line(res, where)
    info = cli(home, "log", "info")
    assert info.returncode == 1 and where in info.stderr and "Traceback" not in info.stderr
    assert db.read_bytes() == bytes(data)  # nothing appended, truncated or rewritten
    assert not (tmp_path / "out.jsonl").exists()


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path) -> None:
    db = make_log(tmp_path / "log")
    damaged = flip(db, 0, 100)
    with pytest.raises(LogCorruptError, match="file is not a database"):
        EmbeddedLog(tmp_path / "log")
    for args in (["log", "info"], ["log", "verify"]):
        res = cli(tmp_path, *args)
        assert res.returncode == 1
        one_line(res, str(db), "file is not a database")
    assert db.read_bytes() == damaged


# --------------------------------------------------------------------------- crashes

INCOMPLETE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from streams.log.embedded import EmbeddedLog
    from tests.test_embedded_log import records
    log = EmbeddedLog(Path(sys.argv[1]))
    log.conn.execute("PRAGMA cache_size=8")  # spill the open transaction's pages to the WAL
    with log.transaction():
        log.append("t", records(3000, 3000))
        print("inside", flush=True)
        time.sleep(120)
""")


def test_an_append_cut_short_is_discarded_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "log"
    make_log(root)
    proc = subprocess.Popen([sys.executable, "-c", INCOMPLETE, str(root)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline() == "inside\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    res = cli(tmp_path, "log", "verify")
    assert res.returncode == 0, res.stderr
    assert "has not committed" in res.stdout and "0 problem(s)" in res.stdout
    log = EmbeddedLog(root)
    assert log.end_offsets("t") == {0: 3000}
    assert_intact(log, "t", 3000)
    assert [a.offset for a in log.append("t", records(3000, 10))] == list(range(3000, 3010))
    log.close()
    res = cli(tmp_path, "log", "verify")
    assert res.returncode == 0 and "has not committed" not in res.stdout


def test_state_commits_with_positions_or_not_at_all(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic(TopicSpec("t", 1))
    with pytest.raises(RuntimeError):
        with log.transaction():
            log.append("t", records(0, 5))
            log.commit("sink", "t", {0: 5})
            log.put_state("sink", b"checkpoint-5")
            raise RuntimeError("crash before commit")
    assert (log.end_offsets("t"), log.committed("sink", "t"), log.state("sink")) == ({0: 0}, {}, None)
    with log.transaction():
        log.append("t", records(0, 5))
        log.commit("sink", "t", {0: 5})
        log.put_state("sink", b"checkpoint-5")
    other = EmbeddedLog(tmp_path / "log")
    assert (other.end_offsets("t"), other.committed("sink", "t"), other.state("sink")) == \
        ({0: 5}, {0: 5}, b"checkpoint-5")


# --------------------------------------------------------------------------- the CLI's edges

def test_export_to_a_closed_pipe_is_quiet_and_a_bad_path_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lines = [orjson.dumps(make_event(JobStarted(f"{i}.0", "schedd@ap1", "alice@example.org",
                                                f"slot{i}@ep1", 1.0), ts=T0 + i,
                                     source="schedd@ap1", seq=i + 1).to_dict())
             for i in range(3000)]
    (tmp_path / "big.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert cli(home, "log", "import", str(tmp_path / "big.jsonl")).returncode == 0
    res = subprocess.run(f"{sys.executable} -m services.cli --home {home} log export - | head -1",
                         shell=True, capture_output=True, text=True, cwd=ROOT)
    assert res.stderr == ""
    assert json.loads(res.stdout)["type"] == "job.started"
    (tmp_path / "file").write_text("x")
    bad = cli(home, "log", "export", str(tmp_path / "file" / "out.jsonl"))
    assert bad.returncode == 1
    one_line(bad, str(tmp_path / "file" / "out.jsonl"), "Not a directory")


# --------------------------------------------------------------------------- migration

def test_migrate_carries_a_segment_log_over_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURE, home / "log")
    before = {p: p.read_bytes() for p in (home / "log").rglob("*") if p.is_file()}
    with pytest.raises(LogError, match="log migrate"):
        EmbeddedLog(home / "log")
    refused = cli(home, "log", "info")
    assert refused.returncode == 1
    one_line(refused, "segment log", "poolledger log migrate")
    res = cli(home, "log", "migrate")
    assert res.returncode == 0, res.stderr
    assert {p: p.read_bytes() for p in before} == before  # the old files are untouched
    want = json.loads((FIXTURE.parent / "segment-log.expected.json").read_text())
    log = EmbeddedLog(home / "log")
    got = [[r.topic, r.partition, r.offset, None if r.key is None else r.key.hex(), r.value.hex(),
            r.timestamp] for t in log.topics() for r in iter_topic(log, t)]
    assert got == want["records"]
    assert {t: {str(p): o for p, o in log.end_offsets(t).items()} for t in log.topics()} == want["end_offsets"]
    assert {t: log.spec(t).compact for t in log.topics()} == want["compact"]
    for group, topics in want["groups"].items():
        for topic, positions in topics.items():
            assert log.committed(group, topic) == {int(p): o for p, o in positions.items()}
    assert cli(home, "log", "verify").returncode == 0
    again = cli(home, "log", "migrate")
    assert again.returncode == 1 and "already exists" in again.stderr


def segment(home: Path, base: int) -> Path:
    return home / "log" / "topics" / "t" / "0" / f"{base:020d}.log"


@pytest.mark.parametrize("damage, message", [
    ("flip", "t[0] offsets 90-119: CRC mismatch"),
    ("delete", "t[0] offsets 150-179: missing"),
])
def test_migrate_names_damage_by_offset_and_migrates_nothing(tmp_path: Path, damage: str,
                                                             message: str) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURE, home / "log")
    if damage == "flip":
        flip(segment(home, 90), 100)
    else:
        segment(home, 150).unlink()
    res = cli(home, "log", "migrate")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert message in res.stderr and "nothing migrated" in res.stderr
    assert not (home / "log" / DB_NAME).exists()
    assert [p.name for p in (home / "log").iterdir() if p.name.startswith(".")] == []


def test_migrate_reports_an_incomplete_last_write(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURE, home / "log")
    with segment(home, 270).open("ab") as f:
        f.write(b"\x40\x00\x00\x00torn")  # a frame cut short by a killed writer
    res = cli(home, "log", "migrate")
    assert res.returncode == 0, res.stderr
    assert "incomplete last write" in res.stdout
    assert EmbeddedLog(home / "log").end_offsets("t") == {0: 301}
