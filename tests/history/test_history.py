"""The DuckDB history database over a real run of the groups scenario (seed 000's half-pool
power failure), on the embedded log, through the CLI as a user runs it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import matplotlib.pyplot as plt
import orjson
import pytest

from adstash.history import HistoryVersionError, connect
from adstash.history.db import default_path
from adstash.history.query import history, translate
from schemas.classads import ad_from_json, compile_expr
from services.cli import main
from streams.log.events import EventLog, open_log
from streams.log.topics import DERIVED, EVENTS

ROOT = Path(__file__).resolve().parents[2]
START = 1763800000.0  # the scenario's start (event time)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("groups")
    assert main(["run", "groups", "--out", str(out), "--quiet"]) == 0
    return out


def _events(home: Path, topic: str = EVENTS) -> list:
    log = open_log(None, home)
    try:
        return [env for _rec, env in EventLog(log).read(topic)]
    finally:
        log.close()


def test_run_leaves_a_database_whose_jobs_are_the_logs_job_history(run_dir: Path) -> None:
    ids = [e.id for e in _events(run_dir) if e.type == "job.history"]
    assert len(ids) > 500
    con = connect(home=run_dir)
    rows = [r[0] for r in con.execute("SELECT event_id FROM jobs").fetchall()]
    assert len(rows) == len(ids)
    assert sorted(rows) == sorted(ids)
    gids = {e.data.ad["GlobalJobId"] for e in _events(run_dir) if e.type == "job.history"}
    assert {r[0] for r in con.execute("SELECT GlobalJobId FROM jobs").fetchall()} == gids
    con.close()


def test_usage_from_history_equals_the_accountants(run_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--home", str(run_dir), "userprio", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    accounted = {s["Name"]: s for s in doc["Submitters"] if s["AccumulatedUsage"]}
    con = connect(home=run_dir)
    usage = {n: (u, w) for n, u, w in con.execute(
        "SELECT submitter, usage_seconds, weighted_usage_seconds FROM submitter_usage").fetchall()}
    con.close()
    assert set(usage) == set(accounted) and len(usage) == 3
    for name, rec in accounted.items():
        u, w = usage[name]
        assert u == pytest.approx(rec["AccumulatedUsage"], rel=1e-6)
        assert w == pytest.approx(rec["WeightedAccumulatedUsage"], rel=1e-6)



def test_core_hours_days_are_utc_calendar_days(run_dir: Path) -> None:
    """Each day is a UTC midnight, the core-hours of the run are all there (split over the
    days, not moved), and every finished job is counted on its day of completion. (Before
    issue 26 this compared with the whole job on its completion day: the issue names that
    wrong.)"""
    con = connect(home=run_dir)
    con.execute("SET TimeZone = 'UTC'")
    got = con.execute("SELECT day, submitter, sum(jobs), sum(core_hours) FROM core_hours "
                      "GROUP BY ALL ORDER BY ALL").fetchall()
    total = dict(con.execute(
        "SELECT submitter, sum(RemoteWallClockTime * coalesce(CpusProvisioned, RequestCpus, 1)) "
        "/ 3600 FROM jobs WHERE CompletionDate > 0 GROUP BY ALL").fetchall())
    completed = dict(con.execute(
        "SELECT (submitter, completion_day), count(*) FROM jobs WHERE CompletionDate > 0 "
        "GROUP BY ALL").fetchall())
    con.close()
    assert all(day.hour == day.minute == day.second == 0 for day, *_ in got)
    assert {n for _, n, _, _ in got} == set(total)
    for name, hours in total.items():
        assert sum(h for _, n, _, h in got if n == name) == pytest.approx(hours, rel=1e-9)
    assert {(n, d): j for d, n, j, _ in got if j} == completed
    assert len({r[0] for r in got}) == 2  # the scenario's jobs run on two days


def _history_db(tmp_path: Path, ads: list[dict[str, Any]]) -> Any:
    """A history database holding `ads` as job.history events, through the sink."""
    from adstash.history.target import catch_up
    from schemas.events import JobHistory, make_event
    from streams.log.topics import ensure_topics

    log = open_log(None, tmp_path)
    ensure_topics(log)
    EventLog(log).append(EVENTS, [make_event(JobHistory(ad), ts=float(ad["CompletionDate"]),
                                             source="schedd@ap1", seq=i + 1)
                                  for i, ad in enumerate(ads)])
    db = tmp_path / "h.duckdb"
    catch_up(log, db)
    log.close()
    con = connect(db)
    con.execute("SET TimeZone = 'UTC'")
    return con


MIDNIGHT = 1763856000  # 2025-11-23 00:00:00 UTC


def _job(proc: int, owner: str, **attrs: Any) -> dict[str, Any]:
    return {"GlobalJobId": f"ap1#9.{proc}#1763800000", "ClusterId": 9, "ProcId": proc,
            "Owner": owner, "User": f"{owner}@example.org", "JobStatus": 4, **attrs}


def test_core_hours_split_a_job_over_the_days_it_ran(tmp_path: Path) -> None:
    """By hand: alice's 2-core job ran 22:00-02:00 across midnight: 2 h x 2 cores = 4
    core-hours on each day, and it completed on the second. bob's 1-core job was evicted
    after an hour (its first run in the 31 h from 18:00 two days before to 01:00), then ran
    01:00-03:00 and completed: 2 core-hours on the last day plus the earlier hour shared by
    overlap, 6/31 h, 24/31 h and 1/31 h."""
    con = _history_db(tmp_path, [
        _job(0, "alice", JobStartDate=MIDNIGHT - 7200, JobCurrentStartDate=MIDNIGHT - 7200,
             CompletionDate=MIDNIGHT + 7200, RemoteWallClockTime=14400.0, RequestCpus=2),
        _job(1, "bob", JobStartDate=MIDNIGHT - 30 * 3600, JobCurrentStartDate=MIDNIGHT + 3600,
             CompletionDate=MIDNIGHT + 3 * 3600, RemoteWallClockTime=3 * 3600.0,
             RequestCpus=1)])
    got = {(int(day.timestamp()) - MIDNIGHT) // 86400: (name, jobs, hours) for day, name, jobs, hours
           in con.execute("SELECT day, submitter, jobs, core_hours FROM core_hours "
                          "WHERE submitter = 'alice@example.org'").fetchall()}
    bob = {(int(day.timestamp()) - MIDNIGHT) // 86400: (jobs, hours) for day, jobs, hours
           in con.execute("SELECT day, jobs, core_hours FROM core_hours "
                          "WHERE submitter = 'bob@example.org'").fetchall()}
    con.close()
    assert got == {-1: ("alice@example.org", 0, pytest.approx(4.0)),
                   0: ("alice@example.org", 1, pytest.approx(4.0))}
    assert bob == {-2: (0, pytest.approx(6 / 31)), -1: (0, pytest.approx(24 / 31)),
                   0: (1, pytest.approx(2 + 1 / 31))}


def test_cpu_efficiency_is_htcondors_and_null_without_cpu_times(tmp_path: Path) -> None:
    """(CumulativeRemoteUserCpu + CumulativeRemoteSysCpu) / ((RemoteWallClockTime -
    CumulativeSuspensionTime) x cores): a 2-core job running 2 h of its 2.5 h wall (0.5 h
    suspended) with 3 h user and 0.6 h system CPU over all attempts is 0.9 efficient; an ad
    with only RemoteUserCpu (the last attempt) falls back to it; a submitter whose ads carry
    no CPU time has no efficiency (NULL), not 0."""
    day_end = MIDNIGHT + 20 * 3600
    con = _history_db(tmp_path, [
        _job(0, "alice", CompletionDate=day_end, RemoteWallClockTime=9000.0, RequestCpus=2,
             CumulativeSuspensionTime=1800, CumulativeRemoteUserCpu=10800.0,
             CumulativeRemoteSysCpu=2160.0, RemoteUserCpu=5000.0, RemoteSysCpu=100.0),
        _job(1, "bob", CompletionDate=day_end, RemoteWallClockTime=3600.0, RequestCpus=1,
             RemoteUserCpu=1800.0),
        _job(2, "carol", CompletionDate=day_end, RemoteWallClockTime=3600.0, RequestCpus=1)])
    got = dict(con.execute("SELECT submitter, efficiency FROM cpu_efficiency").fetchall())
    con.close()
    assert got == {"alice@example.org": pytest.approx(0.9), "bob@example.org": pytest.approx(0.5),
                   "carol@example.org": None}


def test_cpu_efficiency_of_the_groups_run_is_its_scenarios(run_dir: Path) -> None:
    """The groups scenario's job types report CPU time (cpu_efficiency 0.95, 0.85, 0.6):
    the view gives each submitter its own, evicted runs of the outage included."""
    con = connect(home=run_dir)
    rows = con.execute("SELECT submitter, sum(jobs), min(efficiency), max(efficiency) "
                       "FROM cpu_efficiency GROUP BY ALL ORDER BY ALL").fetchall()
    con.close()
    want = {"group_chemistry.curie@example.org": 0.6, "group_physics.bohr@example.org": 0.85,
            "group_physics.einstein@example.org": 0.95}
    assert [r[0] for r in rows] == sorted(want)
    for name, jobs, low, high in rows:
        assert jobs > 50 and low == pytest.approx(want[name]) and high == pytest.approx(want[name])


def test_pool_history_shows_the_half_pool_outage(run_dir: Path) -> None:
    con = connect(home=run_dir)
    total = dict(con.execute("SELECT ts, sum(slots) FROM pool_history(3600) GROUP BY ts").fetchall())
    claimed = dict(con.execute("SELECT ts, sum(slots) FROM pool_history(3600) WHERE state = "
                               "'Claimed' GROUP BY ts").fetchall())
    con.close()
    hour = lambda h: int(START // 3600 * 3600 + h * 3600)  # noqa: E731
    for h in (2, 6, 11):  # before the switch-off at 12h: all 30 slots
        assert total[hour(h)] == 30
    for h in (13, 15, 17):  # the five machines (15 slots) are gone until 18h
        assert total[hour(h)] == 15
        assert claimed[hour(h)] <= 15
    for h in (19, 22):
        assert total[hour(h)] == 30
    assert claimed[hour(6)] >= 28


def test_machine_states_record_the_switch_off(run_dir: Path) -> None:
    con = connect(home=run_dir)
    gone = con.execute("SELECT DISTINCT machine FROM machine_states WHERE state = 'Gone'").fetchall()
    con.close()
    assert sorted(m for (m,) in gone) == [f"node{n:02d}.example.org" for n in (6, 7, 8, 9, 10)]


@pytest.mark.parametrize("constraint", [
    'Owner == "CURIE"',
    'Owner =?= "curie" && RemoteWallClockTime > 3000',
    '!(Owner == "einstein") || ClusterId == 1 && ProcId < 10',
    'RequestGpus > 0 || JobStatus == 4 && ExitBySignal == false',
    'regexp("^ein", Owner)',  # outside the translated grammar: classad2 on every ad
    'NumJobStarts >= 1 && ClusterId != 2.0',
])
def test_constraint_answers_are_classad2s(run_dir: Path, constraint: str) -> None:
    con = connect(home=run_dir)
    got = [ad["GlobalJobId"] for ad in history(con, constraint=constraint)]
    expr = compile_expr(constraint)
    want = [orjson.loads(t)["GlobalJobId"] for (t,) in con.execute(
        "SELECT ad FROM jobs ORDER BY ts DESC, log_partition DESC, log_offset DESC").fetchall()
        if expr.eval(scope=ad_from_json(orjson.loads(t))) is True]
    con.close()
    assert got == want
    assert want  # each constraint selects something
    if "regexp" not in constraint:
        assert translate(constraint).where is not None


def test_history_cli_default_columns_limit_and_af(run_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--home", str(run_dir), "history", "-limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " ID     OWNER          SUBMITTED   RUN_TIME     ST COMPLETED   CMD"
    assert len(lines) == 4 and " C  " in lines[1] and lines[1].endswith("/bin/sleep")
    assert main(["--home", str(run_dir), "history", "curie", "-af", "Owner", "JobStatus",
                 "-limit", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["curie 4", "curie 4"]
    assert main(["--home", str(run_dir), "history", "-constraint", "ClusterId == 2",
                 "-limit", "1", "--json"]) == 0
    ads = json.loads(capsys.readouterr().out)
    assert len(ads) == 1 and ads[0]["ClusterId"] == 2


def test_bad_input_is_one_line_exit_2(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    for argv, culprit in ((["history", "-constraint", "Owner == "], "-constraint"),
                          (["sql", "SELEC * FROM jobs"], "SELEC"),
                          (["sql", "SELECT nope FROM jobs"], "nope")):
        assert main(["--home", str(run_dir), *argv]) == 2
        cap = capsys.readouterr()
        assert cap.out == ""
        assert len(cap.err.strip().splitlines()) == 1 and culprit in cap.err


def test_other_schema_version_is_refused_then_rebuilt(run_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    shutil.copytree(run_dir / "log", home / "log")
    db = default_path(home)
    assert main(["--home", str(home), "history", "update"]) == 0
    con = duckdb.connect(str(db))
    con.execute("UPDATE schema_info SET version = 99")
    con.close()
    with pytest.raises(HistoryVersionError, match="rebuild"):
        connect(db)
    capsys.readouterr()
    assert main(["--home", str(home), "history", "-limit", "1"]) == 1
    err = capsys.readouterr().err
    assert "version 99" in err and "poolledger history rebuild" in err and len(err.splitlines()) == 1
    assert main(["--home", str(home), "history", "rebuild"]) == 0
    con = connect(db)
    assert con.execute("SELECT count(*) FROM jobs").fetchall()[0][0] > 500
    con.close()


def _counts(db: Path) -> dict[str, tuple[int, int]]:
    con = connect(db)
    out = {t: tuple(con.execute(f"SELECT count(*), count(DISTINCT event_id) FROM {t}").fetchall()[0])
           for t in ("jobs", "job_runs", "matches", "cycles", "priorities", "slot_updates")}
    con.close()
    return out  # type: ignore[return-value]


def test_kill_9_mid_ingest_then_restart_no_duplicate_no_missing(run_dir: Path,
                                                                 tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(run_dir / "log", home / "log")
    db = default_path(home)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "--home", str(home),
                             "history", "update", "--batch", "40"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # batches are going in once DuckDB's write-ahead log grows past the schema's creation
    wal = db.with_name(db.name + ".wal")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if wal.exists() and wal.stat().st_size > 400_000:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    events = _events(home)
    derived = _events(home, DERIVED)
    con = connect(db)
    done = sum(n for (n,) in con.execute("SELECT next_offset FROM positions").fetchall())
    con.close()
    assert 0 < done < len(events) + len(derived), "the kill did not land mid-ingest"
    assert main(["--home", str(home), "history", "update"]) == 0
    counts = _counts(db)
    for table, n in counts.items():
        assert n[0] == n[1], f"{table}: duplicate rows"
    by_type = {t: sum(1 for e in events if e.type == t) for t in
               ("job.history", "match", "negotiation.cycle")}
    assert counts["jobs"][0] == by_type["job.history"]
    assert counts["matches"][0] == by_type["match"]
    assert counts["cycles"][0] == by_type["negotiation.cycle"]
    assert counts["job_runs"][0] == sum(1 for e in events if e.type in ("job.started", "job.stopped"))
    assert counts["priorities"][0] == sum(1 for e in derived if e.type == "priority.changed")
    assert counts["slot_updates"][0] == sum(
        1 for e in events if e.type in ("ad.updated", "ad.invalidated")
        and e.data.ad_type == "Machine")


def test_parquet_export_is_hive_partitioned_and_incremental(run_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    out = tmp_path / "pq"
    assert main(["--home", str(run_dir), "history", "export", "--parquet", str(out)]) == 0
    days = sorted(p.name for p in (out / "jobs").iterdir())
    assert days == ["day=2025-11-22", "day=2025-11-23"]
    con = connect(home=run_dir)
    n_jobs = con.execute("SELECT count(*) FROM jobs").fetchall()[0][0]
    con.close()
    mem = duckdb.connect()
    got = mem.execute(f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet("
                      f"'{out}/jobs/*/*.parquet', hive_partitioning = true)").fetchall()[0]
    assert got == (n_jobs, n_jobs)
    assert len(pd.read_parquet(out / "jobs")) == n_jobs  # pyarrow reads the hive layout too
    files = sorted(out.rglob("*.parquet"))
    capsys.readouterr()
    assert main(["--home", str(run_dir), "history", "export", "--parquet", str(out)]) == 0
    assert "jobs 0" in capsys.readouterr().out
    assert sorted(out.rglob("*.parquet")) == files


def test_report_and_stats(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["--home", str(run_dir), "report", "--out", str(out)]) == 0
    for name in ("core_hours.png", "pool.png", "wait_times.png", "group_quota.png"):
        assert (out / name).stat().st_size > 10_000
    summary = (out / "summary.txt").read_text()
    assert "Pool size (weighted slots): min 15, max 30" in summary
    capsys.readouterr()
    assert main(["--home", str(run_dir), "stats", "-lastday", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {sum(r[s] for s in ("Owner", "Unclaimed", "Matched", "Claimed", "Preempting",
                               "Backfill", "Drained")) for r in rows} == {15, 30}


@pytest.mark.parametrize("batch", [1, 5000])
def test_job_history_with_a_duplicate_id_is_one_row(tmp_path: Path, batch: int) -> None:
    """A job's history ad logged twice under one id (an import repeated, a re-sent ad) is one
    row, the first one, whether the copies share a batch or not; the log position moves on."""
    from adstash.history.target import catch_up
    from schemas.events import JobHistory, make_event
    from streams.log.topics import ensure_topics

    def ad(owner: str, proc: int) -> dict:
        return {"GlobalJobId": f"ap1#7.{proc}#1763800000", "Owner": owner, "ClusterId": 7,
                "ProcId": proc, "CompletionDate": 1763803600, "JobStatus": 4}

    first = make_event(JobHistory(ad("alice", 0)), ts=START, source="schedd@ap1", seq=1,
                       id="history:ap1#7.0")
    again = make_event(JobHistory(ad("mallory", 0)), ts=START + 1, source="schedd@ap1", seq=2,
                       id="history:ap1#7.0")
    other = make_event(JobHistory(ad("bob", 1)), ts=START + 2, source="schedd@ap1", seq=3,
                       id="history:ap1#7.1")
    log = open_log(None, tmp_path)
    ensure_topics(log)
    elog = EventLog(log)
    elog.append(EVENTS, [first, again, other])
    db = tmp_path / "h.duckdb"
    assert catch_up(log, db, batch=batch).delivered == 3
    elog.append(EVENTS, [again])  # later, in a batch of its own
    catch_up(log, db, batch=batch)
    log.close()
    con = connect(db)
    rows = con.execute("SELECT event_id, Owner FROM jobs ORDER BY event_id").fetchall()
    nxt = con.execute("SELECT next_offset FROM positions WHERE topic = ?", [EVENTS]).fetchall()
    con.close()
    assert rows == [("history:ap1#7.0", "alice"), ("history:ap1#7.1", "bob")]
    assert nxt == [(4,)]


def test_job_ads_read_lean_are_stored_whole_and_bad_ones_dead_lettered(tmp_path: Path) -> None:
    """job.history events reach the database from their stored bytes (never re-decoded into
    dicts): each row's ad is the logged ad, value for value (floats, unicode, lists, nested
    ads, expressions), its typed columns filled; an ad the event schema refuses (nested too
    deep) is in the DLQ with its reason and not in `jobs`; of an event with two "data" keys,
    the row holds the one the event log decodes (the last), as the accountant sees it."""
    from adstash.history.target import catch_up
    from schemas.events import JobHistory, encode, make_event
    from streams.log.topics import ensure_topics

    ads = [{"GlobalJobId": f"ap1#9.{i}#1763800000", "Owner": "zoë", "ClusterId": 9, "ProcId": i,
            "RemoteWallClockTime": 1e300 if i == 0 else 0.1 + i, "RequestCpus": 4,
            "Requirements": "/Expr(TARGET.Cpus >= 4)/", "Env": ["A=1", {"B": [2, None]}],
            "Note": "tab\t\"quote\" \u2028 end", "CompletionDate": 1763803600 + i}
           for i in range(3)]
    envs = [make_event(JobHistory(ad), ts=START + i, source="schedd@ap1", seq=i + 1)
            for i, ad in enumerate(ads)]
    bad = orjson.loads(encode(make_event(JobHistory(dict(ads[0], ProcId=7)), ts=START,
                                         source="schedd@ap1", seq=9)))
    bad["data"]["ad"]["Deep"] = [[[[[1]]]]]
    # two "data" keys, both valid: the decoder keeps the last, DuckDB's path finds the first
    smuggled = encode(envs[2]).replace(b'"data":', b'"data":{"ad":{"Owner":"mallory"}},"data":', 1)
    log = open_log(None, tmp_path)
    ensure_topics(log)
    log.append(EVENTS, [(None, encode(envs[0]), START), (None, orjson.dumps(bad), START),
                        (None, encode(envs[1]), START), (None, smuggled, START)])
    report = catch_up(log, tmp_path / "h.duckdb")
    dead = EventLog(log).dead_letters(EVENTS)
    log.close()
    assert (report.delivered, report.dead_lettered_at_decode) == (3, 1)
    assert [(d.offset, "nested deeper" in d.reason) for d in dead] == [(1, True)]
    con = connect(tmp_path / "h.duckdb")
    rows = con.execute("SELECT event_id, ProcId, Owner, RequestCpus, RemoteWallClockTime, ad "
                       "FROM jobs ORDER BY ProcId").fetchall()
    con.close()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (e.id, i, "zoë", 4.0, ads[i]["RemoteWallClockTime"]) for i, e in enumerate(envs)]
    assert [orjson.loads(r[5]) for r in rows] == ads


def test_a_job_ad_is_stored_as_the_event_log_decodes_its_bytes(tmp_path: Path) -> None:
    """Stored bytes in any valid spelling (an import keeps a line byte for byte) give the row
    the ad the event log decodes: keys spelled with \\u escapes, whitespace, a second "ad" key
    (the last wins), "data" before the envelope's other fields."""
    from adstash.history.target import catch_up
    from schemas.events import decode
    from streams.log.topics import ensure_topics

    def line(i: int, ad: str) -> bytes:
        return (f'{{ "d\\u0061ta" : {{ "ad": {{"Owner": "mallory"}}, "\\u0061d" : {ad} }},\n'
                f' "id": "imported:{i}", "type": "job.history", "v": 1, "ts": {START + i},'
                f' "source": "import", "seq": {i} }}').encode()
    stored = [line(0, '{"Owner": "alice", "ProcId": 0, "Note": "a \\"b\\" \\u00e9"}'),
              line(1, '{\n  "Owner" : "bob" ,\n  "ProcId" : 1 }')]
    expected = [decode(raw).data.ad for raw in stored]
    assert [a["Owner"] for a in expected] == ["alice", "bob"]
    log = open_log(None, tmp_path)
    ensure_topics(log)
    log.append(EVENTS, [(None, raw, START) for raw in stored])
    assert catch_up(log, tmp_path / "h.duckdb").delivered == 2
    log.close()
    con = connect(tmp_path / "h.duckdb")
    rows = con.execute("SELECT Owner, ProcId, ad FROM jobs ORDER BY ProcId").fetchall()
    con.close()
    assert [(r[0], r[1]) for r in rows] == [("alice", 0), ("bob", 1)]
    assert [orjson.loads(r[2]) for r in rows] == expected


@pytest.mark.parametrize("overlap", [False, True])
def test_every_runner_mode_writes_the_same_rows(tmp_path: Path, overlap: bool) -> None:
    """The target gives the same rows whether job ads come lean (stored bytes, as `catch_up`
    reads them) or decoded, staged apart (overlap) or not: one batch path, one result."""
    from adstash.history.target import HistoryTarget, catch_up
    from schemas.events import JobHistory, make_event
    from streams.log.topics import ensure_topics
    from streams.sink import SinkRunner

    log = open_log(None, tmp_path)
    ensure_topics(log)
    EventLog(log).append(EVENTS, [make_event(JobHistory(
        {"GlobalJobId": f"ap1#3.{i}#1763800000", "Owner": f"u{i % 3}", "ProcId": i,
         "RemoteWallClockTime": 10.5 * i, "Env": {"A": [1, None]}, "CompletionDate": 1763803600}),
        ts=START + i, source="schedd@ap1", seq=i + 1) for i in range(7)])
    assert catch_up(log, tmp_path / "lean.duckdb", batch=3).delivered == 7
    target = HistoryTarget(tmp_path / "decoded.duckdb", (EVENTS,))
    try:
        assert SinkRunner(log, target, batch=3, progress=False,
                          overlap=overlap).run_once().delivered == 7
    finally:
        target.close()
    log.close()
    tables = []
    for name in ("lean", "decoded"):
        con = connect(tmp_path / f"{name}.duckdb")
        tables.append(con.execute("SELECT * EXCLUDE (ad, batch), ad::JSON::VARCHAR FROM jobs "
                                  "ORDER BY log_offset").fetchall())
        con.close()
    assert len(tables[0]) == 7 and tables[0] == tables[1]


def _panels(fig: Any) -> dict[str, Any]:
    """Each panel of a figure by the first word of its first legend entry."""
    return {ax.get_legend().get_texts()[0].get_text().split()[0]: ax
            for ax in fig.axes if ax.get_legend() is not None}


def test_pool_plot_shows_the_pool_size_line_over_the_in_use_area(run_dir: Path) -> None:
    """At full use the pool-size line runs along the top of the in-use area, drawn above it
    (the old plot hid one line under the other); the outage is on the line."""
    from matplotlib.collections import PolyCollection

    from adstash.history.report import pool_figure

    con = connect(home=run_dir)
    fig: Any = pool_figure(con, None, None)
    con.close()
    ax = fig.axes[1]
    size: Any = next(line for line in ax.get_lines()
                     if line.get_label() == "pool size (slot weight)")
    used: Any = next(c for c in ax.collections if c.get_label() == "in use (claimed)")
    assert isinstance(used, PolyCollection) and (used.get_alpha() or 1.0) < 1
    assert size.get_zorder() > used.get_zorder() and size.get_drawstyle() == "steps-post"
    assert sorted(set(size.get_ydata())) == [15.0, 30.0]
    vertices: Any = used.get_paths()[0].vertices
    top_of_area = max(vertices[:, 1])
    assert top_of_area == max(size.get_ydata()) == 30.0  # full use: both at 30, both drawn
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["in use (claimed)", "pool size (slot weight)"]
    assert {line.get_label() for line in fig.axes[0].get_lines()} == \
        {"demand (running + idle jobs)", "pool size (slot weight)"}
    plt.close(fig)


def test_quota_plot_shows_every_group_from_the_start(run_dir: Path) -> None:
    """One panel per group, `<none>` included, each quota drawn from the first quota the
    negotiator computed (not from the first change of it)."""
    from matplotlib.dates import date2num

    from adstash.history.report import quota_figure

    con = connect(home=run_dir)
    first = con.execute("SELECT min(ts) FROM quotas").fetchall()[0][0]
    fig: Any = quota_figure(con, None, None)
    con.close()
    panels = _panels(fig)
    assert sorted(panels) == ["<none>", "group_chemistry", "group_physics"]
    start = date2num(datetime.fromtimestamp(first, timezone.utc))
    for grp, ax in panels.items():
        quota: Any = next(line for line in ax.get_lines() if line.get_label() == f"{grp} quota")
        assert quota.get_xydata()[0, 0] == pytest.approx(start)
        assert quota.get_linestyle() == "--"
    physics: Any = next(line for line in panels["group_physics"].get_lines()
                   if line.get_label() == "group_physics quota")
    assert sorted(set(physics.get_ydata())) == [10.0, 20.0]  # halved in the outage
    assert [c.get_label() for c in panels["group_physics"].collections] == \
        ["group_physics usage"]
    plt.close(fig)
