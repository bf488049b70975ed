"""The README as a tested walkthrough: the command block of its "Using it" section runs, in
order, as written, after `make run` (`poolledger run`), in a scratch directory laid out like
a fresh clone; every line exits 0 (the `log import` of a clean export too), nothing lands
outside `out/`, and no `~/.poolledger` appears. The data directory is shared: the commands
without `--home` read the log `make run` wrote."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from services.cli import main

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ".venv/bin/poolledger "


def using_it_commands() -> list[str]:
    """The first indented command block after the "## Using it" heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it\n"):]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line.strip())
    return block


def test_the_using_it_block_is_poolledger_commands() -> None:
    block = using_it_commands()
    assert len(block) >= 10 and all(line.startswith(PREFIX) for line in block), block
    assert any("userprio -name gpu" in line for line in block)


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch directory with the clone's scenarios, as the working directory; HOME moved
    so that a stray `~/.poolledger` would be seen."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / "scenarios").symlink_to(ROOT / "scenarios")
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(work)
    return work


def test_every_using_it_command_works_as_written(clone: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 0  # `make run`
    capsys.readouterr()
    outputs: dict[str, str] = {}
    for line in using_it_commands():
        argv = shlex.split(line[len(PREFIX):], comments=True)
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's --help
            rc = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert rc == 0, f"{line}\n{out}\n{err}"
        outputs[line] = out
    assert sorted(p.name for p in clone.iterdir()) == ["out", "scenarios"]
    assert not (clone.parent / "home" / ".poolledger").exists()
    # the default data directory is the one `make run` wrote
    userprio = next(o for line, o in outputs.items() if line.startswith(PREFIX + "userprio -all"))
    assert "alice@example.org" in userprio
    gpu = next(o for line, o in outputs.items() if "-name gpu" in line)
    assert "alice@example.org" in gpu and "bob@example.org" not in gpu
    assert (clone / "out" / "alice.png").stat().st_size > 0
    assert (clone / "out" / "copy" / "log").is_dir()


def test_a_read_of_a_missing_log_names_it_and_creates_nothing(
        clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["userprio"], ["why", "1.0"], ["replay"], ["audit", "alice@example.org"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"poolledger {argv[0]}: no log in out/log: run `poolledger run`, or "
                       "name a log with --home DIR, --broker or --log FILE.jsonl")
    assert sorted(p.name for p in clone.iterdir()) == ["scenarios"]
    assert not (clone.parent / "home").exists()


def test_a_read_of_an_empty_log_says_so(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streams.log.events import EventLog, ensure_topics, open_log

    log = open_log(None, clone / "empty")
    ensure_topics(log)
    EventLog(log).log.close()
    assert main(["--home", "empty", "userprio"]) == 1
    assert capsys.readouterr().err.startswith("poolledger userprio: the log empty/log holds no events")
