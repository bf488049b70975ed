"""One CLI voice: `poolledger <command>: <message>` on one line for every error, exit 2 for
usage and configuration (scenarios included), 1 for runtime failures; a progress bar only on
a terminal; `services status` as a table; a `--log` file that is not a log refused once."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from services.cli import main
from services.commands.services import status_table
from services.mainloop import Progress

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_a_file_that_is_not_a_log_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "rup.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40 + b"\n" * 187)
    for command in ("replay", "userprio", "why", "audit"):
        argv = [command, *(["1.0"] if command == "why" else ["alice"] if command == "audit" else []),
                "--log", str(png)]
        rc, err = _run(capsys, *argv)
        assert rc == 2, err
        assert err.splitlines() == [
            f"poolledger {command}: --log {png}: not an exported JSONL log (line 1 is not a JSON "
            "object); `poolledger log export FILE.jsonl` writes one"]
    rc, err = _run(capsys, "replay", "--log", str(tmp_path / "nosuch.jsonl"))
    assert rc == 2 and err == f"poolledger replay: --log {tmp_path / 'nosuch.jsonl'}: No such file or directory\n"


def test_errors_carry_the_command_name_and_the_right_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(capsys, "run", "nosuch")
    assert rc == 2 and err.startswith("poolledger run: no scenario 'nosuch'")
    bad = tmp_path / "bad.toml"
    bad.write_text("[pool]\nname = 'x'\n[[machines]]\ncount = 'many'\n")
    rc, err = _run(capsys, "run", str(bad))
    assert rc == 2 and err.startswith("poolledger run: ") and len(err.splitlines()) == 1
    rc, err = _run(capsys, "--set", "PRIORITY_HALFLIFE=-1", "userprio")
    assert rc == 2 and err.startswith("poolledger userprio: configuration error: ")
    rc, err = _run(capsys, "userprio")  # no log: a runtime failure
    assert rc == 1 and err.startswith("poolledger userprio: no log in out/log")


def test_an_admin_edit_refused_by_the_core_speaks_as_poolledger(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "small", "--hours", "0.2", "--quiet"]) == 0
    capsys.readouterr()
    rc, err = _run(capsys, "userprio", "-setfactor", "alice", "2")
    assert rc == 2
    assert err == ("poolledger userprio: You must specify the full name of the submittor you "
                   "wish\n\tto update the priority of (user@uid.domain or user@full.host.name)\n")


def test_progress_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, tty = io.StringIO(), Tty()
    for stream in (plain, tty):
        bar = Progress(stream)
        bar.update(0.5, 1.0, 10, force=True)
        bar.close()
    assert plain.getvalue() == ""
    assert tty.getvalue().startswith("\r[") and "50%" in tty.getvalue()


def test_services_status_is_a_table_not_a_dict() -> None:
    state = {"pid": 4242, "url": "http://127.0.0.1:9090", "scrape": ["127.0.0.1:9100", "x:1"]}
    text = status_table("prometheus", state)
    assert text.splitlines() == ["prometheus running",
                                 "  pid     4242",
                                 "  scrape  127.0.0.1:9100, x:1",
                                 "  url     http://127.0.0.1:9090"]
    assert "{" not in text and json.dumps(state) not in text


def test_bundled_scenarios_load_without_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    """`make run ARGS="scenarios/fairshare.toml --hours 72"` as the README writes it: the
    scenario's CLAIM_WORKLIFE is the simulated startds' knob, not an unknown one."""
    from schemas.settings import load_settings
    from services.commands.run import bundled, check_scenario_config, resolve_scenario
    from services.pool import load_scenario

    assert {"fairshare", "groups", "sharded", "small"} <= set(bundled())
    for name in bundled():
        assert check_scenario_config(load_scenario(resolve_scenario(name)), load_settings()) is None
        assert capsys.readouterr().err == "", name


def test_services_status_of_a_stopped_service_reads_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for kind in ("kafka", "gmond"):
        assert main(["services", "status", kind]) == 1
        assert capsys.readouterr().out == f"{kind} is not running\n"
        assert main(["services", "status", kind, "--json"]) == 1
        assert capsys.readouterr().out == "null\n"
    assert list(tmp_path.iterdir()) == []  # no ./out made by a status query


def test_log_export_of_a_missing_log_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(capsys, "--home", "nohere", "log", "export", "copy.jsonl")
    assert rc == 1
    assert err == ("poolledger log: no log in nohere/log: run `poolledger run`, or name a log "
                   "with --home DIR, --broker or --log FILE.jsonl\n")
    assert list(tmp_path.iterdir()) == []  # neither nohere/ nor copy.jsonl
