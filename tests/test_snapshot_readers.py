"""The readers that start from a snapshot (issue 11) answer as a fold from the log's start does:
`poolledger why` (the ledger's job-outcome fold carries each queued job's life to the snapshot,
`why` reads only the events after it) and the negotiator daemon (its ledger, last cycle and
cycle statistics resumed from the snapshot: the same next cycle, byte for byte)."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from schemas.events import Envelope, decode
from schemas.settings import load_settings
from services.cli import main
from services.negotiator.daemon import NegotiatorDaemon
from streams.core.ledger import Ledger
from streams.log.embedded import EmbeddedLog
from streams.log.lease import FileLease
from streams.log.events import EventLog, ensure_topics
from streams.log.topics import EVENTS
from streams.replay import replay
from streams.runner import EmbeddedRunner
from tests.e2e.helpers import batch, machines, run


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings here and the CLI's are both the defaults plus this environment."""
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Jobs no slot takes, jobs a concurrency limit holds back, short jobs that leave the queue
    and come back as others run, on three slots for two hours; exported as .jsonl."""
    home = tmp_path_factory.mktemp("whysnap")
    doc = {"config": {"XSW_LIMIT": 1},
           "machines": machines(3),
           "submitters": [
               {"user": "alice", "jobs": [batch(1, "3h", requirements="TARGET.Memory > 100000000"),
                                          batch(3, "3h", at="1m", concurrency_limits="xsw"),
                                          batch(6, "20m", at="2m")]},
               {"user": "bob", "jobs": [batch(5, "30m", at="5m"), batch(4, "15m", at="50m")]}]}
    run(home, doc, hours=2)
    path = home / "events.jsonl"
    assert main(["--home", str(home), "log", "export", str(path)]) == 0
    return path


def _why(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _home_with_snapshot_at(home: Path, events: list[Envelope], cut: int) -> int:
    """A log of `events` whose newest snapshot covers the first `cut`; the events topic's
    partition id (records are `id << 40 | offset`)."""
    log = EmbeddedLog(home / "log")
    ensure_topics(log)
    elog = EventLog(log)
    elog.append(EVENTS, events[:cut])
    EmbeddedRunner(elog, load_settings(), derived_topic=None).run_once()
    elog.append(EVENTS, events[cut:])
    pid = log.conn.execute("SELECT p.id FROM partitions p JOIN topics t ON p.topic = t.id "
                           "WHERE t.name = ?", (EVENTS,)).fetchone()[0]
    log.close()
    return int(pid)


def test_why_answers_from_the_snapshot_reading_only_the_tail(
        export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [decode(line) for line in export.read_bytes().splitlines() if line.strip()]
    ids = list(dict.fromkeys(e.data.job_id for e in events if e.type == "job.submitted"))
    cycles = [i for i, e in enumerate(events) if e.type == "negotiation.cycle"]
    settings = load_settings()
    full = {j: _why(capsys, "--home", str(tmp_path / "none"), "why", j, "--log", str(export))
            for j in ids}
    assert all(rc == 0 for rc, _o, _e in full.values())
    idle_at_cut = 0
    for cut in (cycles[len(cycles) // 3] + 1, cycles[2 * len(cycles) // 3] + 5):
        home = tmp_path / f"cut{cut}"
        pid = _home_with_snapshot_at(home, events, cut)
        # every record before the snapshot, but the first (the log's start time), is damaged:
        # a read of any of them would stop `why` with the damaged offset named
        with EmbeddedLog(home / "log") as log, log.transaction():
            log.conn.execute("UPDATE records SET value = ? WHERE id > ? AND id < ?",
                             (b"garbage", pid << 40, (pid << 40) | cut))
        at_cut = replay(events[:cut], settings)
        queued = [j for j in ids if at_cut.job_outcomes(j)]
        assert len(queued) >= 5
        for j in queued:
            rec = at_cut.job_outcomes(j)[0][1]
            idle_at_cut += rec.status == "idle" and rec.cycles > 0
            rc, out, err = _why(capsys, "--home", str(home), "why", j)
            assert (rc, out) == full[j][:2], (cut, j)
            # the answer's records were never read, yet it says once that they are damaged
            # (issue 28, item 14: this answer used to be silent)
            assert err.startswith(f"poolledger why: warning: the log is damaged at {EVENTS}[0]@1: ")
            assert err.count("\n") == 1
        # a job that left the queue before the snapshot is answered from the whole log: here
        # the damaged records are named, on a sound copy the answer is the same
        left = next(j for j in ids if j not in queued and any(
            e.type == "job.submitted" and e.data.job_id == j for e in events[:cut]))
        rc, out, err = _why(capsys, "--home", str(home), "why", left)
        assert rc == 1 and out == "" and "Traceback" not in err and f"{EVENTS}[0]@1" in err
        sound = tmp_path / f"sound{cut}"
        _home_with_snapshot_at(sound, events, cut)
        for j in ids:
            assert _why(capsys, "--home", str(sound), "why", j) == full[j], (cut, j)
    assert idle_at_cut >= 2  # cycles counted before the snapshot, carried by the fold


def test_the_outcome_fold_restored_midway_equals_a_full_fold(export: Path) -> None:
    """The fold's state (in the snapshot) round-trips, and folding on from a restored ledger
    gives every job the life a fold from the start gives it."""
    events = [decode(line) for line in export.read_bytes().splitlines() if line.strip()]
    settings = load_settings()
    ids = sorted({e.data.job_id for e in events if e.type == "job.submitted"})
    whole = replay(events, settings)
    for cut in (len(events) // 4, len(events) // 2, 3 * len(events) // 4):
        half = replay(events[:cut], settings)
        restored = Ledger.from_snapshot(settings, half.to_snapshot())
        assert restored.to_snapshot() == half.to_snapshot()
        on = replay(events[cut:], settings, ledger=restored)
        assert on.to_snapshot() == whole.to_snapshot(), cut
        assert all(on.job_outcomes(j) == whole.job_outcomes(j) for j in ids)
    body = orjson.loads(whole.to_snapshot())
    assert body["outcomes"]["n"] == sum(e.type == "negotiation.cycle" for e in events)


NEGOTIATOR = "negotiator@cm.example.org"


def _daemon(home: Path, warn: list[str] | None = None) -> NegotiatorDaemon:
    return NegotiatorDaemon(EmbeddedLog(home / "log"), load_settings(),
                            FileLease(home / "lease"), name=NEGOTIATOR, record_durations=False,
                            warn=None if warn is None else warn.append)


@pytest.mark.parametrize("before_end", [0.33, 3])
def test_the_negotiator_resumes_from_a_snapshot_as_if_it_had_folded_the_log(
        export: Path, tmp_path: Path, before_end: float) -> None:
    """The pool's events (the run's own negotiator's left out) with a negotiator daemon's
    cycles between them, and a snapshot a third of the pool's events, or 3 of them, before the
    end (3: its last
    cycles' statistics come from the snapshot, not from cycles in the tail): a daemon started
    on that log resumes from the snapshot and reaches the state, and writes the next cycle,
    of one that folded the log from its start."""
    pool = [e for e in (decode(line) for line in export.read_bytes().splitlines() if line.strip())
            if not e.source.startswith("negotiator")]
    home = tmp_path / "log"
    (home / "log").mkdir(parents=True)
    ensure_topics(EmbeddedLog(home / "log"))
    active = _daemon(home)
    elog = active.elog
    cut = len(pool) - int(before_end if before_end >= 1 else before_end * len(pool))
    for i, env in enumerate(pool):
        elog.append(EVENTS, [env])
        active.follow()
        due = active.due()
        if due is not None:
            active.negotiate(due)
        if i == cut:
            EmbeddedRunner(elog, load_settings(), derived_topic=None).run_once()
    assert active.last_cycle > 20
    active.log.close()
    full_home, snap_home = tmp_path / "full", tmp_path / "snap"
    for dest in (full_home, snap_home):
        (dest / "log").mkdir(parents=True)
        for f in (home / "log").iterdir():
            (dest / "log" / f.name).write_bytes(f.read_bytes())
    with EmbeddedLog(full_home / "log") as log:
        for name in log.state_names():
            log.drop_state(name)
    full, said = _daemon(full_home), list[str]()
    resumed = _daemon(snap_home, said)
    assert full.positions == {0: 0} and said == []
    assert 0 < resumed.positions[0] < resumed.log.end_offsets(EVENTS)[0]
    assert 0 < resumed.last_cycle <= active.last_cycle
    assert full.follow() > resumed.follow()
    assert resumed.ledger.to_snapshot() == full.ledger.to_snapshot()
    assert (resumed.positions, resumed.event_time, resumed.last_cycle, resumed.next_due,
            resumed.seq) == (full.positions, full.event_time, full.last_cycle, full.next_due,
                             full.seq)
    assert resumed.ads is not None and full.ads is not None
    assert list(resumed.ads.cycles) == list(full.ads.cycles) and len(full.ads.cycles) == 3
    assert resumed.ads.start_time == full.ads.start_time
    assert full.event_time is not None
    now = full.event_time + 3600.0
    assert full.negotiate(now) and resumed.negotiate(now)
    written = [[r.value for r in d.log.read(EVENTS, 0, d.positions[0] - 40, 100)]
               for d in (full, resumed)]
    assert written[0] == written[1]
    for d in (full, resumed):
        d.log.close()
    # a snapshot it cannot use: one warning, and the fold from the start
    with EmbeddedLog(snap_home / "log") as log:
        for name in log.state_names():
            if name.endswith(".body"):
                log.put_state(name, b"{}")
    said.clear()
    again = _daemon(snap_home, said)
    assert again.positions == {0: 0} and len(said) == 1 and "corrupt" in said[0]
    again.log.close()


def test_gangliad_once_starts_from_the_snapshot(export: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`gangliad --once --dry-run` publishes the view at the log's end: from a snapshot whose
    records before it are damaged (so never read), the same metrics as a fold of the whole
    log; `--openmetrics` (like Graphite) wants every interval, so it reads the log from its
    start."""
    events = [decode(line) for line in export.read_bytes().splitlines() if line.strip()]
    cut = 2 * len(events) // 3
    home, sound = tmp_path / "snap", tmp_path / "sound"
    pid = _home_with_snapshot_at(home, events, cut)
    with EmbeddedLog(home / "log") as log, log.transaction():
        log.conn.execute("UPDATE records SET value = ? WHERE id >= ? AND id < ?",
                         (b"garbage", pid << 40, (pid << 40) | cut))
    with EmbeddedLog(sound / "log") as log:
        ensure_topics(log)
        EventLog(log).append(EVENTS, events)
    full = _why(capsys, "--home", str(sound), "gangliad", "--once", "--dry-run")
    fast = _why(capsys, "--home", str(home), "gangliad", "--once", "--dry-run")
    assert full[0] == fast[0] == 0 and "noop mode: publishing" in full[1]
    assert fast[1] == full[1] and "folding the whole log" not in fast[2]  # the snapshot's
    # answer, which says once that the records under it are damaged (issue 28, item 14)
    assert fast[2].count("\n") == 1 and f"the log is damaged at {EVENTS}[0]@0: " in fast[2]
    rc, _out, err = _why(capsys, "--home", str(home), "gangliad", "--once", "--openmetrics",
                         str(tmp_path / "pool.om"))
    assert rc != 0 and f"{EVENTS}[0]@0" in err and "Traceback" not in err
