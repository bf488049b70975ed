"""The CLI as a user meets it: exit codes and messages that name the culprit, nothing appended
on bad input, and the replay/audit/userprio views over a known log."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from schemas.events import AdminCommanded, JobStarted, JobStopped, NegotiationCycled, make_event
from services.cli import main

T0 = 1_763_800_000.0
H = 3600.0


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home), *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def write_log(path: Path) -> Path:
    """alice runs 10 slots for 24 h; bob 2 slots (weight 2) for 12 h; an admin edit."""
    evs = []
    seq = 0

    def add(payload: object, ts: float, source: str = "schedd@ap1") -> None:
        nonlocal seq
        seq += 1
        evs.append(make_event(payload, ts=ts, source=source, seq=seq))  # type: ignore[arg-type]

    for i in range(10):
        add(JobStarted(f"1.{i}", "schedd@ap1", "alice@example.org", f"slot{i}@ep1", 1.0), T0)
    for i in range(2):
        add(JobStarted(f"2.{i}", "schedd@ap1", "bob@example.org", f"slot{i}@ep2", 2.0), T0)
    for i in range(2):
        add(JobStopped(f"2.{i}", f"slot{i}@ep2", "completed", "schedd@ap1", "bob@example.org"),
            T0 + 12 * H)
    add(AdminCommanded("setfactor", "bob@example.org", 500.0, "root", "VIP"), T0 + 13 * H)
    add(NegotiationCycled("negotiator", 1, T0 + 24 * H), T0 + 24 * H, "negotiator")
    path.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in evs))
    return path


@pytest.fixture()
def log_file(tmp_path: Path) -> Path:
    return write_log(tmp_path / "events.jsonl")


def test_import_export_roundtrip_and_bad_lines(tmp_path: Path, log_file: Path) -> None:
    home = tmp_path / "home"
    ok = cli(home, "log", "import", str(log_file))
    assert ok.returncode == 0, ok.stderr
    assert "imported 16 events" in ok.stdout
    out = tmp_path / "out.jsonl"
    exp = cli(home, "log", "export", str(out))
    assert exp.returncode == 0
    # byte for byte, but for the admin edit: its importer is who appended it (issue 28), and
    # the `by` the file carried is kept as a claim
    sent, got = log_file.read_bytes().splitlines(), out.read_bytes().splitlines()
    same = [i for i, line in enumerate(sent) if b'"admin.command"' not in line]
    assert len(got) == len(sent) and [got[i] for i in same] == [sent[i] for i in same]
    edit = [orjson.loads(line) for line in got if b'"admin.command"' in line]
    assert len(edit) == 1 and edit[0]["data"]["claimed_by"] == "root"
    assert edit[0]["data"]["by"].startswith(f"{pwd.getpwuid(os.getuid()).pw_name}@")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(log_file.read_text().splitlines()[0] + "\n{oops\n"
                   '{"id":"x:1","type":"job.started","v":1,"ts":1,"source":"x","seq":1,"data":{}}\n')
    res = cli(home, "log", "import", str(bad))
    assert res.returncode == 1
    assert "2 rejected" in res.stdout
    info = cli(home, "log", "info")
    assert "poolledger.events.dlq" in info.stdout
    dlq_line = [line for line in info.stdout.splitlines() if line.startswith("poolledger.events.dlq")][0]
    assert "events=2" in dlq_line
    missing = cli(home, "log", "import", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 1 and "nope.jsonl: no such file" in missing.stderr


def test_bad_knob_exits_2_naming_knob_and_file_line(tmp_path: Path) -> None:
    conf = tmp_path / "condor_config"
    conf.write_text("# pool\nPRIORITY_HALFLIFE = 86400\nDEFAULT_PRIO_FACTOR = lots\n")
    res = cli(tmp_path / "h", "--config", str(conf), "config", "show", "DEFAULT_PRIO_FACTOR")
    assert res.returncode == 2
    assert "DEFAULT_PRIO_FACTOR" in res.stderr and f"{conf}:3" in res.stderr
    env_bad = cli(tmp_path / "h", "config", "show", env={"POOLLEDGER_PRIORITY_HALFLIFE": "soon"})
    assert env_bad.returncode == 2 and "POOLLEDGER_PRIORITY_HALFLIFE" in env_bad.stderr
    set_bad = cli(tmp_path / "h", "--set", "NOEQUALS", "config", "show")
    assert set_bad.returncode == 2 and "NOEQUALS" in set_bad.stderr
    shown = cli(tmp_path / "h", "--config", str(conf), "--set", "PRIORITY_HALFLIFE=3600",
                "config", "show", "PRIORITY_HALFLIFE")
    assert shown.returncode == 2  # the bad DEFAULT_PRIO_FACTOR still poisons the config
    good = tmp_path / "good_config"
    good.write_text("PRIORITY_HALFLIFE = 7200\n")
    shown = cli(tmp_path / "h", "--config", str(good), "config", "show", "PRIORITY_HALFLIFE")
    assert shown.returncode == 0 and "PRIORITY_HALFLIFE = 7200" in shown.stdout
    assert f"{good}:1" in shown.stdout


def test_unknown_command_input_exits_nonzero(tmp_path: Path, log_file: Path) -> None:
    assert cli(tmp_path, "replay", "--log", str(log_file), "--until", "#x").returncode == 2
    res = cli(tmp_path, "replay", "--log", str(log_file), "--until", "next tuesday")
    assert res.returncode == 2 and "'next tuesday'" in res.stderr
    res = cli(tmp_path, "audit", "nobody@example.org", "--log", str(log_file))
    assert res.returncode == 1 and "nobody@example.org" in res.stderr


@pytest.mark.parametrize("args, message", [
    (("-setfactor", "alice", "5"), "You must specify the full name of the submittor"),
    (("-setprio", "alice", "5"), "full name"),
    (("-setfactor", "alice@example.org", "0.5"), "greater than or equal to 1"),
    (("-setfloor", "alice@example.org", "-3"), "floor"),
    (("-setfactor", "group_nonexistent", "5"), "to update the priority of (user@uid.domain"),
    (("-setprio", "alice@example.org", "high"), "'high' is not a number"),
])
def test_userprio_edit_rejected_appends_nothing(tmp_path: Path, log_file: Path,
                                                args: tuple[str, ...], message: str) -> None:
    home = tmp_path / "home"
    assert cli(home, "log", "import", str(log_file)).returncode == 0
    before = tmp_path / "before.jsonl"
    cli(home, "log", "export", str(before))
    res = cli(home, "userprio", *args)
    assert res.returncode == 2  # bad input from the user: a usage error
    assert message in res.stderr
    out = tmp_path / "after.jsonl"
    cli(home, "log", "export", str(out))
    assert out.read_bytes() == before.read_bytes()  # nothing appended


def test_userprio_edit_appends_who_and_why(tmp_path: Path, log_file: Path) -> None:
    home = tmp_path / "home"
    cli(home, "log", "import", str(log_file))
    res = cli(home, "userprio", "-setfactor", "alice@example.org", "2000", "--reason", "quota review")
    assert res.returncode == 0, res.stderr
    assert "The priority factor of alice@example.org was set to 2000.000000" in res.stdout
    out = tmp_path / "after.jsonl"
    cli(home, "log", "export", str(out))
    last = json.loads(out.read_text().splitlines()[-1])
    assert last["type"] == "admin.command"
    assert last["data"]["op"] == "setfactor" and last["data"]["value"] == 2000.0
    assert last["data"]["reason"] == "quota review" and last["data"]["by"]
    shown = cli(home, "userprio", "--json")
    rows = {r["Name"]: r for r in json.loads(shown.stdout)["Submitters"]}
    assert rows["alice@example.org"]["PriorityFactor"] == 2000.0


def test_replay_json_uses_htcondor_names_and_numbers(tmp_path: Path, log_file: Path) -> None:
    res = cli(tmp_path, "replay", "--log", str(log_file), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = {r["Name"]: r for r in doc["Submitters"]}
    alice = rows["alice@example.org"]
    # 10 slots for 24 h from 0.5 with a one-day half-life: 0.5*0.5 + 10*(1-0.5) = 5.25
    assert alice["Priority"] == pytest.approx(5.25, rel=1e-9)
    assert alice["EffectivePriority"] == pytest.approx(5250.0, rel=1e-9)
    assert alice["WeightedAccumulatedUsage"] == pytest.approx(10 * 24 * H)
    bob = rows["bob@example.org"]
    assert bob["PriorityFactor"] == 500.0
    assert bob["WeightedAccumulatedUsage"] == pytest.approx(2 * 2 * 12 * H)
    for key in ("Priority", "PriorityFactor", "ResourcesUsed", "WeightedResourcesUsed",
                "AccumulatedUsage", "WeightedAccumulatedUsage", "BeginUsageTime", "LastUsageTime",
                "Floor", "Ceiling", "EffectivePriority"):
        assert key in alice
    # What-if: a 12 h half-life decays further in the same log.
    whatif = cli(tmp_path, "--set", "PRIORITY_HALFLIFE=43200", "replay", "--log", str(log_file),
                 "--json")
    alt = {r["Name"]: r for r in json.loads(whatif.stdout)["Submitters"]}["alice@example.org"]
    assert alt["Priority"] == pytest.approx(0.5 * 0.25 + 10 * 0.75, rel=1e-9)
    # State at a time: 12 h in, alice has 0.5*0.5**0.5 + 10*(1-0.5**0.5).
    half = cli(tmp_path, "replay", "--log", str(log_file), "--until", str(T0 + 12 * H), "--json")
    at12 = {r["Name"]: r for r in json.loads(half.stdout)["Submitters"]}["alice@example.org"]
    assert at12["Priority"] == pytest.approx(0.5 * 0.5**0.5 + 10 * (1 - 0.5**0.5), rel=1e-9)


def test_audit_table_json_and_plot(tmp_path: Path, log_file: Path) -> None:
    png = tmp_path / "bob.png"
    res = cli(tmp_path, "audit", "bob@example.org", "--log", str(log_file), "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert "setfactor 500.0 by root because 'VIP'" in res.stdout
    assert "started on slot0@ep2 (SlotWeight 2)" in res.stdout
    assert png.stat().st_size > 10_000
    rows = json.loads(cli(tmp_path, "audit", "bob@example.org", "--log", str(log_file),
                          "--json").stdout)
    admin = [r for r in rows if r["EventType"] == "admin.command"][0]
    assert admin["PriorityFactor"] == 500.0
    stops = [r for r in rows if r["EventType"] == "job.stopped"]
    # Two weight-2 slots for 12 h from 0.5: 0.5*2**-0.5 + 4*(1-2**-0.5)
    assert stops[0]["PriorityBefore"] == pytest.approx(0.5 * 2**-0.5 + 4 * (1 - 2**-0.5), rel=1e-9)


def test_audit_shows_a_ceiling_lease_and_who_set_it(tmp_path: Path, log_file: Path) -> None:
    lease = make_event(AdminCommanded("setceil", "alice@example.org", 4.0, "root", "runaway jobs",
                                      3600.0), ts=T0 + 20 * H, source="userprio@cm", seq=1)
    with log_file.open("ab") as f:
        f.write(orjson.dumps(lease.to_dict()) + b"\n")
    rows = json.loads(cli(tmp_path, "audit", "alice@example.org", "--log", str(log_file),
                          "--json").stdout)
    edit = [r for r in rows if r["EventType"] == "admin.command"]
    assert len(edit) == 1 and edit[0]["Ceiling"] == 4.0
    assert "setceil 4.0 for 3600s by root because 'runaway jobs'" in edit[0]["Cause"]
    assert all(r["Ceiling"] == -1.0 for r in rows if r["Time"] < T0 + 20 * H)


def test_userprio_table_golden(tmp_path: Path, log_file: Path) -> None:
    res = cli(tmp_path, "userprio", "-allusers", "--log", str(log_file))
    assert res.returncode == 0, res.stderr
    golden = Path(__file__).parent / "data" / "userprio" / "cli_allusers.txt"
    assert res.stdout == golden.read_text()


def test_main_in_process_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "userprio" in capsys.readouterr().out


def test_an_unreachable_broker_is_one_line_within_ten_seconds(tmp_path: Path) -> None:
    """Issue 10: a closed broker port answers with one line, exit 1, no traceback, and fast
    (the admin client's 6 s bootstrap timeout; kafka-python's default would take 30 s)."""
    import time

    from compose.kafka import free_port

    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(tmp_path),
                          "--broker", f"kafka://127.0.0.1:{free_port()}", "userprio"],
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no answer from the cluster" in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert took < 20.0, took  # generous for a loaded machine; the old path took > 30 s


def test_log_export_and_import_follow_the_global_topic(tmp_path: Path, log_file: Path) -> None:
    """`poolledger --topic T log import/export` work on T (a `--broker ... run`'s own topic),
    as every query command does; the subcommand's own `--topic` still wins."""
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import ensure_topics
    from streams.log.port import TopicSpec

    home = tmp_path / "home"
    lg = EmbeddedLog(home / "log")  # the run's topic exists, as a `--broker ... run` leaves it
    ensure_topics(lg)
    lg.create_topic(TopicSpec("poolledger.events.run1", 1))
    lg.close()
    ok = cli(home, "--topic", "poolledger.events.run1", "log", "import", str(log_file))
    assert ok.returncode == 0, ok.stderr
    assert "imported 16 events into poolledger.events.run1" in ok.stdout
    out = tmp_path / "run1.jsonl"
    got = cli(home, "--topic", "poolledger.events.run1", "log", "export", str(out))
    assert got.returncode == 0 and "exported 16 events from poolledger.events.run1" in got.stdout
    assert len(out.read_bytes().splitlines()) == 16
    other = cli(home, "--topic", "poolledger.events.run1", "log", "export", "--topic",
                "poolledger.events", str(tmp_path / "main.jsonl"))
    assert other.returncode == 0, other.stderr  # its own --topic wins: the empty main topic
    assert "exported 0 events from poolledger.events to" in other.stdout
