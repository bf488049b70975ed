"""The front doors end to end: `poolledger run` (plots, userprio table, statistics),
`poolledger why` (HTCondor's rejection words, from the log), and a run's determinism."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.settings import load_settings
from services.cli import main
from services.commands.run import resolve_scenario
from services.mainloop import MainLoop
from services.pool import load_scenario
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from tests.e2e.helpers import batch, machines, run

LONG = "3h"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)


# --- poolledger why --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def why_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cluster 1: a job no slot can take. Cluster 2: three xsw jobs under XSW_LIMIT = 1.
    Cluster 3: a job that runs."""
    home = tmp_path_factory.mktemp("why")
    doc = {"config": {"XSW_LIMIT": 1},
           "machines": machines(5),
           "submitters": [{"user": "alice", "jobs": [
               batch(1, LONG, requirements="TARGET.Memory > 100000000"),
               batch(3, LONG, at="1m", concurrency_limits="xsw"),
               batch(1, LONG, at="2m")]}]}
    run(home, doc, hours=0.5)
    return home


def _why(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_why_unmatchable_job_says_no_match_found(why_home: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _why(capsys, "--home", str(why_home), "why", "1.0")
    assert rc == 0
    assert "Job 1.0 on schedd@ap1.example.org, submitter alice@example.org" in out
    assert "Why: no match found" in out
    assert "idle since" in out


def test_why_limit_blocked_job_names_the_limit(why_home: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _why(capsys, "--home", str(why_home), "why", "2.1")
    assert rc == 0
    assert "Why: concurrency limit xsw reached" in out
    assert "XSW_LIMIT = 1" in out
    rc, out, _ = _why(capsys, "--home", str(why_home), "why", "2.0")
    assert rc == 0 and "running on slot" in out and "matched" in out


def test_why_reads_an_exported_log(why_home: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    exported = tmp_path / "events.jsonl"
    assert main(["--home", str(why_home), "log", "export", str(exported)]) == 0
    capsys.readouterr()
    rc, out, _ = _why(capsys, "--home", str(tmp_path / "empty"), "why", "2.2",
                      "--log", str(exported))
    assert rc == 0 and "concurrency limit xsw reached" in out


def test_why_unknown_job_exits_1_naming_it(why_home: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _why(capsys, "--home", str(why_home), "why", "99.7")
    assert rc == 1 and out == ""
    assert "no job 99.7" in err


# --- poolledger run --------------------------------------------------------------------------

def test_run_writes_plots_and_prints_userprio_and_statistics(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    rc = main(["run", "--out", str(out_dir), "--hours", "1", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    for name in ("rup.png", "share.png", "events.jsonl"):
        assert (out_dir / name).stat().st_size > 0
    assert (out_dir / "rup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Effective" in out and "Priority" in out and "Number of users:" in out
    assert "alice@example.org" in out
    assert "Negotiation cycles: 61" in out and "Rejections by reason" in out
    assert str(out_dir / "rup.png") in out and str(out_dir / "share.png") in out
    # a second run replaces the first run's log in its own output directory
    assert main(["run", "--out", str(out_dir), "--hours", "0.1", "--quiet"]) == 0
    capsys.readouterr()
    rc, text, _ = _why(capsys, "--home", str(out_dir), "why", "1.0")
    assert rc == 0 and "Job 1.0" in text


def test_run_rejects_an_unknown_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "nosuch", "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith("poolledger run: no scenario 'nosuch'")


def test_run_refuses_a_home_holding_another_run(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    args = ["--home", str(home), "run", "--out", str(tmp_path / "o"), "--hours", "0.1", "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 1
    assert "already holds" in capsys.readouterr().err


# --- determinism -------------------------------------------------------------------------------

def test_same_seed_same_log(tmp_path: Path) -> None:
    """Same scenario and seed: the same log, byte for byte (durations not recorded)."""
    scenario = load_scenario(resolve_scenario("small"))
    logs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        log = EmbeddedLog(tmp_path / name / "log")
        MainLoop(scenario, seed=seed, settings=load_settings(), log=log,
                 record_durations=False).run(1.5)
        path = tmp_path / f"{name}.jsonl"
        EventLog(log).export_jsonl(EVENTS, path)
        log.close()
        logs.append(path.read_bytes())
    assert logs[0] == logs[1]
    assert logs[0] != logs[2]
