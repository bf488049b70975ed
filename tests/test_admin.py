"""Admin edits a ledger can trust (issue 10, reproductions 4, 6 and 7): the edit's time, who
may make it, who is recorded, and configuration that is refused instead of swallowed."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from services.admin import Identity, edit_time, matches_entry
from tests.test_cli import T0, cli, write_log

REAL_USER = pwd.getpwuid(os.getuid()).pw_name


def _imported(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    res = cli(home, "log", "import", str(write_log(tmp_path / "events.jsonl")))
    assert res.returncode == 0, res.stderr
    return home


def _events(home: Path, tmp_path: Path) -> list[dict[str, object]]:
    out = tmp_path / "export.jsonl"
    assert cli(home, "log", "export", str(out)).returncode == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _rows(home: Path) -> dict[str, dict[str, float]]:
    res = cli(home, "userprio", "--json")
    assert res.returncode == 0, res.stderr
    return {r["Name"]: r for r in json.loads(res.stdout)["Submitters"]}


def test_edit_on_a_log_of_the_past_is_placed_at_the_logs_time(tmp_path: Path) -> None:
    """Reproduction 4: an edit on a finished log used to be stamped a year later, so bob
    (untouched) decayed for a year; now it lands at the log's last event time."""
    home = _imported(tmp_path)
    before = _rows(home)
    res = cli(home, "userprio", "-setfactor", "alice@example.org", "2000", "--reason", "review")
    assert res.returncode == 0, res.stderr
    assert "the log is of the past" in res.stdout and "placed at the log's time" in res.stdout
    edit = _events(home, tmp_path)[-1]
    assert edit["type"] == "admin.command" and edit["ts"] == T0 + 24 * 3600
    after = _rows(home)
    assert after["bob@example.org"] == before["bob@example.org"]  # untouched stays untouched
    assert after["alice@example.org"]["PriorityFactor"] == 2000.0
    assert after["alice@example.org"]["Priority"] == before["alice@example.org"]["Priority"]


def test_edit_time_rule() -> None:
    now = 2_000_000_000.0
    live = edit_time(now - 30, now, 3600)
    assert live.ts == now and live.note is None
    assert edit_time(None, now, 3600).ts == now  # an empty log is live
    ahead = edit_time(now + 60, now, 3600)  # a live log slightly ahead: never before it
    assert ahead.ts == now + 60 and ahead.note is None
    past = edit_time(now - 400 * 86400, now, 3600)
    assert past.ts == now - 400 * 86400 and past.note and "of the past" in past.note
    future = edit_time(now + 400 * 86400, now, 3600)
    assert future.ts == now + 400 * 86400 and future.note and "ahead" in future.note


def test_edit_on_a_live_log_carries_the_time_it_was_issued(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lines = []
    now = time.time()
    for i, ts in enumerate((now - 120, now - 60)):
        lines.append(json.dumps({"id": f"schedd@ap1:{i + 1}", "type": "job.started", "v": 1,
                                 "ts": ts, "source": "schedd@ap1", "seq": i + 1,
                                 "data": {"job_id": f"1.{i}", "schedd": "schedd@ap1",
                                          "submitter": "alice@example.org",
                                          "slot": f"slot{i}@ep1", "slot_weight": 1.0}}))
    log = tmp_path / "live.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert cli(home, "log", "import", str(log)).returncode == 0
    before = time.time()
    res = cli(home, "userprio", "-setfactor", "alice@example.org", "10")
    assert res.returncode == 0, res.stderr
    assert "note:" not in res.stdout
    edit = _events(home, tmp_path)[-1]
    assert before <= float(edit["ts"]) <= time.time()  # type: ignore[arg-type]


def test_by_is_the_real_user_not_the_environment(tmp_path: Path) -> None:
    """Reproduction 7: `USER=condor_admin poolledger userprio ...` was audited as condor_admin."""
    home = _imported(tmp_path)
    res = cli(home, "userprio", "-setfactor", "alice@example.org", "2000",
              env={"USER": "condor_admin", "LOGNAME": "condor_admin", "USERNAME": "condor_admin"})
    assert res.returncode == 0, res.stderr
    by = str(_events(home, tmp_path)[-1]["data"]["by"])  # type: ignore[index]
    assert by.startswith(f"{REAL_USER}@") and "condor_admin" not in by
    assert by.endswith("/" + (socket.getfqdn() or socket.gethostname()))
    audit = cli(home, "audit", "alice@example.org")
    assert f"by {by}" in audit.stdout and "condor_admin" not in audit.stdout


def test_refused_edit_says_permission_denied_and_appends_nothing(tmp_path: Path) -> None:
    home = _imported(tmp_path)
    before = _events(home, tmp_path)
    conf = tmp_path / "condor_config"
    conf.write_text("ALLOW_ADMINISTRATOR = condor@example.org/cm.example.org\n")
    res = cli(home, "--config", str(conf), "userprio", "-setfactor", "alice@example.org", "5")
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "permission denied:" in res.stderr
    assert f"{REAL_USER}@" in res.stderr and "ALLOW_ADMINISTRATOR" in res.stderr
    assert _events(home, tmp_path) == before
    # DENY wins over ALLOW
    conf.write_text(f"ALLOW_ADMINISTRATOR = *\nDENY_ADMINISTRATOR = {REAL_USER}@*/*\n")
    res = cli(home, "--config", str(conf), "userprio", "-setfactor", "alice@example.org", "5")
    assert res.returncode == 1 and "DENY_ADMINISTRATOR" in res.stderr
    # a flag or the environment cannot grant the right to itself
    for extra, env in ((("--set", "ALLOW_ADMINISTRATOR=*"), None),
                       ((), {"POOLLEDGER_ALLOW_ADMINISTRATOR": "*"})):
        res = cli(home, *extra, "userprio", "-setfactor", "alice@example.org", "5", env=env)
        assert res.returncode == 1 and "permission denied: ALLOW_ADMINISTRATOR" in res.stderr
    assert _events(home, tmp_path) == before
    # the admitted identity, by HTCondor's user@domain/host form with wildcards
    conf.write_text(f"ALLOW_ADMINISTRATOR = nobody@x/y, {REAL_USER}@*/*\n")
    res = cli(home, "--config", str(conf), "userprio", "-setfactor", "alice@example.org", "5")
    assert res.returncode == 0, res.stderr
    assert len(_events(home, tmp_path)) == len(before) + 1


def _authorize_as(uid: int, home: Path) -> str:
    """services.admin.authorize run in a forked child whose real uid is `uid` (no exec: the
    venv need not be readable by that user); the identity it admits or the refusal."""
    from schemas.settings import load_settings
    from services.admin import PermissionDeniedError, authorize

    settings = load_settings(config_path=[], env={})
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rd)
        try:
            os.setgid(65534)
            os.setuid(uid)
            try:
                text = "ok " + str(authorize(settings, home, "-setfactor"))
            except PermissionDeniedError as exc:
                text = str(exc)
            os.write(wr, text.encode())
        finally:
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_default_admits_only_root_and_the_data_directory_owner(request: pytest.FixtureRequest) -> None:
    """ALLOW_ADMINISTRATOR unset: root and the data directory's owner, nobody else."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as other users")
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="poolledger-admin-"))  # one the other user can stat
    base.chmod(0o755)
    home = base / "home"
    home.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    refused = _authorize_as(nobody.pw_uid, home)
    assert refused.startswith("permission denied: nobody@") and "only root" in refused
    os.chown(home, nobody.pw_uid, -1)
    assert _authorize_as(nobody.pw_uid, home).startswith("ok nobody@")
    assert _authorize_as(0, home).startswith("ok root@")


@pytest.mark.parametrize("entry, allowed", [
    ("*", True), ("alice@example.org/ap1.example.org", True), ("alice@example.org", True),
    ("alice@*/*.example.org", True), ("*@example.org/*", True), ("ap1.example.org", True),
    ("*.example.org", True), ("AP1.EXAMPLE.ORG", True), ("alice/ap1.example.org", True),
    ("Alice@example.org", False), ("bob@example.org/*", False), ("alice@example.org/cm.*", False),
    ("*@other.org", False), ("*.other.org", False),
])
def test_administrator_entries_follow_htcondor_forms(entry: str, allowed: bool) -> None:
    assert matches_entry(entry, Identity("alice", "example.org", "ap1.example.org")) is allowed


def test_setprio_below_the_minimum_priority_is_refused(tmp_path: Path) -> None:
    """Reproduction 6: `-setprio alice@x -5` said "set to -5" and stored 0.5."""
    home = _imported(tmp_path)
    before = _events(home, tmp_path)
    res = cli(home, "userprio", "-setprio", "alice@example.org", "-5")
    assert res.returncode == 2 and "0.5" in res.stderr and "minimum priority" in res.stderr
    assert "set to" not in res.stdout
    for args in (("-setaccum", "alice@example.org", "-1"), ("-setceiling", "alice@example.org", "-2"),
                 ("-setbegin", "alice@example.org", "-7")):
        assert cli(home, "userprio", *args).returncode == 2
    assert _events(home, tmp_path) == before
    ok = cli(home, "userprio", "-setprio", "alice@example.org", "0.5")
    assert ok.returncode == 0 and "set to 0.500000" in ok.stdout


def test_unknown_knob_on_the_command_line_exits_2_with_the_closest_name(tmp_path: Path) -> None:
    log = write_log(tmp_path / "events.jsonl")
    res = cli(tmp_path / "h", "--set", "PRIORITY_HALFLIF=3600", "replay", "--log", str(log))
    assert res.returncode == 2
    assert "unknown knob PRIORITY_HALFLIF" in res.stderr
    assert "did you mean PRIORITY_HALFLIFE" in res.stderr
    assert "what-if" not in res.stdout  # the banner never repeats an unapplied typo
    # families are known names
    fam = cli(tmp_path / "h", "--set", "GROUP_QUOTA_physics=3", "--set", "XSW_LIMIT=4",
              "--set", "CONCURRENCY_LIMIT_DEFAULT_small=3", "--set", "SLOT_TYPE_1=cpus=2",
              "--set", "NEGOTIATOR_SLOT_CONSTRAINT_gpu=true", "replay", "--log", str(log))
    assert fam.returncode == 0, fam.stderr
    assert "XSW_LIMIT=4" in fam.stdout  # applied, so in the banner


def test_unknown_knob_in_a_file_warns_with_file_line_and_closest_name(tmp_path: Path) -> None:
    conf = tmp_path / "condor_config"
    conf.write_text("# pool\nNEGOTIATOR_INTERVL = 30\nMY_SITE = x\nSTART = $(MY_SITE) == \"x\"\n")
    res = cli(tmp_path / "h", "--config", str(conf), "config", "show", "NEGOTIATOR_INTERVAL")
    assert res.returncode == 0
    assert f"{conf}:2: unknown knob NEGOTIATOR_INTERVL (did you mean NEGOTIATOR_INTERVAL?)" \
        in res.stderr
    assert "MY_SITE" not in res.stderr  # a macro used by another value is the user's own


def _scenario(tmp_path: Path, config: str) -> Path:
    src = (Path(__file__).resolve().parents[1] / "scenarios" / "small.toml").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(src.replace("[config]\n", "[config]\n" + config, 1))
    return path


def test_scenario_config_is_validated_before_the_run(tmp_path: Path) -> None:
    """Reproduction 6: `PRIORITY_HALFLIFE = -1` in [config] was counted as applied, exit 0."""
    path = _scenario(tmp_path, "PRIORITY_HALFLIFE = -1\n")
    res = cli(tmp_path / "h", "run", str(path), "--out", str(tmp_path / "out"), "--quiet")
    assert res.returncode == 2
    assert str(path) in res.stderr and "PRIORITY_HALFLIFE" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "log").exists()


@pytest.mark.parametrize("hours", ["nan", "inf", "-1", "0", "1e9"])
def test_run_hours_must_be_finite_and_positive(tmp_path: Path, hours: str) -> None:
    res = cli(tmp_path / "h", "run", "small", "--hours", hours, "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "--hours" in res.stderr


def test_edit_during_a_run_is_folded_at_the_runs_time_and_matchmaking_goes_on(
        tmp_path: Path) -> None:
    """Reproduction 4: an edit issued while `run` appends to the same log stopped matchmaking
    for the rest of the run, and the run's table then disagreed with a replay of its log."""
    from schemas.settings import load_settings
    from services.pool import load_scenario
    from services.commands.userprio.views import format_userprio
    from streams.replay import jsonl_events, replay

    home, out, hours = tmp_path / "home", tmp_path / "out", 24
    run = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "--home", str(home), "run", "small", "--hours",
         str(hours), "--out", str(out), "--quiet"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the run has appended some hours
            info = cli(home, "log", "info")
            counts = [int(w.split("=")[1]) for line in info.stdout.splitlines()
                      if line.startswith("poolledger.events ") for w in line.split()
                      if w.startswith("events=")]
            if counts and counts[0] > 3000:
                break
            time.sleep(0.5)
        edit = cli(home, "userprio", "-setfactor", "alice@example.org", "2000", "--reason", "mid-run")
        assert edit.returncode == 0, edit.stderr
        assert run.poll() is None, "the run ended before the edit: make it longer"
        stdout, stderr = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, stderr
    events = list(jsonl_events(out / "events.jsonl", []))
    edits = [e for e in events if e.type == "admin.command"
             and e.data.reason == "mid-run"]  # type: ignore[attr-defined]
    assert len(edits) == 1
    scenario = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "small.toml")
    end = scenario.start + hours * 3600.0
    assert edits[0].ts <= end  # never ahead of the run's clock
    later = [e for e in events if e.type == "match" and e.ts > edits[0].ts + 3600]
    assert later, "matchmaking stopped after the edit"
    led = replay(events, load_settings())
    table = format_userprio(led.priorities(end), now=end,
                            last_update=led.accountant.last_update_time or end,
                            groups=led.group_quotas())
    assert table in stdout  # the run's own table equals a replay of its own log
    assert "2000.00" in table
