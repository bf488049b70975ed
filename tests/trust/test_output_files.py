"""Issue 28, items 10-12: nothing printed that a terminal obeys; expression evaluation
bounded in sinks, views and the negotiator; hostile files refused by the importers with
file:line, never a traceback.

The pool is a short `run small` (real embedded log, real classad2, real DuckDB); hostile
events are appended to a copy of its log as an attacker would write them.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from schemas.classads import evaluate
from schemas.errors import EventValidationError
from schemas.events import AdInvalidated, NegotiationCycled, decode, make_event
from services.cli import main
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
LONG_SUM = " + ".join(["Cpus"] * 3000)


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line(err: str, start: str) -> None:
    """The error is one line beginning `start` (no traceback, no flood)."""
    assert err.count("\n") == 1 and err.startswith(start), err[:500]
    assert "Traceback" not in err and len(err) < 400, err[:500]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("pool")
    assert main(["--home", str(home), "run", "small", "--hours", "0.3", "--quiet", "--out",
                 str(home), "--no-history"]) == 0
    return home


@pytest.fixture()
def home(pool: Path, tmp_path: Path) -> Path:
    """A copy of the pool's home to spoil."""
    dest = tmp_path / "home"
    shutil.copytree(pool, dest)
    return dest


def events(home: Path) -> list[dict]:
    return [json.loads(line) for line in (home / "events.jsonl").read_text().splitlines()]


def append_raw(home: Path, records: list[dict]) -> None:
    """Append records as they are, past the writer (as a forger or another tool writes)."""
    lg = EmbeddedLog(home / "log")
    try:
        lg.append(EVENTS, [(None, orjson.dumps(r), float(r["ts"])) for r in records])
    finally:
        lg.close()


def last_ts(home: Path) -> float:
    return max(e["ts"] for e in events(home))


def machine_ad(home: Path, **attrs: object) -> dict:
    """A new slot's ad.updated at the log's end, its attributes overridden by `attrs`."""
    first = next(e for e in events(home) if e["type"] == "ad.updated"
                 and e["data"]["ad_type"] == "Machine")
    ad = {**first["data"]["ad"], "Name": "slot1@evil.example.org",
          "Machine": "evil.example.org", **attrs}
    ts = last_ts(home)
    return {"id": "startd@evil:1", "type": "ad.updated", "v": 1, "ts": ts,
            "source": "startd@evil", "seq": 1,
            "data": {"ad_type": "Machine", "name": "slot1@evil.example.org", "ad": ad}}


# --- item 10: terminal escapes -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["evil\x1b]0;owned\x07@example.org", "a\nforged line",
                                  "nul\x00@example.org", "two words@example.org",
                                  "\u202eorg.elpmaxe@evil", "\x9b2J@example.org"])
def test_names_with_terminal_controls_or_whitespace_are_refused_at_the_contract(
        name: str) -> None:
    base = {"id": "schedd@ap1:1", "type": "job.submitted", "v": 1, "ts": 1763800000.0,
            "source": "schedd@ap1", "seq": 1,
            "data": {"job_id": "1.0", "schedd": "schedd@ap1", "submitter": name, "ad": {}}}
    with pytest.raises(EventValidationError, match=r"field 'data\.submitter': holds"):
        decode(orjson.dumps(base))
    admin = {**base, "type": "admin.command",
             "data": {"op": "setfactor", "target": name, "value": 2.0, "by": "root"}}
    with pytest.raises(EventValidationError, match=r"field 'data\.target': holds"):
        decode(orjson.dumps(admin))
    if name.strip() != name or any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in name):
        knob = {**base, "type": "config.changed",
                "data": {"knob": "GROUP_NAMES", "value": f"group_a, {name}"}}
        with pytest.raises(EventValidationError, match=r"field 'data\.value': holds"):
            decode(orjson.dumps(knob))


def test_a_forged_submitter_is_dead_lettered_and_userprio_prints_no_escape(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ts = last_ts(home)
    evil = "x\x1b[2J\x1b]0;pwned\x07@example.org"
    append_raw(home, [{"id": "schedd@ap1.example.org:900001", "type": "job.submitted", "v": 1,
                       "ts": ts, "source": "schedd@ap1.example.org", "seq": 900001,
                       "data": {"job_id": "900.0", "schedd": "schedd@ap1.example.org",
                                "submitter": evil, "ad": {"ClusterId": 900, "ProcId": 0}}}])
    for args in (["userprio", "-allusers"], ["replay"], ["why", "900.0"]):
        rc, out, err = cli(capsys, home, *args)
        assert "\x1b" not in out + err and "\x07" not in out + err, args
    assert dead_reasons(home) == [
        "event 'schedd@ap1.example.org:900001', type 'job.submitted', field 'data.submitter': "
        "holds the control character '\\x1b' at 1: a terminal would obey it"]


def test_text_from_the_data_is_printed_escaped(home: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An ad's string attribute holding an OSC title, a screen clear and a newline: status
    prints it escaped, on one line."""
    append_raw(home, [machine_ad(home, OpSys="LINUX\x1b]0;owned\x07\x1b[2J\nforged: line")])
    rc, out, err = cli(capsys, home, "status", "-af", "Name", "OpSys")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("slot1@evil"))
    assert line == "slot1@evil.example.org LINUX\\x1b]0;owned\\x07\\x1b[2J\\nforged: line"
    assert "\x1b" not in out and "forged: line" not in out.replace(line, "")


# --- item 11: bounded evaluation ----------------------------------------------------------------

def test_adstash_rejects_the_document_it_cannot_evaluate_and_moves_on(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ts = last_ts(home)
    big = {"ClusterId": 901, "ProcId": 0, "GlobalJobId": "ap1.example.org#901.0#1763800000",
           "Owner": "eve", "JobStatus": 4, "CompletionDate": int(ts), "QDate": int(ts) - 60,
           "RequestCpus": 1, "Big": f"/Expr({' + '.join(['RequestCpus'] * 3000)})/"}
    fine = {**big, "ClusterId": 902, "GlobalJobId": "ap1.example.org#902.0#1763800000"}
    del fine["Big"]
    append_raw(home, [{"id": f"history:{ad['GlobalJobId']}", "type": "job.history", "v": 1,
                       "ts": ts, "source": "schedd@ap1.example.org", "seq": 900100 + k,
                       "data": {"ad": ad}} for k, ad in enumerate((big, fine))])
    out_dir = tmp_path / "docs"
    for _ in range(2):  # a rerun goes on too: the checkpoint moved past the bad document
        rc, out, err = cli(capsys, home, "adstash", "--interface", "jsonfile", "--json_dir",
                           str(out_dir), "--once")
        assert rc == 0 and "Traceback" not in err, err
    docs = [d for f in sorted(out_dir.glob("*.json")) for d in json.loads(f.read_text()).values()]
    ids = {d.get("GlobalJobId") for d in docs}
    assert "ap1.example.org#902.0#1763800000" in ids
    assert "ap1.example.org#901.0#1763800000" not in ids
    lg = EmbeddedLog(home / "log")
    try:
        dead = [d for t in lg.topics() if t.endswith(".dlq") and "adstash" in t
                for d in EventLog(lg).dead_letters(t.removesuffix(".dlq"))]
    finally:
        lg.close()
    assert [d.reason for d in dead] == [
        "adstash-jsonfile rejected event history:ap1.example.org#901.0#1763800000: Big: "
        "'RequestCpus + RequestCpus + RequestCpus + RequestCpus + Requ'... (41997 characters): "
        "nested too deep or too much work for a ClassAd evaluator"]


def test_gangliad_skips_the_metric_it_cannot_evaluate(home: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.d"
    metrics.mkdir()
    (metrics / "00").write_text(
        (ROOT / "ganglia/metrics.d/00_default_metrics").read_text()
        + f'\n[ Name = "Hostile"; Value = {" + ".join(["1"] * 3000)}; TargetType = "Machine"; ]\n')
    append_raw(home, [machine_ad(home, TotalCpus=f"/Expr({LONG_SUM})/")])
    rc, out, err = cli(capsys, home, "--set", f"GANGLIAD_METRICS_CONFIG_DIR={metrics}",
                       "gangliad", "--once", "--dry-run")
    assert rc == 0 and "Traceback" not in err, err
    assert "metric 'Hostile': Value failed to evaluate" in err
    assert "metric 'TotalCpus': Value failed to evaluate for Machine 'slot1@evil.example.org'" in err
    assert "publishing Cpus in Pool=" in out  # the other metrics are published


def test_long_expressions_and_constraints_are_one_line(home: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--home", str(home), "history", "update"]) == 0
    capsys.readouterr()
    for args, start in ((["status", "-af", LONG_SUM], "poolledger status: -af 'Cpus + Cpus"),
                        (["status", "-constraint", f"{LONG_SUM} > 0"],
                         "poolledger status: -constraint 'Cpus + Cpus"),
                        (["updates-stats", "-constraint", f"{LONG_SUM} > 0"],
                         "poolledger updates-stats: -constraint 'Cpus + Cpus"),
                        (["history", "-constraint", f"{LONG_SUM} > 0"],
                         "poolledger history: -constraint 'Cpus + Cpus"),
                        (["status", "-constraint", "(" * 400 + "Cpus" + ")" * 400],
                         "poolledger status: -constraint '((((")):
        rc, out, err = cli(capsys, home, *args)
        assert rc == 2, (args[0], err[:300])
        one_line(err, start)
    append_raw(home, [machine_ad(home, TotalCpus=f"/Expr({LONG_SUM})/")])
    rc, out, err = cli(capsys, home, "status", "-af", "Name", "TotalCpus")
    assert rc == 0 and "slot1@evil.example.org error" in out.splitlines()
    rc, out, err = cli(capsys, home, "status", "-constraint", "TotalCpus > 0", "-af", "Name")
    assert rc == 0 and "slot1@evil.example.org" not in out and out


def test_adstash_refuses_a_se_host_that_is_not_a_url(home: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("not a url", "http://x:99999", "ftp://es.example.org"):
        rc, out, err = cli(capsys, home, "adstash", "--se_host", host, "--once")
        assert rc == 2
        one_line(err, f"poolledger adstash: --se_host {host!r}: ")


def test_clock_functions_read_the_event_time() -> None:
    t = 1763800000
    assert evaluate("formatTime()", now=t) == datetime.datetime.fromtimestamp(
        t).strftime("%a %b %d %H:%M:%S %Y")
    assert evaluate('formatTime(time(), "%Y")', now=t) == "2025"
    assert evaluate("absTime()", now=t) == datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
    assert evaluate("CurrentTime - 100", now=t) == t - 100
    assert evaluate("X", {"X": "/Expr(CurrentTime)/"}, now=t) == t


def test_random_in_a_scenarios_job_requirements_is_refused(tmp_path: Path) -> None:
    from services.pool import load_scenario
    from services.pool.errors import ScenarioError

    text = (ROOT / "scenarios/small.toml").read_text()
    assert 'requirements = "TARGET.GPUs >= 1"' in text
    hostile = tmp_path / "random.toml"
    hostile.write_text(text.replace('requirements = "TARGET.GPUs >= 1"',
                                    'requirements = "TARGET.GPUs >= 1 && random() < 0.5"'))
    with pytest.raises(ScenarioError, match=r"requirements.*random\(\), which is nondeterministic"):
        load_scenario(hostile)


def test_a_job_whose_requirements_cannot_be_evaluated_is_refused_with_the_reason(
        pool: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The active negotiator (and the standby after it) goes on: the job is rejected with
    the reason, which `why` shows; the other jobs are matched."""
    from schemas.settings import load_settings
    from services.negotiator.daemon import NegotiatorDaemon
    from streams.log.events import ensure_topics, open_log
    from streams.log.lease import FileLease

    before = []
    for e in events(pool):
        if e["type"] == "negotiation.cycle":
            break
        before.append(e)
    job = next(e for e in before if e["type"] == "job.submitted")
    big = json.loads(json.dumps(job))
    big["id"], big["seq"], big["ts"] = "schedd@ap1.example.org:999999", 999999, before[-1]["ts"]
    big["data"]["job_id"] = "777.0"
    big["data"]["ad"].update(ClusterId=777, ProcId=0,
                             GlobalJobId="ap1.example.org#777.0#1763800000",
                             Requirements="/Expr(" + " + ".join(["TARGET.Cpus"] * 2000) + " > 0)/")
    home = tmp_path / "h"
    home.mkdir()
    log = open_log(None, home)
    try:
        ensure_topics(log)
        EventLog(log).append(EVENTS, [decode(orjson.dumps(e)) for e in [*before, big]])
        for k in range(2):  # the active one, then a standby folding the same log
            if k:  # an interval of event time later
                EventLog(log).append(EVENTS, [make_event(
                    AdInvalidated("Machine", "slot9@gone.example.org"), ts=big["ts"] + 120,
                    source="collector@cm.example.org", seq=1)])
            daemon = NegotiatorDaemon(log, load_settings(overrides={}),
                                      FileLease(tmp_path / "lease"), name="negotiator@cm.example.org",
                                      record_durations=False)
            daemon.follow()
            due = daemon.due()
            assert due is not None
            done = daemon.negotiate(due)
            assert done
            cycled = next(p for p in done if isinstance(p, NegotiationCycled))
            assert any("777.0" in str(r.get("jobs")) for r in cycled.rejections.values())
            daemon.lease.release()
    finally:
        log.close()
    rc, out, err = cli(capsys, home, "why", "777.0")
    assert rc == 0, err
    assert ("requirements (28001 characters): nested too deep or too much work for a ClassAd "
            "evaluator") in out


def test_a_config_naming_20000_groups_does_not_take_userprio_minutes(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It took over five minutes (every group's children found by a scan of all groups);
    now about four seconds. The bound is generous: a quadratic walk misses it by far."""
    append_raw(home, [{"id": "admin@cm:groups", "type": "config.changed", "v": 1,
                       "ts": last_ts(home), "source": "admin@cm", "seq": 1,
                       "data": {"knob": "GROUP_NAMES", "by": "root@localhost",
                                "value": ",".join(f"group_g{i}" for i in range(20000))}}])
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                           "userprio", "-quotas"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    took = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "group_g19999" in proc.stdout
    assert took < 60, took


# --- item 12: hostile files ------------------------------------------------------------------

def dead_reasons(home: Path) -> list[str]:
    lg = EmbeddedLog(home / "log")
    try:
        return [d.reason for d in EventLog(lg).dead_letters(EVENTS)]
    finally:
        lg.close()


def test_a_nul_byte_is_one_refused_ad_not_a_traceback(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "nul.hist"
    hist.write_bytes(b'ClusterId = 1\nProcId = 0\nOwner = "a\x00b"\n*** Offset = 0\n'
                     b'ClusterId = 2\nProcId = 0\nGlobalJobId = "ap#2.0#1"\n'
                     b'CompletionDate = 1763800000\n*** Offset = 1\n')
    status = tmp_path / "nul.status"
    status.write_bytes(b'MyType = "Machine"\nName = "slot1@a\x00"\n\n')
    rc, out, err = cli(capsys, tmp_path / "h", "log", "import-history", str(hist))
    assert rc == 1 and "Traceback" not in err
    assert out.startswith("imported 1 job ads into poolledger.events (0 already there); 1 malformed")
    rc, out, err = cli(capsys, tmp_path / "h", "log", "import-status", str(status))
    assert rc == 1 and out.startswith("imported 0 ads") and "Traceback" not in err
    assert dead_reasons(tmp_path / "h") == [
        f"{hist}:3: attribute Owner: a NUL character (ClassAds cannot hold one)",
        f"{status}:2: attribute Name: a NUL character (ClassAds cannot hold one)"]


def test_a_latin1_history_file_is_read_as_written_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "latin1.hist"
    hist.write_bytes('ClusterId = 3\nProcId = 0\nGlobalJobId = "ap#3.0#1"\nOwner = "José"\n'
                     'CompletionDate = 1763800000\n*** Offset = 0\n'.encode("latin-1"))
    rc, out, err = cli(capsys, tmp_path / "h", "log", "import-history", str(hist))
    assert rc == 0, err
    assert out.splitlines()[1] == f"read as Latin-1 (not UTF-8, as the schedd wrote the bytes): {hist}:4"
    lg = EmbeddedLog(tmp_path / "h" / "log")
    try:
        [(_, env)] = list(EventLog(lg).read(EVENTS))
    finally:
        lg.close()
    assert env.data.ad["Owner"] == "José"


def test_a_dump_cut_mid_ad_refuses_the_half_ad(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    dump = (DATA / "status.sample").read_text()
    assert dump.endswith("\n\n")  # condor_status -l ends every ad with a blank line
    lines = dump.splitlines(keepends=True)
    second = next(k for k in range(1, len(lines)) if lines[k - 1] == "\n")
    cut = tmp_path / "cut.status"
    cut.write_text("".join(lines[:second + 3]))  # the second ad's first three lines
    rc, out, err = cli(capsys, tmp_path / "h", "log", "import-status", str(cut))
    assert rc == 1 and out.startswith("imported 1 ads into poolledger.events (0 already there); "
                                      "1 malformed")
    assert dead_reasons(tmp_path / "h") == [
        f"{cut}:{second + 1}: the file ends inside this ad (no `***` banner or blank line after "
        "it, which HTCondor writes after every ad): a copy cut mid-ad?"]
    hist = tmp_path / "cut.hist"
    hist.write_text((DATA / "history.sample").read_text().rsplit("***", 1)[0])
    rc, out, err = cli(capsys, tmp_path / "h2", "log", "import-history", str(hist))
    assert rc == 1 and "2 job ads" in out and "1 malformed" in out


def test_a_100_mb_attribute_is_streamed_not_read_whole(tmp_path: Path) -> None:
    hist = tmp_path / "huge.hist"
    with hist.open("w") as f:
        f.write('ClusterId = 5\nProcId = 0\nGlobalJobId = "ap#5.0#1"\nBig = "')
        for _ in range(100):
            f.write("x" * 1_000_000)
        f.write('"\nCompletionDate = 1763800000\n*** Offset = 0\n'
                'ClusterId = 6\nProcId = 0\nGlobalJobId = "ap#6.0#1"\n'
                'CompletionDate = 1763800000\n*** Offset = 1\n')

    def peak(*args: str) -> tuple[int, subprocess.CompletedProcess[str]]:
        code = ("import resource, sys; from services.cli import main; rc = main(sys.argv[1:]); "
                "print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); "
                "sys.exit(rc)")
        proc = subprocess.run([sys.executable, "-c", code, "--home", str(tmp_path / "h"), *args],
                              capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        return int(proc.stdout.split("maxrss ")[1]), proc

    base, _ = peak("log", "info")
    used, proc = peak("log", "import-history", str(hist))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stdout.startswith("imported 1 job ads into poolledger.events (0 already there); "
                                  "1 malformed")
    assert f"{hist}:1: line 4 is longer than" in proc.stderr
    assert used - base < 50_000, (base, used)  # kB: the 100 MB were never held


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_history_update_on_a_full_disk_is_one_line(pool: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    size = (pool / "log" / "log.sqlite").stat().st_size + 64 * 1024
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                   check=True)
    try:
        shutil.copytree(pool / "log", disk / "log")
        rc, out, err = cli(capsys, disk, "history", "update")
        assert rc == 1
        one_line(err, "poolledger history: ")
        assert "No space left on device" in err
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# --- item 14: damage under a snapshot ------------------------------------------------------------

def _snapshotted_with_an_edit(home: Path, capsys: pytest.CaptureFixture[str]) -> int:
    """Two snapshots with three imported events between them, then an admin edit and a third
    snapshot; the offset of the middle imported event."""
    assert main(["--home", str(home), "log", "snapshot"]) == 0
    ts = last_ts(home)
    more = home / "more.jsonl"
    more.write_text("".join(json.dumps({
        "id": f"collector@cm:x{i}", "type": "ad.invalidated", "v": 1, "ts": ts,
        "source": "collector@cm", "seq": i + 1,
        "data": {"ad_type": "Machine", "name": f"gone{i}"}}) + "\n" for i in range(3)))
    lg = EmbeddedLog(home / "log")
    try:
        middle = lg.end_offsets(EVENTS)[0] + 1
    finally:
        lg.close()
    assert main(["--home", str(home), "log", "import", str(more)]) == 0
    assert main(["--home", str(home), "userprio", "-setfactor", "alice@example.org", "2000",
                 "--reason", "review"]) == 0
    assert main(["--home", str(home), "log", "snapshot"]) == 0
    capsys.readouterr()
    return middle


def _spoil(home: Path, offset: int, how: str) -> None:
    import sqlite3

    con = sqlite3.connect(home / "log" / "log.sqlite")
    try:
        (rid,) = con.execute("SELECT r.id FROM records r, partitions p, topics t WHERE "
                             "t.name = ? AND p.topic = t.id AND r.id = (p.id << 40) + ?",
                             (EVENTS, offset)).fetchone()
        con.execute(f"{how} WHERE id = ?", (rid,))
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("how,reason", [
    ("DELETE FROM records", "missing (offsets must be dense)"),
    ("UPDATE records SET crc = crc + 1", "checksum mismatch (the record was altered on disk)")])
def test_a_query_from_a_snapshot_says_once_that_the_log_under_it_is_damaged(
        home: Path, capsys: pytest.CaptureFixture[str], how: str, reason: str) -> None:
    middle = _snapshotted_with_an_edit(home, capsys)
    for args in (["userprio"], ["status", "-total"]):
        rc, out, err = cli(capsys, home, *args)
        assert rc == 0 and err == ""
    _spoil(home, middle, how)
    for args in (["userprio"], ["status", "-total"]):
        rc, out, err = cli(capsys, home, *args)
        assert rc == 0 and out  # it answers, and says so once
        assert err.splitlines() == [
            f"poolledger {args[0]}: warning: the log is damaged at {EVENTS}[0]@{middle}: "
            f"{reason}, under the snapshot at {EVENTS}@{middle + 3} this answer comes from "
            "(`poolledger log verify` lists every problem; `poolledger log salvage` copies "
            "what is readable)"]


def test_salvage_of_a_log_with_two_snapshots_keeps_the_admin_edit(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    middle = _snapshotted_with_an_edit(home, capsys)
    _spoil(home, middle, "UPDATE records SET crc = crc + 1")
    rc, out, err = cli(capsys, home, "log", "salvage", str(home / "rescued" / "log"))
    assert rc == 1 and f"LOST {EVENTS}[0]@{middle}: checksum mismatch" in out
    assert f"the snapshot at {EVENTS}@{middle + 2} is not copied" in err  # the import's
    rc, out, err = cli(capsys, home / "rescued", "userprio", "--json")
    assert rc == 0, err
    factors = {s["Name"]: s["PriorityFactor"] for s in json.loads(out)["Submitters"]}
    assert factors["alice@example.org"] == 2000.0
