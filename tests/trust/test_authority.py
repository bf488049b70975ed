"""Authority, readers and files (issue 28, items 1, 2, 3, 13, 16), tried as a real non-root
user: a caller's own configuration cannot grant ADMINISTRATOR or an identity, imports of
priority edits and knob changes need ADMINISTRATOR and record the importer, an auditor who may
not write the data directory (or an archived log on a read-only file system) reads it, a log
is copied with its WAL, and nothing is written through a link or in a directory others may
change.

The user is made with `useradd` (the tests run as root; skipped, with the reason, elsewhere)
and runs `poolledger` through `runuser`, on an interpreter it may execute: ours, else the
system's of the same version with the venv's packages on its path."""
from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from schemas.events import AdminCommanded, ConfigChanged, decode, encode, make_event
from tests.test_cli import T0, write_log

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MAIN = "import sys; from services.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    python: str


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLLEDGER_")}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{sysconfig.get_paths()['purelib']}", HOME="/tmp")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    """A fresh non-root user (and its own group) for this module, removed afterwards."""
    if os.getuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser to create and act as a non-root user")
    name = f"pltr{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                           "/usr/sbin/nologin", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
        for python in (sys.executable, "/usr/bin/python3"):
            probe = subprocess.run(
                ["runuser", "-u", name, "--", python, "-c",
                 "import sys, msgspec; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, env=_clean_env())
            if probe.returncode == 0 and probe.stdout.strip() == wanted:
                break
        else:
            pytest.skip(f"no Python {wanted} that {name} may run with this venv's packages")
        yield User(name, entry.pw_uid, entry.pw_gid, python)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


def as_user(user: User, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`poolledger ARGS` run by `user`."""
    return subprocess.run(["runuser", "-u", user.name, "--", user.python, "-c", MAIN, *args],
                          capture_output=True, text=True, env=_clean_env(**env), cwd="/tmp")


def as_root(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True,
                          env=_clean_env(**env), cwd="/tmp")


@pytest.fixture
def base(request: pytest.FixtureRequest) -> Path:
    """A scratch directory every user may traverse (pytest's own are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="poolledger-trust-"))
    path.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    return path


def _owned_by(user: User, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.uid, user.gid)
    return path


@pytest.fixture
def root_home(base: Path) -> Path:
    """A data directory owned by root (0755) holding the test log (an admin edit included)."""
    home = base / "home"
    res = as_root("--home", str(home), "log", "import", str(write_log(base / "events.jsonl")))
    assert res.returncode == 0, res.stderr
    return home


def _exported(home: Path, base: Path) -> list[dict[str, object]]:
    out = base / f"export-{uuid.uuid4().hex[:6]}.jsonl"
    res = as_root("--home", str(home), "log", "export", str(out))
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def _one_line(text: str) -> str:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


# ------------------------------------------------------------------ 1: security knobs


def test_a_callers_own_configuration_cannot_grant_administrator_or_an_identity(
        user: User, base: Path, root_home: Path) -> None:
    before = _exported(root_home, base)
    mine = _owned_by(user, base / "mine") / "condor_config"
    mine.write_text("ALLOW_ADMINISTRATOR = *\n")
    os.chown(mine, user.uid, user.gid)
    edit = ("userprio", "-setfactor", "alice@example.org", "5")
    res = as_user(user, "--home", str(root_home), "--config", str(mine), *edit)
    assert res.returncode == 2
    line = _one_line(res.stderr)
    assert f"ALLOW_ADMINISTRATOR ({mine}:1)" in line and "security knob" in line
    assert f"owned by {user.name}" in line
    res = as_user(user, "--home", str(root_home), *edit, POOLLEDGER_CONFIG=str(mine))
    assert res.returncode == 2 and f"({mine}:1)" in _one_line(res.stderr)
    res = as_user(user, "--home", str(root_home), *edit, POOLLEDGER_ALLOW_ADMINISTRATOR="*")
    assert res.returncode == 2
    assert "ALLOW_ADMINISTRATOR (env POOLLEDGER_ALLOW_ADMINISTRATOR)" in _one_line(res.stderr)
    # the admin's ALLOW_ADMINISTRATOR = *@admins.example.org/*: the domain is no flag's to set
    admins = base / "condor_config"
    admins.write_text("ALLOW_ADMINISTRATOR = *@admins.example.org/*\n")
    for knob in ("UID_DOMAIN", "FULL_HOSTNAME"):  # the second decides UID_DOMAIN's default
        res = as_user(user, "--home", str(root_home), "--config", str(admins),
                      "--set", f"{knob}=admins.example.org", *edit)
        assert res.returncode == 2
        line = _one_line(res.stderr)
        assert line.startswith("poolledger userprio: configuration error: UID_DOMAIN")
        assert "security knob" in line and f"set by {user.name}" in line
    # the admin's own file counts, and the user is refused by it (not by a flag)
    res = as_user(user, "--home", str(root_home), "--config", str(admins), *edit)
    assert res.returncode == 1
    assert f"permission denied: {user.name}@" in _one_line(res.stderr)
    assert _exported(root_home, base) == before
    # a knob that grants nothing stays the caller's to set: a what-if replay
    res = as_user(user, "--home", str(root_home), "--set", "PRIORITY_HALFLIFE=3600", "replay")
    assert res.returncode == 0, res.stderr


def test_security_knobs_are_flagged_in_the_one_table() -> None:
    from schemas.knobs import find_knob

    for name in ("ALLOW_ADMINISTRATOR", "DENY_ADMINISTRATOR", "ALLOW_READ", "DENY_WRITE",
                 "SEC_DEFAULT_AUTHENTICATION_METHODS", "UID_DOMAIN", "POOLLEDGER_MAX_EVENT_SKEW",
                 "POOLLEDGER_LIVE_WINDOW", "POOLLEDGER_KAFKA_SASL_MECHANISM",
                 "POOLLEDGER_KAFKA_USER", "POOLLEDGER_KAFKA_PASSWORD"):
        knob = find_knob(name)
        assert knob is not None and knob.security, name
    assert not find_knob("PRIORITY_HALFLIFE").security  # type: ignore[union-attr]
    assert not find_knob("ALLOW_PSLOT_PREEMPTION").security  # type: ignore[union-attr]


# ------------------------------------------------------------------ 2: imports


def _forged(path: Path) -> Path:
    """A JSONL file of two admin events forged as root's, and one harmless event."""
    lines = [make_event(AdminCommanded("setfactor", "alice@example.org", 1.0,
                                       "admin@cm.example.org/cm.example.org", "forged"),
                        ts=T0 + 25 * 3600, source="userprio@x", seq=1, id="forged:1"),
             make_event(ConfigChanged("DEFAULT_PRIO_FACTOR", "1", "admin@cm.example.org/cm.example.org"),
                        ts=T0 + 25 * 3600, source="userprio@x", seq=2, id="forged:2")]
    harmless = orjson.loads(write_log(path.with_suffix(".base")).read_bytes().splitlines()[0])
    harmless["id"] = "harmless:1"
    path.write_bytes(b"\n".join([encode(e) for e in lines] + [orjson.dumps(harmless)]) + b"\n")
    return path


def test_imports_of_priority_edits_and_knob_changes_need_administrator(
        user: User, base: Path, root_home: Path) -> None:
    # the user's own data directory, under the admin's rule: only root administers
    home = _owned_by(user, base / "userhome")
    admins = base / "condor_config"
    admins.write_text("ALLOW_ADMINISTRATOR = root@*/*\n")
    forged = _forged(base / "forged.jsonl")
    res = as_user(user, "--home", str(home), "--config", str(admins), "log", "import",
                  str(forged))
    assert res.returncode == 1
    assert "imported 1 events" in res.stdout and "2 rejected" in res.stdout
    for where in (f"{forged}:1: admin.command 'forged:1'", f"{forged}:2: config.changed 'forged:2'"):
        assert f"{where}: permission denied: {user.name}@" in res.stderr
    got = _exported(home, base)
    assert [e["id"] for e in got] == ["harmless:1"]
    acct = as_user(user, "--home", str(home), "--config", str(admins), "log",
                   "import-accountant", str(DATA / "Accountantnew.log"))
    assert acct.returncode == 1 and "permission denied" in _one_line(acct.stderr)
    assert [e["id"] for e in _exported(home, base)] == ["harmless:1"]
    # the administrator's import is recorded as theirs; the file's `by` is a claim only
    res = as_root("--home", str(root_home), "log", "import", str(forged))
    assert res.returncode == 0, res.stderr
    mine = {e["id"]: e for e in _exported(root_home, base)}
    for eid in ("forged:1", "forged:2"):
        data = mine[eid]["data"]
        assert str(data["by"]).startswith("root@")  # type: ignore[index]
        assert data["claimed_by"] == "admin@cm.example.org/cm.example.org"  # type: ignore[index]
    audit = as_root("--home", str(root_home), "audit", "alice@example.org")
    assert "(imported; claimed by admin@cm.example.org/cm.example.org)" in audit.stdout
    acct = as_root("--home", str(root_home), "log", "import-accountant",
                   str(DATA / "Accountantnew.log"))
    edits = [e for e in _exported(root_home, base) if str(e["id"]).startswith("accountant:")
             and e["type"] == "admin.command"]  # (its claims are job.started, no edit)
    assert edits and all(str(e["data"]["by"]).startswith("root@") for e in edits)  # type: ignore[index]


def test_old_admin_events_still_read() -> None:
    old = {"id": "u:1", "type": "admin.command", "v": 1, "ts": T0, "source": "u", "seq": 1,
           "data": {"op": "setfactor", "target": "alice@example.org", "value": 5.0, "by": "root"}}
    env = decode(orjson.dumps(old))
    assert env.v == 2 and env.data.by == "root" and env.data.claimed_by == ""
    old = {**old, "type": "config.changed", "data": {"knob": "X", "value": "1", "by": "root"}}
    assert decode(orjson.dumps(old)).data.claimed_by == ""


# ------------------------------------------------------------------ 3: read-only readers


def test_a_read_only_auditor_reads_and_a_write_says_read_only(
        user: User, base: Path, root_home: Path) -> None:
    assert as_root("--home", str(root_home), "history", "update").returncode == 0
    want = as_root("--home", str(root_home), "userprio", "--json")
    assert want.returncode == 0, want.stderr
    got = as_user(user, "--home", str(root_home), "userprio", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(want.stdout)
    out = _owned_by(user, base / "auditor")
    for args in (("replay",), ("status", "-total"), ("audit", "alice@example.org"),
                 ("log", "info"), ("log", "verify"), ("history",),
                 ("log", "export", str(out / "copy.jsonl"))):
        res = as_user(user, "--home", str(root_home), *args)
        assert res.returncode == 0, (args, res.stderr)
        assert "readonly" not in res.stderr and "unable to open" not in res.stderr
    res = as_user(user, "--home", str(root_home), "log", "import", str(base / "events.jsonl"))
    assert res.returncode == 1
    assert "read-only" in _one_line(res.stderr) and "readonly database" not in res.stderr
    assert not list((root_home / "log").glob("*-shm"))  # the reader left nothing behind


@pytest.fixture
def read_only_mount(base: Path) -> Iterator[Path]:
    """A tmpfs to be remounted read-only (an archived log's medium)."""
    mnt = base / "archive"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to make read-only: {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


_KILLED_WRITER = """
import os, sys
from schemas.events import decode
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog, ensure_topics
log = EmbeddedLog(sys.argv[1])
ensure_topics(log)
lines = open(sys.argv[2], "rb").read().splitlines()
EventLog(log).append("poolledger.events", [decode(line) for line in lines])
os._exit(0)  # as kill -9: the commits stay in log.sqlite-wal
"""


def _killed_writer(logdir: Path, events: Path) -> None:
    res = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(logdir), str(events)],
                         capture_output=True, text=True, env=_clean_env())
    assert res.returncode == 0, res.stderr
    assert (logdir / "log.sqlite-wal").stat().st_size > 0


def test_an_archived_log_on_a_read_only_file_system_is_read(
        user: User, base: Path, read_only_mount: Path) -> None:
    events = write_log(base / "events.jsonl")
    _killed_writer(read_only_mount / "home" / "log", events)
    (read_only_mount / "home" / "log" / "log.sqlite-shm").unlink()  # an archive without it
    assert subprocess.run(["mount", "-o", "remount,ro", str(read_only_mount)]).returncode == 0
    home = str(read_only_mount / "home")
    for run in (as_root, lambda *a: as_user(user, *a)):
        res = run("--home", home, "userprio", "--json")
        assert res.returncode == 0, res.stderr
        assert {r["Name"] for r in json.loads(res.stdout)["Submitters"]} == {
            "alice@example.org", "bob@example.org"}  # the WAL's commits are read
        res = run("--home", home, "log", "import", str(events))
        assert res.returncode == 1 and "read-only file system" in _one_line(res.stderr)


# ------------------------------------------------------------------ 13: copying the log


def test_log_backup_copies_the_wal_and_verify_notices_a_missing_one(base: Path) -> None:
    events = write_log(base / "events.jsonl")
    log = base / "home" / "log"
    _killed_writer(log, events)
    lone = base / "lone" / "log"
    lone.mkdir(parents=True)
    for name in ("log.sqlite", "log.commits"):  # the log's directory, without the WAL
        if (log / name).exists():
            shutil.copy(log / name, lone / name)
    res = as_root("--home", str(lone.parent), "log", "verify")
    assert res.returncode == 1
    assert "poolledger.events[0] ends at offset 0" in res.stderr
    assert "offset 15" in res.stderr and "log.sqlite-wal" in res.stderr
    res = as_root("--home", str(base / "home"), "log", "backup", str(base / "copy" / "log"))
    assert res.returncode == 0, res.stderr
    assert "backed up 16 records" in res.stdout
    res = as_root("--home", str(base / "copy"), "log", "verify")
    assert res.returncode == 0 and "0 problem(s)" in res.stdout, res.stderr
    assert _exported(base / "copy", base) == _exported(base / "home", base)
    res = as_root("--home", str(base / "home"), "log", "backup", str(base / "copy" / "log"))
    assert res.returncode == 2 and "not an empty directory" in res.stderr


def test_the_readme_says_copy_with_backup_not_the_file() -> None:
    text = (ROOT / "README.md").read_text()
    assert "log backup" in text and "one SQLite file" not in text


# ------------------------------------------------------------------ 16: files


def test_no_file_is_written_through_a_link(base: Path, root_home: Path) -> None:
    secret = base / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    leases = root_home / "leases"
    leases.mkdir()
    (leases / "negotiator@cm.lease").symlink_to(secret)
    res = subprocess.run([sys.executable, "-c", MAIN, "--home", str(root_home), "negotiator",
                          "--name", "negotiator@cm"], capture_output=True, text=True,
                         env=_clean_env(), cwd="/tmp", timeout=30)
    assert res.returncode == 1
    assert "symbolic link" in _one_line(res.stderr)
    plot = base / "alice.png"
    plot.symlink_to(secret)
    res = as_root("--home", str(root_home), "audit", "alice@example.org", "--plot", str(plot))
    assert res.returncode == 0, res.stderr
    assert secret.read_text() == "root only\n" and not plot.is_symlink()


def test_a_data_directory_others_may_change_is_refused(user: User, base: Path) -> None:
    events = write_log(base / "events.jsonl")
    shared = base / "shared"
    shared.mkdir()
    os.chown(shared, 0, user.gid)
    shared.chmod(0o775)
    res = as_root("--home", str(shared), "log", "import", str(events))
    assert res.returncode == 1
    line = _one_line(res.stderr)
    assert f"{shared}: writable by its group" in line and "refused" in line
    assert not (shared / "log").exists()
    shared.chmod(0o777)
    assert "writable by everyone" in as_root("--home", str(shared), "log", "import",
                                             str(events)).stderr
    theirs = _owned_by(user, base / "theirs")
    res = as_root("--home", str(theirs), "log", "import", str(events))
    assert res.returncode == 1
    assert f"owned by {user.name}" in _one_line(res.stderr)
    # a sticky directory (as /tmp) and the user's own are fine for their writers
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert as_root("--home", str(sticky / "h"), "log", "import", str(events)).returncode == 0
    res = as_user(user, "--home", str(theirs), "log", "import", str(events))
    assert res.returncode == 0, res.stderr
    assert grp.getgrgid(user.gid).gr_name == user.name
