"""What an operator meets first (issue 26 items 1, 2, 3, 6, 7; issue 28 item 4): services that
start from any home, a `run` that erases nothing it did not write, condor_q from the log and
the history's queue, Kafka runs that name their topic, and a history database shared by
readers and the sink, read-only for `sql`."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import duckdb
import pytest

from services.cli import main

ROOT = Path(__file__).resolve().parents[1]

HELD_SCENARIO = """
[pool]
name = "q"
duration = "1h"
uid_domain = "example.org"
central_manager = "cm.example.org"

[config]
NEGOTIATOR_INTERVAL = 60

[[machines]]
name = "ep1.example.org"
cpus = 4
memory = 16384

[[submitters]]
user = "alice"
[[submitters.jobs]]
arrival = { kind = "batch", count = 6 }
duration = "3h"

[[submitters]]
user = "bob"
[[submitters.jobs]]
arrival = { kind = "batch", count = 3 }
duration = "3h"

[[actions]]
at = "10m"
kind = "hold"
user = "bob"
count = 1
"""


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory laid out like a fresh clone (no POOLLEDGER_* variables)."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / "scenarios").symlink_to(ROOT / "scenarios")
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG",
                "POOLLEDGER_EVENTS_TOPIC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(work)
    return work


# --- 1. services from a relative home ---------------------------------------------------------

def _installable(service: str) -> str | None:
    """Why `service` cannot run on this machine (None: it can)."""
    from compose import monitoring

    if service in ("gmond", "graphite", "prometheus"):
        try:
            monitoring.ensure_installed((service,))
        except monitoring.MonitoringLauncherError as exc:
            return f"{service} cannot be installed here: {exc}"
    elif shutil.which("java") is None:
        return f"{service} needs Java 17+, which is not installed"
    elif service == "kafka" and shutil.which("mvn") is None:
        return "kafka needs Maven to fetch the broker, which is not installed"
    return None


@pytest.fixture
def open_clone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`clone`, in a directory every user may enter: as root the search engines run as their
    own user, who must reach the data directory (pytest's own tmp is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="poolledger-ops-"))
    base.chmod(0o755)
    work = base / "clone"
    work.mkdir()
    (work / "scenarios").symlink_to(ROOT / "scenarios")
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(work)
    try:
        yield work
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("service", ["kafka", "gmond", "graphite", "prometheus",
                                     "elasticsearch", "opensearch"])
@pytest.mark.parametrize("home", [None, "rel/dir"])
def test_services_start_from_a_relative_home(open_clone: Path, service: str, home: str | None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Every launcher works from the default `./out` and any relative --home (they ran their
    daemons in <home>/services/<svc> with paths relative to the caller's directory)."""
    if service in ("elasticsearch", "opensearch") and home is not None:
        pytest.skip("a search engine takes ~15 s to start; the default home proves its path")
    why = _installable(service)
    if why:
        pytest.skip(why)
    clone = open_clone
    pre = ["--home", home] if home else []
    root = clone / (home or "out")
    try:
        assert main([*pre, "services", "start", service]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert out.startswith(f"{service} running"), out
        assert main([*pre, "services", "status", service, "--json"]) == 0
        status = capsys.readouterr().out
        assert '"pid"' in status and str(root / "services" / service) in status
    finally:
        assert main([*pre, "services", "stop", service]) == 0
    assert f"{service} stopped" in capsys.readouterr().out
    assert main([*pre, "services", "status", service]) == 1
    assert sorted(p.name for p in clone.iterdir()) == sorted(
        {"scenarios", (home or "out").split("/")[0]})


def test_a_service_that_cannot_start_says_so_in_one_line(
        clone: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    why = _installable("kafka")
    if why:
        pytest.skip(why)
    monkeypatch.setenv("POOLLEDGER_JAVA", "/bin/false")  # the storage format fails
    assert main(["services", "start", "kafka"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("poolledger services: kafka: "), err
    assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the search engines to a user")
def test_a_search_engine_that_cannot_reach_its_home_says_which_directory(
        clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    why = _installable("elasticsearch")
    if why:
        pytest.skip(why)
    private = clone / "private"
    private.mkdir(mode=0o700)
    assert main(["--home", "private/out", "services", "start", "elasticsearch"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot enter" in err and "--home" in err, err


def test_the_readme_names_one_default_home() -> None:
    text = (ROOT / "README.md").read_text()
    assert "~/.poolledger" not in text
    from schemas.knobs import find_knob

    knob = find_knob("POOLLEDGER_HOME")
    assert knob is not None and knob.default == "out" and "default `./out`" in text


# --- 2. run erases nothing it did not write ----------------------------------------------------

def test_run_replaces_only_its_own_unchanged_log(clone: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "small", "--hours", "0.5", "--quiet"]) == 0
    # unchanged since the run wrote it: the next run replaces it (`make run` twice)
    assert main(["run", "small", "--hours", "0.3", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["userprio", "-setfactor", "alice@example.org", "2000"]) == 0
    capsys.readouterr()
    assert main(["run", "small", "--hours", "0.3", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err and "out/log" in err, err
    # the edit is still there
    assert main(["userprio", "-l"]) == 0
    assert "PriorityFactor = 2000" in capsys.readouterr().out.replace(".0", "")
    # --overwrite replaces it, and the history database with it
    assert main(["run", "small", "--hours", "0.3", "--quiet", "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["sql", "SELECT count(*) FROM admin WHERE op = 'setfactor'", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "0"


def test_an_explicit_home_is_replaced_only_with_overwrite(
        clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--home", "h", "run", "--out", "o", "--hours", "0.2", "--quiet"]
    assert main(args) == 0
    assert main(args) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


def test_the_history_follows_the_log_it_was_made_from(tmp_path: Path) -> None:
    """A database caught up with one log and then pointed at another of the same length
    (another seed) holds only the second log's rows afterwards."""
    from adstash.history.target import catch_up
    from services.commands.run import resolve_scenario
    from services.mainloop import MainLoop
    from services.pool import load_scenario
    from schemas.settings import load_settings
    from streams.log.embedded import EmbeddedLog

    scenario = load_scenario(resolve_scenario("small"))
    db = tmp_path / "history.duckdb"

    def rows(path: Path) -> set[tuple[object, ...]]:
        con = duckdb.connect(str(path), read_only=True)
        try:
            return set(con.execute("SELECT event_id, ts, kind, slot FROM job_runs").fetchall())
        finally:
            con.close()

    seen = []
    for seed in (1, 2):
        shutil.rmtree(tmp_path / "log", ignore_errors=True)
        log = EmbeddedLog(tmp_path / "log")
        MainLoop(scenario, seed=seed, settings=load_settings(), log=log).run(0.3)
        catch_up(log, db)
        catch_up(log, tmp_path / f"fresh{seed}.duckdb")
        log.close()
        seen.append(rows(db))
    assert seen[0] == rows(tmp_path / "fresh1.duckdb") != seen[1]
    assert seen[1] == rows(tmp_path / "fresh2.duckdb")


# --- 3. condor_q and the history's queue ------------------------------------------------------

@pytest.fixture(scope="module")
def queue_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("q")
    scenario = base / "q.toml"
    scenario.write_text(HELD_SCENARIO)
    assert main(["run", str(scenario), "--out", str(base / "out"), "--quiet"]) == 0
    yield base / "out"


def _q(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--home", str(home), "q", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_q_default_is_the_batch_summary(queue_home: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _q(queue_home, capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].startswith("-- Schedd: ")
    assert lines[2].split() == ["OWNER", "BATCH_NAME", "SUBMITTED", "DONE", "RUN", "IDLE",
                                "HOLD", "TOTAL", "JOB_IDS"]
    rows = {line.split()[0]: line.split() for line in lines[3:5]}
    # alice: 6 jobs of one batch on 4 cores; bob: 3 jobs, one held, waiting behind alice
    assert rows["alice"][1:3] == ["ID:", "1"] and rows["alice"][-2:] == ["6", "1.0-5"]
    assert rows["bob"][1:3] == ["ID:", "2"] and rows["bob"][-3:] == ["1", "3", "2.0-2"]
    assert lines[-2] == ("Total for query: 9 jobs; 0 completed, 0 removed, 4 idle, 4 running, "
                         "1 held, 0 suspended")
    assert lines[-1].startswith("Total for all users: 9 jobs;")


def test_q_job_views(queue_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _q(queue_home, capsys, "-nobatch")
    lines = out.splitlines()
    assert lines[2].split() == ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "ST", "PRI", "SIZE", "CMD"]
    jobs = [line.split() for line in lines[3:12]]
    assert [j[0] for j in jobs] == [f"1.{p}" for p in range(6)] + ["2.0", "2.1", "2.2"]
    assert sorted(j[5] for j in jobs).count("R") == 4 and [j[5] for j in jobs].count("H") == 1
    running = [j for j in jobs if j[5] == "R"]
    # three started at once (1 h of run time); bob's third took the slot his held job left
    assert sorted(j[4] for j in running) == ["0+00:50:00"] + ["0+01:00:00"] * 3
    assert {j[0]: j[5] for j in jobs}["2.0"] == "H"
    _, out, _ = _q(queue_home, capsys, "-run")
    run = out.splitlines()
    assert run[2].split() == ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "HOST(S)"]
    assert len(run) == 3 + 4 + 3 and all("@ep1.example.org" in r for r in run[3:7])
    _, out, _ = _q(queue_home, capsys, "-hold")
    hold = out.splitlines()
    assert hold[2].split() == ["ID", "OWNER", "HELD_SINCE", "HOLD_REASON"]
    assert hold[3].split()[:2] == ["2.0", "bob"] and len(hold) == 3 + 1 + 3
    _, out, _ = _q(queue_home, capsys, "-idle")
    assert out.splitlines()[2].split() == ["ID", "OWNER", "UNIVERSE", "CPUS", "MEMORY", "STARTS",
                                           "LAST_HOST"]
    assert "4 idle" in out and len(out.splitlines()) == 3 + 4 + 3


def test_q_constraint_af_owner_long_totals(queue_home: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _q(queue_home, capsys, "bob", "-af", "ClusterId", "ProcId", "JobStatus")
    assert out.splitlines() == ["2 0 5", "2 1 2", "2 2 2"]
    _, out, _ = _q(queue_home, capsys, "-constraint", "JobStatus == 2", "-totals")
    assert out.splitlines()[-2].startswith("Total for query: 4 jobs;")
    _, out, _ = _q(queue_home, capsys, "-l", "1.3")
    assert 'Owner = "alice"' in out and "JobStatus = " in out and "ServerTime = " in out
    rc, _, err = _q(queue_home, capsys, "-constraint", "JobStatus ==")
    assert rc == 2 and err.startswith("poolledger q: -constraint 'JobStatus =='")


def test_q_better_analyze_is_why(queue_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _q(queue_home, capsys, "-better-analyze", "2.1")
    assert rc == 0 and "poolledger why 2.1" in out and "Job 2.1 on " in out
    rc, _, err = _q(queue_home, capsys, "-better-analyze")
    assert rc == 2 and "poolledger why JOB_ID" in err


def test_the_history_queue_has_the_waiting_jobs(queue_home: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The queue view holds the jobs still queued at the history's end, as q shows them, and
    the idle ones' wait so far runs to the log's end (so waits are not only finished jobs')."""
    capsys.readouterr()
    assert main(["--home", str(queue_home), "sql", "--csv",
                 "SELECT job_id, status, still_waiting, wait_seconds, queued_seconds "
                 "FROM queue ORDER BY job_id"]) == 0
    rows = [r.split(",") for r in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == [f"1.{p}" for p in range(6)] + ["2.0", "2.1", "2.2"]
    by_status = {s: sum(1 for r in rows if r[1] == s) for s in ("idle", "running", "held")}
    assert by_status == {"idle": 4, "running": 4, "held": 1}
    for job_id, status, waiting, wait, queued in rows:
        if waiting == "True":  # never started: waiting since submission, up to the log's end
            assert status == "idle" and float(wait) == float(queued) == 3600.0
        else:  # started (bob's held one ran for 10 minutes first): the wait to its start
            assert status in ("running", "held") and float(wait) < float(queued)


# --- 6. Kafka: the run's topic named and read; the faust worker's progress ------------------

@pytest.mark.kafka
def test_a_kafka_run_names_its_topic_and_every_query_reads_it(
        kafka_bootstrap: str, clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import re
    import subprocess
    import sys
    import time

    broker = f"kafka://{kafka_bootstrap}"
    assert main(["--broker", broker, "run", "small", "--hours", "0.5", "--quiet",
                 "--out", "k"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"^Events topic: (\S+) \(query it: poolledger --broker (\S+) --topic \1 ",
                      out, re.M)
    assert found and found.group(2) == broker, out
    topic = found.group(1)
    for argv in (["userprio"], ["q", "-totals"], ["why", "1.0"], ["status", "-total"],
                 ["gangliad", "--once", "--dry-run"]):
        assert main(["--broker", broker, "--topic", topic, *argv]) == 0, capsys.readouterr().err
        text = capsys.readouterr().out
        assert text.strip()
    assert main(["--broker", broker, "--topic", topic, "userprio"]) == 0
    assert "alice@example.org" in capsys.readouterr().out
    assert main(["--broker", broker, "--topic", topic + ".nosuch", "userprio"]) == 1
    assert f"holds no events in topic {topic}.nosuch" in capsys.readouterr().err
    assert main(["--broker", broker, "--topic", topic, "adstash", "--interface", "jsonfile",
                 "--json_dir", str(clone / "j"), "--once"]) == 0
    read = re.search(r"(\d+) documents indexed from (\d+) events read", capsys.readouterr().out)
    assert read and int(read.group(2)) > 0
    # the history of the Kafka run, from its own topic
    assert main(["--broker", broker, "--home", "k", "--topic", topic, "sql", "--csv",
                 "SELECT count(*) > 0 FROM job_runs"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "True"

    # a worker of its own on that topic: progress lines and `faust-status`
    from streams.faust_app import STATUS_EVERY

    home = clone / "worker"
    app = f"ops-status-{os.getpid()}"
    env = dict(os.environ, POOLLEDGER_BROKER=broker, POOLLEDGER_EVENTS_TOPIC=topic,
               POOLLEDGER_FAUST_APP=app, POOLLEDGER_HOME=str(home), PYTHONPATH=str(ROOT))
    home.mkdir()
    logfile = home / "worker.log"
    with open(logfile, "wb") as sink:
        worker = subprocess.Popen([sys.executable, "-m", "streams.faust_app", "worker", "-l",
                                   "info"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  cwd=home)
    try:
        events = None
        deadline = time.monotonic() + 120 + 3 * STATUS_EVERY
        while time.monotonic() < deadline:
            time.sleep(2)
            rc = main(["--home", str(home), "--set", f"POOLLEDGER_FAUST_APP={app}",
                       "faust-status"])
            text = capsys.readouterr().out
            if rc == 0 and "active" in text and "lag 0" in text:
                events = text
                break
        assert events is not None, logfile.read_text()[-3000:]
        assert f"on topic {topic}" in events and " events folded" in events
        assert re.search(r"folded \d+ events of " + re.escape(topic) + r"; next offset \d+, "
                         r"end \d+, lag 0", logfile.read_text())
    finally:
        worker.terminate()
        worker.wait(60)
    assert main(["--home", str(home), "--set", f"POOLLEDGER_FAUST_APP={app}",
                 "faust-status"]) == 1
    assert "no faust worker of app" in capsys.readouterr().err


# --- 7 and 28.4: the history database shared, and sql read-only --------------------------------

def test_readers_and_the_sink_never_block_each_other(queue_home: Path) -> None:
    """An analyst's open connection (this process) does not stop `history rebuild` nor `sql`
    (other processes, as in use); an update in progress (its writer lock held) does not stop
    `sql`, which says it reads the last published copy and names --no-update."""
    from adstash.history import connect
    from adstash.history.db import default_path, writer_lock
    from tests.test_cli import cli

    analyst = connect(home=queue_home)
    try:
        before = analyst.sql("SELECT count(*) FROM job_runs").fetchall()[0][0]
        rebuilt = cli(queue_home, "history", "rebuild")
        assert rebuilt.returncode == 0, rebuilt.stderr
        asked = cli(queue_home, "sql", "--csv", "SELECT count(*) FROM queue")
        assert asked.returncode == 0 and asked.stdout.splitlines()[1] == "9", asked.stderr
        # the analyst's session still reads its copy, untouched by the rebuild
        assert analyst.sql("SELECT count(*) FROM job_runs").fetchall()[0][0] == before
    finally:
        analyst.close()
    with writer_lock(default_path(queue_home)):  # an update running in another process
        asked = cli(queue_home, "sql", "--csv", "SELECT count(*) FROM queue")
        assert asked.returncode == 0 and asked.stdout.splitlines()[1] == "9", asked.stderr
        assert asked.stderr.count("\n") == 1
        assert "another process is updating" in asked.stderr and "--no-update" in asked.stderr
        quiet = cli(queue_home, "sql", "--no-update", "SELECT 1")
        assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_writing_connection_elsewhere_is_named_with_no_update(queue_home: Path) -> None:
    from adstash.history import connect
    from tests.test_cli import cli

    writer = connect(home=queue_home, read_only=False)
    try:
        update = cli(queue_home, "history", "update")
        assert update.returncode == 1 and update.stderr.count("\n") == 1, update.stderr
        assert "--no-update" in update.stderr
        # readers go on from the published copy
        assert cli(queue_home, "sql", "--no-update", "SELECT 1").returncode == 0
    finally:
        writer.close()


@pytest.mark.parametrize("statement", [
    "COPY (SELECT 1) TO '{tmp}/x.csv'",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SET enable_external_access = true",
    "CREATE TABLE mine AS SELECT 1",
])
def test_sql_is_read_only_by_construction(queue_home: Path, tmp_path: Path, statement: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = statement.format(tmp=tmp_path)
    capsys.readouterr()
    assert main(["--home", str(queue_home), "sql", "--no-update", text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("poolledger sql: SQL "), err
    assert list(tmp_path.iterdir()) == []
    assert "history export --parquet DIR" in err, err


# --- 9: what the help says ----------------------------------------------------------------------

def test_sql_help_names_every_table_and_view(capsys: pytest.CaptureFixture[str]) -> None:
    from adstash.history.schema import DATA_TABLES, VIEW_NAMES

    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in (*DATA_TABLES, *VIEW_NAMES):
        assert f" {name}" in text, name


@pytest.mark.parametrize("command", ["q", "faust-status", "services", "sql", "history", "stats",
                                     "report", "run"])
def test_every_option_of_these_commands_has_help(command: str) -> None:
    import argparse

    from services.cli import build_parser

    def bare(parser: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out += bare(sub, f"{path} {name}")
            elif action.help is None:
                out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return out

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert bare(sub.choices[command], command) == []


def test_run_past_the_scenario_says_the_rest_is_idle(clone: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    scenario = clone / "short.toml"
    scenario.write_text(HELD_SCENARIO.replace('duration = "1h"', 'duration = "20m"'))
    assert main(["run", str(scenario), "--hours", "0.5", "--quiet", "--no-history"]) == 0
    err = capsys.readouterr().err
    assert "scenario q lasts 0.333333 h" in err and "the last 0.166667 h" in err, err
    assert main(["run", str(scenario), "--hours", "0.2", "--quiet", "--no-history"]) == 0
    assert "lasts" not in capsys.readouterr().err


def test_gangliad_once_says_what_it_published(queue_home: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    om = tmp_path / "pool.om"
    capsys.readouterr()
    assert main(["--home", str(queue_home), "gangliad", "--once", "--publish", "prometheus",
                 "--openmetrics", str(om)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gangliad: ") and " metrics as of 2025-11-22T" in out
    assert "published to openmetrics (" in out and om.stat().st_size > 0


def test_adstash_counts_documents_not_events(queue_home: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import re

    capsys.readouterr()
    assert main(["--home", str(queue_home), "sql", "--csv", "SELECT count(*) FROM jobs"]) == 0
    jobs = int(capsys.readouterr().out.splitlines()[1])
    assert main(["--home", str(queue_home), "adstash", "--interface", "jsonfile", "--json_dir",
                 str(tmp_path / "j"), "--checkpoint_file", str(tmp_path / "ck.json"),
                 "--once"]) == 0
    found = re.search(r"(\d+) documents indexed from (\d+) events read",
                      capsys.readouterr().out)
    assert found and int(found.group(1)) == jobs and int(found.group(2)) > jobs


def test_log_warnings_speak_in_the_cli_voice(tmp_path: Path) -> None:
    """A library's warning (here a file import's bad line) is one line in the command's voice,
    not `WARNING streams...` (a process of its own: pytest owns this one's logging)."""
    from tests.test_cli import cli

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "an event"}\n')
    done = cli(tmp_path / "imp", "log", "import", str(bad))
    assert done.returncode == 1
    assert "WARNING " not in done.stderr and "streams." not in done.stderr, done.stderr
    assert done.stderr.startswith("poolledger log: warning: dead-lettered "), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_the_run_progress_line_has_a_rate_and_an_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from services import mainloop

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(mainloop.time, "monotonic", lambda: next(clock))
    screen = Terminal()
    bar = mainloop.Progress(screen)
    bar.update(0.25, 18.0, 5000, force=True)
    assert "25% t=18.0h events=5000 500 ev/s ETA 0:00:30" in screen.getvalue()


def test_adstash_checkpoint_file_follows_the_log(clone: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A --checkpoint_file counted in a log that `run --overwrite` replaced is not continued
    on the new log: the new one is indexed from its start, and the command says so."""
    import re

    from streams.log.embedded import EmbeddedLog
    from streams.log.topics import EVENTS

    ck = tmp_path / "ck.json"
    stash = ["adstash", "--interface", "jsonfile", "--json_dir", str(tmp_path / "j"),
             "--checkpoint_file", str(ck), "--once"]
    assert main(["run", "small", "--hours", "0.5", "--quiet", "--no-history"]) == 0
    assert main(stash) == 0
    capsys.readouterr()
    assert main(["userprio", "-setfactor", "bob@example.org", "3000"]) == 0
    assert main(["run", "small", "--hours", "0.4", "--seed", "3", "--quiet", "--no-history",
                 "--overwrite"]) == 0
    capsys.readouterr()
    assert main(stash) == 0
    out, err = capsys.readouterr()
    with EmbeddedLog(clone / "out" / "log") as log:
        events = sum(log.end_offsets(EVENTS).values())
    found = re.search(r"from (\d+) events read", out)
    assert found and int(found.group(1)) == events, out
    assert "counted in a log since replaced" in err and err.count("\n") == 1
    # unchanged log: the checkpoint is continued, nothing read again
    assert main(stash) == 0
    out, err = capsys.readouterr()
    assert "from 0 events read" in out and err == ""


def test_a_what_if_replay_shows_progress_with_a_rate_and_an_eta(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A what-if replay folds the whole log: on a terminal it draws the run's progress line
    (events folded of the log's, rate, ETA) once it has taken FOLD_PROGRESS_AFTER; a quick
    fold draws nothing, and a pipe never gets one."""
    import io
    import itertools
    import re
    import sys
    import time

    import services.commands as commands
    import streams.replay
    from services.cli import main
    from tests.test_cli import write_log

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    home = tmp_path / "home"
    assert main(["--home", str(home), "log", "import", str(write_log(tmp_path / "e.jsonl"))]) == 0
    capsys.readouterr()
    monkeypatch.setattr(streams.replay, "PROGRESS_EVERY", 4)
    clock = itertools.count(100.0, 1.0)  # a second per clock read: slow enough to show
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    whatif = ["--home", str(home), "--set", "PRIORITY_HALFLIFE=43200", "replay"]
    assert main(whatif) == 0
    lines = screen.getvalue().split("\r")
    assert any(re.search(r"\] +\d+% t=\d+\.\dh events=\d+ [\d,]+ ev/s ETA \d:\d\d:\d\d", line)
               for line in lines), screen.getvalue()
    assert "events=16" in screen.getvalue() and screen.getvalue().endswith("\n")
    assert "Number of users" in capsys.readouterr().out  # the table, on stdout as before
    monkeypatch.setattr(commands, "FOLD_PROGRESS_AFTER", 1e9)  # quick after all: no line
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert main(whatif) == 0
    assert "ev/s" not in screen.getvalue()


def test_history_rebuild_shows_progress_with_a_rate_and_an_eta(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`history rebuild` draws the same progress line on a terminal: the records read of
    all the topics it catches up (events, then derived), rate and ETA, ending at 100%."""
    import io
    import itertools
    import re
    import sys
    import time

    from tests.test_cli import write_log

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    home = tmp_path / "home"
    assert main(["--home", str(home), "log", "import", str(write_log(tmp_path / "e.jsonl"))]) == 0
    capsys.readouterr()
    clock = itertools.count(100.0, 1.0)
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert main(["--home", str(home), "history", "rebuild", "--batch", "3"]) == 0
    lines = screen.getvalue().split("\r")
    shown = [line for line in lines
             if re.search(r"\] +\d+% events=\d+ [\d,]+ ev/s ETA \d:\d\d:\d\d", line)]
    assert shown, screen.getvalue()
    assert "100%" in shown[-1] and screen.getvalue().endswith("\n")
    assert "events delivered" in capsys.readouterr().out
