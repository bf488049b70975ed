"""Every line `userprio` prints for an edit is condor_userprio's (issue 25 item 9): the texts of
src/condor_tools/user_prio.cpp, and for a lease the negotiator refuses, the accountant's reason
(src/condor_negotiator.V6/Accountant.cpp) under user_prio.cpp's "negotiator rejected ..." line.
Only the program name differs ("poolledger userprio" for "condor_userprio"), and usage errors
exit 2 (HTCondor: 1), the project's rule."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import main
from tests.test_cli import write_log

A = "alice@example.org"


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    assert main(["--home", str(home), "log", "import", str(write_log(tmp_path / "e.jsonl"))]) == 0
    return home


def _run(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--home", str(home), "userprio", *args])
    out = capsys.readouterr()
    # an edit on a log of the past says so first (services.admin.edit_time): not condor_userprio's
    lines = [ln for ln in out.out.splitlines() if "of the past" not in ln]
    return rc, "\n".join(lines), out.err.rstrip("\n")


@pytest.mark.parametrize(("args", "line"), [
    (("-setprio", A, "7"), f"The priority of {A} was set to 7.000000"),
    (("-setfactor", A, "2000"), f"The priority factor of {A} was set to 2000.000000"),
    (("-setfactor", A, "3", "-duration", "600"),
     f"Set priority-factor lease on {A} to 3.000000 for 600 seconds"),
    (("-setceiling", A, "4"), f"The ceiling of {A} was set to 4"),
    (("-setceiling", A, "4", "-duration", "60"), f"Set ceiling lease on {A} to 4 for 60 seconds"),
    (("-setfloor", A, "2"), f"The floor of {A} was set to 2"),
    (("-setfloor", A, "2", "-duration", "90"), f"Set floor lease on {A} to 2 for 90 seconds"),
    (("-setaccum", A, "5"), f"The Accumulated Usage of {A} was set to 5.000000"),
    (("-setbegin", A, "1763800000"), f"The Begin Usage Time of {A} was set to 1763800000"),
    (("-setlast", A, "1763800000"), f"The Last Usage Time of {A} was set to 1763800000"),
    (("-resetusage", A), f"The accumulated usage of {A} was reset"),
    (("-delete", A), f"The accountant record named {A} was deleted"),
    (("-resetall",), "The accumulated usage was reset for all users"),
])
def test_edit_confirmations(capsys: pytest.CaptureFixture[str], home: Path,
                            args: tuple[str, ...], line: str) -> None:
    rc, out, err = _run(capsys, home, *args)
    assert (rc, out, err) == (0, line, "")


@pytest.mark.parametrize(("op", "flag", "word"), [
    ("-setceiling", "-cancelceilinglease", "ceiling"),
    ("-setfloor", "-cancelfloorlease", "floor"),
    ("-setfactor", "-cancelfactorlease", "priority-factor"),
])
def test_lease_lifecycle_messages(capsys: pytest.CaptureFixture[str], home: Path, op: str,
                                  flag: str, word: str) -> None:
    rc, out, err = _run(capsys, home, flag, A)  # no lease yet: the accountant's reason
    assert (rc, out, err) == (
        2, "", f"poolledger userprio: negotiator rejected cancel: no {word} lease in effect for {A}")
    rc, out, _ = _run(capsys, home, op, A, "3", "-duration", "3600")
    assert rc == 0 and out.startswith(f"Set {word} lease on {A} to 3")
    rc, out, err = _run(capsys, home, op, A, "5", "-duration", "60")
    assert rc == 2 and out == ""
    assert err.startswith(f"poolledger userprio: negotiator rejected {word} lease: {word} lease "
                          f"for {A} is already in effect (expires at ")
    assert err.endswith(")") and "\n" not in err
    rc, out, err = _run(capsys, home, flag, A)
    assert (rc, out, err) == (0, f"Cancelled {word} lease for {A}", "")


@pytest.mark.parametrize("flag", ["-cancelceilinglease", "-cancelfloorlease",
                                  "-cancelfactorlease"])
def test_cancel_needs_a_full_submitter_name(capsys: pytest.CaptureFixture[str], home: Path,
                                           flag: str) -> None:
    rc, out, err = _run(capsys, home, flag, "alice")
    assert (rc, out, err) == (
        2, "", f"poolledger userprio: {flag} requires a full submitter name (user@domain)")


@pytest.mark.parametrize(("args", "what", "tail"), [
    (("-setprio", "alice", "5"), "priority", ""),
    (("-setaccum", "alice", "5"), "Accumulated usage", ""),
    (("-setbegin", "alice", "5"), "begin usage time", ""),
    (("-setlast", "alice", "5"), "last usage time", ""),
    (("-resetusage", "alice"), "priority", ""),
    (("-setceiling", "alice@", "5"), None, ""),  # has '@': accepted, as user_prio.cpp does
])
def test_full_name_messages(capsys: pytest.CaptureFixture[str], home: Path,
                            args: tuple[str, ...], what: str | None, tail: str) -> None:
    rc, out, err = _run(capsys, home, *args)
    if what is None:
        assert rc == 0 and err == ""
        return
    assert (rc, out, err) == (
        2, "", "poolledger userprio: You must specify the full name of the submittor you wish\n"
               f"\tto update the {what} of (user@uid.domain or user@full.host.name){tail}")


def test_full_name_messages_of_delete_and_floor(capsys: pytest.CaptureFixture[str],
                                                home: Path) -> None:
    rc, _, err = _run(capsys, home, "-delete", "alice")
    assert (rc, err) == (2, "poolledger userprio: You must specify the full name of the record "
                            "you wish\n\tto delete (user@uid.domain or user@full.host.name)")
    rc, _, err = _run(capsys, home, "-setfloor", "alice", "1")
    assert (rc, err) == (2, "poolledger userprio: You must specify the full name of the "
                            "submittor you wish\n\tto update the floor of (user@uid.domain or "
                            "user@full.host.name) (not alice)")


@pytest.mark.parametrize(("args", "message"), [
    (("-setfactor", A, "0.5"), "Priority factors must be greater than or equal to 1."),
    (("-setfloor", A, "-1"), "floor must be greater than or equal to 0."),
    (("-setceiling", A, "-2"), "ceiling must be greater than or equal to -1."),
    (("-setaccum", A, "-1"), "Usage must be greater than 0 seconds"),
    (("-setbegin", A, "-5"), "Time must be greater than 0 seconds"),
    (("-setlast", A, "-5"), "Time must be greater than 0 seconds"),
])
def test_value_refusals(capsys: pytest.CaptureFixture[str], home: Path, args: tuple[str, ...],
                        message: str) -> None:
    rc, out, err = _run(capsys, home, *args)
    assert (rc, out, err) == (2, "", f"poolledger userprio: {message}")


@pytest.mark.parametrize("duration", ["0", "-5", "2.5", "1e300", "abc", "2147483647"])
def test_duration_is_a_positive_integer(capsys: pytest.CaptureFixture[str], home: Path,
                                        duration: str) -> None:
    rc, out, err = _run(capsys, home, "-setceiling", A, "3", "-duration", duration)
    assert (rc, out, err) == (
        2, "", "poolledger userprio: -duration requires a positive integer number of seconds")
