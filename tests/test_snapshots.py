"""Durable ledger snapshots (streams.snapshot): the runner stores them with its positions, a
query restores the newest usable one at or before the point asked and folds only the tail,
to the same state as a full fold; a stale or corrupt one costs a full fold and ONE warning."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from schemas.events import Envelope
from schemas.settings import Settings, load_settings
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.port import TopicSpec
from streams.log.topics import DERIVED, EVENTS
from streams.replay import Until, replay, replay_log
from streams.runner import GROUP, EmbeddedRunner
from streams.snapshot import FORMAT, SnapshotHeader, SnapshotStore, knobs_digest
from streams.synthetic import mixed_config, mixed_events

ROOT = Path(__file__).resolve().parents[1]
N = 4000


@pytest.fixture(scope="module")
def events() -> list[Envelope]:
    return list(mixed_events(N))


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.conf"
    path.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    return path


def _log(home: Path, events: list[Envelope]) -> EventLog:
    elog = EventLog(EmbeddedLog(home / "log"))
    for topic in (EVENTS, DERIVED):
        elog.log.create_topic(TopicSpec(topic))
    elog.append(EVENTS, events)
    return elog


def _store(elog: EventLog) -> SnapshotStore:
    log = elog.log
    assert isinstance(log, EmbeddedLog)
    return SnapshotStore(log)


def _half_snapshotted(home: Path, events: list[Envelope], settings: Settings
                      ) -> tuple[EventLog, EmbeddedRunner, SnapshotStore, str]:
    """`events` on a new log, folded by the runner (which leaves a snapshot at their end):
    the log, the runner, its snapshot store and the snapshot's name."""
    elog = _log(home, events)
    runner = EmbeddedRunner(elog, settings)
    runner.run_once()
    store = _store(elog)
    return elog, runner, store, store.names()[-1]


def test_runner_snapshots_restore_to_an_identical_ledger(tmp_path: Path, events: list[Envelope],
                                                         config: Path) -> None:
    settings = load_settings(config)
    elog = _log(tmp_path, events)
    runner = EmbeddedRunner(elog, settings, snapshot_every=1000)
    runner.run_once(every=500)
    store = _store(elog)
    names = store.names()
    assert len(names) == store.keep  # one every 1000 events and one at the end, 4 kept
    newest = dict((n, h) for n, h, _ in store.headers())[names[-1]]
    assert newest is not None and newest.events == len(events) and newest.format == FORMAT
    assert newest.positions == {0: len(events)} == elog.log.committed(GROUP, EVENTS)
    assert newest.knobs == knobs_digest(settings)
    found = store.restore(settings)
    assert found.ledger is not None and found.ledger.to_json() == runner.ledger.to_json()
    assert runner.ledger.to_json() == replay(events, settings).to_json()
    # the derived events went out with the snapshots, each exactly once
    derived = [env.id for _rec, env in elog.read(DERIVED)]
    assert len(derived) == len(set(derived)) == runner.ledger.derived_seq


def test_a_query_at_any_point_equals_a_full_fold(tmp_path: Path, events: list[Envelope],
                                                 config: Path) -> None:
    settings = load_settings(config)
    elog = _log(tmp_path, events)
    EmbeddedRunner(elog, settings, snapshot_every=1000).run_once(every=500)
    warnings: list[str] = []
    tail = events[-1].ts
    for until in (None, Until(position=3333), Until(position=N - 1), Until(ts=tail - 600.0)):
        folded = replay_log(elog, settings, until, warn=warnings.append)
        assert folded.from_snapshot
        assert folded.ledger.to_json() == replay(events, settings, until).to_json(), until
    assert replay_log(elog, settings, warn=warnings.append).last_ts == max(e.ts for e in events)
    assert warnings == []
    # before the oldest snapshot kept: a full fold (nothing is wrong: no warning)
    early = replay_log(elog, settings, Until(position=10), warn=warnings.append)
    assert not early.from_snapshot and early.ledger.to_json() == replay(
        events, settings, Until(position=10)).to_json()
    assert warnings == []


def test_the_tail_after_a_snapshot_is_folded(tmp_path: Path, events: list[Envelope],
                                             config: Path) -> None:
    settings = load_settings(config)
    half = len(events) // 2
    elog = _log(tmp_path, events[:half])
    EmbeddedRunner(elog, settings).run_once()
    elog.append(EVENTS, events[half:])
    folded = replay_log(elog, settings, warn=pytest.fail)
    assert folded.from_snapshot
    assert folded.ledger.to_json() == replay(events, settings).to_json()


def test_stale_and_corrupt_snapshots_fall_back_with_one_warning(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    settings = load_settings(config)
    expected = replay(events, settings).to_json()
    elog = _log(tmp_path, events)
    EmbeddedRunner(elog, settings).run_once()
    store = _store(elog)
    name = store.names()[-1]

    def query(s: object, whatif: bool = False) -> list[str]:
        said: list[str] = []
        folded = replay_log(elog, s, warn=said.append, whatif=whatif)  # type: ignore[arg-type]
        assert not folded.from_snapshot
        return said

    other = settings.with_overrides({"PRIORITY_HALFLIFE": "3600"})
    said = query(other)
    assert len(said) == 1 and "folded under other knobs" in said[0]
    assert query(other, whatif=True) == []  # a what-if folds from the start, silently
    # a knob that does not touch the folds keeps the snapshot
    assert replay_log(elog, settings.with_overrides({"POOLLEDGER_LIVE_WINDOW": "60"})).from_snapshot
    # nor does the build's switch, set in the environment as `make build` reads it
    assert replay_log(elog, load_settings(config, env={"POOLLEDGER_COMPILE": "0"})).from_snapshot

    raw = store.log.state(f"{name}.head")
    assert raw is not None
    old = SnapshotHeader.from_json(raw)
    store.log.put_state(f"{name}.head", SnapshotHeader(
        FORMAT + 1, old.knobs, old.topic, old.positions, old.events, old.max_ts).to_json())
    said = query(settings)
    assert len(said) == 1 and f"format version {FORMAT + 1}" in said[0]

    store.log.put_state(f"{name}.head", raw)
    store.log.put_state(f"{name}.body", b'{"knobs": {}, "truncated')
    said = query(settings)
    assert len(said) == 1 and "corrupt" in said[0]

    body = orjson.loads(expected)
    store.log.put_state(f"{name}.body", orjson.dumps(body))
    with store.log.transaction():  # bytes altered on disk behind the log's back
        store.log.conn.execute("UPDATE state SET value = ? WHERE name = ?",
                               (b"{}", f"{name}.body"))
    said = query(settings)
    assert len(said) == 1 and "checksum mismatch" in said[0]
    assert replay_log(elog, settings).ledger.to_json() == expected


def test_userprio_answers_from_the_snapshot_and_warns_once_when_it_cannot(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    home = tmp_path / "h"
    elog = _log(home, events)
    EmbeddedRunner(elog, load_settings(config)).run_once()
    elog.log.close()
    export = tmp_path / "events.jsonl"
    export.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in events))

    def userprio(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                               "--config", str(config), *extra, "userprio", "-all", "--json"],
                              capture_output=True, text=True, cwd=ROOT)

    full = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home), "--config",
                           str(config), "userprio", "-all", "--json", "--log", str(export)],
                          capture_output=True, text=True, cwd=ROOT)
    fast = userprio()
    assert fast.returncode == 0 and fast.stderr == "" and fast.stdout == full.stdout
    stale = userprio("--set", "PRIORITY_HALFLIFE=3600")
    assert stale.returncode == 0
    # a what-if (--set) folds from the start (naming the log's rejected edits) without a warning
    assert "rejected" in stale.stderr and "snapshot" not in stale.stderr
    with EmbeddedLog(home / "log") as log:
        for name in log.state_names():
            log.put_state(name, b"garbage")
    broken = userprio()
    assert broken.returncode == 0 and broken.stdout == full.stdout
    lines = [ln for ln in broken.stderr.splitlines() if "rejected: " not in ln]
    assert len(lines) == 1 and lines[0].startswith("poolledger userprio: warning: snapshot ")
    assert "folding the whole log" in lines[0] and "Traceback" not in broken.stderr


def test_audit_from_a_time_starts_at_a_snapshot_before_it(tmp_path: Path, events: list[Envelope],
                                                          config: Path) -> None:
    home = tmp_path / "h"
    elog = _log(home, events[:N // 2])
    EmbeddedRunner(elog, load_settings(config)).run_once()
    elog.append(EVENTS, events[N // 2:])
    elog.log.close()
    export = tmp_path / "events.jsonl"
    export.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in events))
    t_from = str(events[N // 2 + 200].ts)

    def audit(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                               "--config", str(config), "audit", "alice@example.org",
                               "--from", t_from, *extra],
                              capture_output=True, text=True, cwd=ROOT)

    fast, full = audit(), audit("--log", str(export))
    assert fast.returncode == 0 and "snapshot" not in fast.stderr
    assert "changes" in fast.stdout and fast.stdout == full.stdout


def test_a_snapshot_is_stored_in_sections_and_a_covering_one_parses_only_its_body(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    """userprio must not parse the collector's ads: a snapshot that covers the log restores
    only its body until the pool or the jobs are read; one with a tail to fold parses every
    section at once, so a bad one costs ONE warning and a full fold."""
    settings = load_settings(config)
    half = len(events) // 2
    elog, runner, store, name = _half_snapshotted(tmp_path, events[:half], settings)
    assert {f"{name}.{s}" for s in ("head", "body", "accountant", "limits", "reconcile", "pool",
                                    "jobs", "job_ads", "outcomes", "matches", "running")} == {
        n for n in store.log.state_names() if n.startswith(name)}
    pool = store.log.state(f"{name}.pool")
    assert pool is not None and b'"ads"' in pool
    body = store.log.state(f"{name}.body")
    assert body is not None and {"pool", "jobs", "job_ads", "outcomes", "accountant",
                                 "reconcile"}.isdisjoint(
        orjson.loads(body))
    found = store.restore(settings)
    assert found.ledger is not None and found.ledger._unparsed is not None  # not parsed yet
    assert found.ledger.priorities() == runner.ledger.priorities()
    assert found.ledger._unparsed is not None  # userprio's reads parsed nothing more
    assert found.ledger.to_snapshot() == runner.ledger.to_snapshot()  # parsed when read
    assert found.ledger._unparsed is None
    # a restored ledger writes its unparsed sections back byte for byte
    again = store.restore(settings).ledger
    assert again is not None and again.to_sections() == runner.ledger.to_sections()

    elog.append(EVENTS, events[half:])
    folded = replay_log(elog, settings, warn=pytest.fail)
    assert folded.from_snapshot  # with a tail: every section parsed in `restore`
    assert folded.ledger.to_json() == replay(events, settings).to_json()
    store.log.put_state(f"{name}.pool", b'{"ads": {"truncated')  # a valid checksum, bad JSON
    said: list[str] = []
    folded = replay_log(elog, settings, warn=said.append)
    assert not folded.from_snapshot
    assert len(said) == 1 and "corrupt" in said[0] and "folding the whole log" in said[0]
    assert folded.ledger.to_json() == replay(events, settings).to_json()


def test_userprio_reads_leave_the_match_records_and_running_jobs_unparsed(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    """At 200,000 slots the accountant's per-slot match records and the limits' running jobs
    were most of what `userprio` parsed (bench/scale.py): they are sections of their own,
    which none of userprio's reads parses; the whole accountant or limits, or a fold, parses
    them, and the ledger then folds on exactly as one that never was snapshotted."""
    settings = load_settings(config)
    half = len(events) // 2
    elog, runner, store, name = _half_snapshotted(tmp_path, events[:half], settings)
    rows = {s: store.log.state(f"{name}.{s}") for s in ("accountant", "limits", "matches",
                                                        "running")}
    matches, running = orjson.loads(rows["matches"] or b""), orjson.loads(rows["running"] or b"")
    assert matches and running  # jobs run at the half: both sections hold records
    assert set(orjson.loads(rows["accountant"] or b"")) == {"Accountant", "Customers"}
    assert set(orjson.loads(rows["limits"] or b"")) == {"in_use", "announced", "overrides"}

    found = store.restore(settings)
    led, saved = found.ledger, runner.ledger
    assert led is not None and led._unparsed is not None
    now = saved.now
    assert led.priorities(now, all_groups=True) == saved.priorities(now, all_groups=True)
    assert not led.quotas_computed_now() and led.group_quotas() == saved.group_quotas()
    assert led.limits_view() == saved.limits_view() and led.limits_view()
    assert led.last_priority_update == saved.last_priority_update
    user = next(iter(matches.values()))["RemoteUser"]
    assert led.submitter(user) == saved.submitter(user) is not None
    assert now is not None and led.priority_at(user, now) == saved.priority_at(user, now)
    assert led._unparsed is not None  # userprio's reads parsed neither section
    assert not led._accountant.resources and not led._limits.running

    assert led.accountant.resources.keys() == matches.keys()  # parsed on first use
    assert led._unparsed is None and led.limits.running == running
    assert led.to_json() == saved.to_json()
    lazy = store.restore(settings).ledger
    assert lazy is not None and lazy._unparsed is not None
    assert replay(events[half:], settings, ledger=lazy, first=half).to_json() == replay(
        events, settings).to_json()


def _cli(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                           "--config", str(config), *args], capture_output=True, text=True, cwd=ROOT)


def test_log_import_leaves_a_snapshot_at_the_end(tmp_path: Path, events: list[Envelope],
                                                 config: Path) -> None:
    export = tmp_path / "events.jsonl"
    export.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in events))
    home = tmp_path / "h"
    res = _cli(home, config, "log", "import", str(export))
    n = len(events)
    assert res.returncode == 0 and f"imported {n} events" in res.stdout, res.stderr
    settings = load_settings(config)
    refused = replay(events, settings).rejected
    assert refused and f"{refused} refused by the ledger, dead-lettered" in res.stdout
    assert res.stderr.count("dead-lettered poolledger.events[0]@") == refused
    with EmbeddedLog(home / "log") as log:
        store = SnapshotStore(log)
        heads = [h for _n, h, _p in store.headers()]
        assert heads and heads[0] is not None and heads[0].positions == {0: n}
        assert heads[0].events == n and heads[0].knobs == knobs_digest(settings)
        found = store.restore(settings)
        assert found.ledger is not None
        assert found.ledger.to_json() == replay(events, settings).to_json()
        assert log.end_offsets(DERIVED).get(0, 0) == 0  # derived events are `run`'s to write
    fast = _cli(home, config, "userprio", "-all", "--json")
    full = _cli(home, config, "userprio", "-all", "--json", "--log", str(export))
    assert fast.returncode == 0 and fast.stderr == "" and fast.stdout == full.stdout


def test_a_query_reads_no_large_row_userprio_does_not_need(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    """Reading the large rows was most of userprio's time at 200,000 slots (bench/scale.py):
    a query reads only those it names. With every large row of the snapshot damaged,
    userprio still answers as a full fold does, without a warning; `status`, which names the
    pool, warns once naming the damaged row and answers from a full fold; a service's
    restore (no `needs`) reads every row and refuses the snapshot, to fold the whole log."""
    export = tmp_path / "events.jsonl"
    export.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in events))
    home = tmp_path / "h"
    assert _cli(home, config, "log", "import", str(export)).returncode == 0
    full = _cli(home, config, "userprio", "-all", "--json", "--log", str(export))
    large = ("pool", "jobs", "job_ads", "outcomes", "matches", "running")
    with EmbeddedLog(home / "log") as log, log.transaction():
        name = SnapshotStore(log).names()[-1]
        for section in large:
            log.conn.execute("UPDATE state SET crc = crc + 1 WHERE name = ?",
                             (f"{name}.{section}",))
    fast = _cli(home, config, "userprio", "-all", "--json")
    assert fast.returncode == 0 and fast.stderr == "" and fast.stdout == full.stdout
    status = _cli(home, config, "status")
    folded = _cli(home, config, "status", "--log", str(export))
    assert status.returncode == 0 and status.stdout == folded.stdout != ""
    warning, rest = status.stderr.split("\n", 1)
    assert warning.startswith("poolledger status: warning: ") and rest == folded.stderr
    assert f"{name}.pool" in warning and "checksum mismatch" in warning
    with EmbeddedLog(home / "log") as log:
        found = SnapshotStore(log).restore(load_settings(config))
    assert found.ledger is None and found.problem is not None and "corrupt" in found.problem


def test_a_long_log_without_a_snapshot_warns_once_naming_the_command(
        tmp_path: Path, events: list[Envelope], config: Path) -> None:
    settings = load_settings(config)
    home = tmp_path / "h"
    elog = _log(home, events)
    said: list[str] = []
    n = len(events)
    folded = replay_log(elog, settings, warn=said.append, many=n)
    assert not folded.from_snapshot and len(said) == 1
    assert f"{n:,} events and no snapshot" in said[0] and "`poolledger log snapshot`" in said[0]
    # a shorter log, a point in the past and a what-if say nothing
    for kwargs in ({"many": n + 1}, {"until": Until(position=10), "many": n},
                   {"whatif": True, "many": n}):
        quiet: list[str] = []
        replay_log(elog, settings, warn=quiet.append, **kwargs)  # type: ignore[arg-type]
        assert quiet == [], kwargs
    elog.log.close()
    res = _cli(home, config, "log", "snapshot")
    assert res.returncode == 0 and f"snapshot stored at {EVENTS}@{n}" in res.stdout, res.stderr
    elog = EventLog(EmbeddedLog(home / "log"))
    folded = replay_log(elog, settings, warn=pytest.fail, many=n)
    assert folded.from_snapshot and folded.ledger.to_json() == replay(events, settings).to_json()
    elog.log.close()
    missing = _cli(tmp_path / "none", config, "log", "snapshot")
    assert missing.returncode == 1 and "no log in" in missing.stderr
    assert not (tmp_path / "none").exists()
