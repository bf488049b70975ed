"""The README as a tested walkthrough: the command block of its "Using it" section runs, in
order, as written, after `make run` (`poolledger run`), in a scratch directory laid out like
a fresh clone; every line exits 0 (the `log import` of a clean export too), nothing lands
outside `out/`, and no `~/.poolledger` appears. The data directory is shared: the commands
without `--home` read the log `make run` wrote."""
from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

import pytest

from services.cli import main

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ".venv/bin/poolledger "


def first_block(text: str) -> list[str]:
    """The lines of the first indented block in `text`, stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line.strip())
    return block


def using_it_commands() -> list[str]:
    """The first indented command block after the "## Using it" heading."""
    text = (ROOT / "README.md").read_text()
    return first_block(text[text.index("## Using it\n"):])


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


# --- the whole README, in order, as separate commands --------------------------------------------

#: Lines of the README the walkthrough does not run, with why (checked: each must still be there).
NOT_RUN = {
    "make test": "the test suite itself",
    ".venv/bin/python bench/negotiation.py --baseline ../other-checkout":
        "a benchmark against another checkout, not a step of the walkthrough",
}

#: What a reader puts in place of the README's placeholders and own files: (pattern in a line,
#: key of the value found while walking, or a fixed value).
_FILES = {  # a reader's own HTCondor files, stood in for by the test data
    "history.sample": "history.sample", "status.txt": "status.sample",
    "/var/lib/condor/spool/Accountantnew.log": "Accountantnew.log",
}


def readme_commands() -> list[tuple[int, str]]:
    """Every command of the README's indented blocks, in order, with its line number: shell
    lines (a trailing backslash or an open quote continues one), and each Python block as one
    `python` command."""
    lines = (ROOT / "README.md").read_text().splitlines()
    # "Shadow your pool" configures and runs a real pool's hosts; its one-machine block has a
    # test of its own (tests/collector/test_readme_shadow.py)
    shadow = lines.index("## Shadow your pool")
    end = next(i for i in range(shadow + 1, len(lines)) if lines[i].startswith("## "))
    lines = lines[:shadow] + [""] * (end - shadow) + lines[end:]
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("    ") and lines[i].strip()
                and (i == 0 or not lines[i - 1].strip())):
            i += 1  # an indented code block starts after a blank line
            continue
        block = []
        start = i
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            block.append(lines[i][4:])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        if block[0].startswith(("from ", "import ")):
            out.append((start + 1, "python\n" + "\n".join(block)))
            continue
        pending, first = "", start
        for n, text in enumerate(block):
            if not pending:
                first = start + n + 1
                if not text.strip() or text.lstrip().startswith("#"):
                    continue
            pending += text + "\n"
            if pending.rstrip().endswith("\\") or not _complete(pending):
                continue
            out.append((first, pending.strip()))
            pending = ""
    return out


def _complete(text: str) -> bool:
    """Whether shell text closes its quotes (a quote in a trailing comment does not count)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def _found(pattern: str, text: str, line: str) -> str:
    import re

    match = re.search(pattern, text, re.M)
    assert match, f"{line}: no {pattern!r} in its output:\n{text}"
    return match.group(1)


def test_the_walkthrough_sees_every_block() -> None:
    commands = [c for _, c in readme_commands()]
    assert commands[0].startswith("make run") and "make test" in commands
    assert sum(c.startswith(PREFIX) for c in commands) >= 50
    assert any(c.startswith("curl ") and c.endswith("}'") for c in commands)
    assert any(c.startswith("python\nfrom elasticsearch") for c in commands)
    for line in NOT_RUN:
        assert any(c.startswith(line) for c in commands), f"not in the README: {line}"


def test_every_readme_block_runs_in_order(tmp_path: Path) -> None:
    """From a fresh clone's layout, every command of the README in order, services included
    (each started with the default relative home `out`, as written), with the reader's
    placeholders filled in from what the commands before printed: every command exits 0.
    A service that cannot be installed here skips only its own lines, and the test says so."""
    import os
    import re
    import signal
    import subprocess
    import tempfile
    import time

    from tests.test_operators import _installable

    base = Path(tempfile.mkdtemp(prefix="poolledger-readme-"))  # enterable by the search engines
    base.chmod(0o755)
    work = base / "clone"
    work.mkdir()
    for name in ("scenarios", "ganglia", ".venv"):
        (work / name).symlink_to(ROOT / name)
    for name, data in _FILES.items():
        if "/" not in name:
            (work / name).write_bytes((ROOT / "tests" / "data" / data).read_bytes())
    import shutil

    shutil.copytree(ROOT / "tests" / "data" / "segment-log", work / "old" / "log")
    from compose.kafka import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLLEDGER_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(base / "home"),
               POOLLEDGER_PROMETHEUS_LISTEN=f"127.0.0.1:{free_port()}")
    # a pool's accountant log: the test data's well-formed transactions (its tail is hostile)
    accountant = work / "Accountantnew.log"
    accountant.write_text("".join((ROOT / "tests" / "data" / "Accountantnew.log")
                                  .read_text().splitlines(keepends=True)[:29]))
    found: dict[str, str] = {"DATA_DIR": "out/promdata", "ACCOUNTANT": str(accountant)}
    skipped: dict[str, str] = {}
    background: list[subprocess.Popen[bytes]] = []
    outputs: dict[str, str] = {}
    needs = {"kafka://127.0.0.1:PORT": "kafka", "http://127.0.0.1:PORT": "elasticsearch",
             "$ES": "elasticsearch", "Elasticsearch(ES)": "elasticsearch",
             "POOLLEDGER_GRAPHITE=127.0.0.1:PORT": "graphite", "services start gmond": "gmond",
             "GANGLIA_CONFIG=": "gmond", "services start prometheus": "prometheus",
             "promtool ": "prometheus"}
    try:
        for number, command in readme_commands():
            if any(command.startswith(line) for line in NOT_RUN):
                continue
            service = next((svc for pat, svc in needs.items() if pat in command), None)
            if command.startswith(PREFIX + "services start "):
                service = command.split()[3]
            if command.startswith("curl "):
                service = "elasticsearch"
            why = _installable(service) if service else None
            if why or (service and service in skipped):
                skipped.setdefault(service or "", why or skipped[service or ""])
                continue
            shell = command
            if shell.startswith("make run"):
                shell = PREFIX + "run"  # the Makefile's run target, once installed
            for text, data in _FILES.items():
                if "/" in text:
                    shell = shell.replace(text, found["ACCOUNTANT"])
            shell = (shell.replace("kafka://127.0.0.1:PORT", f"kafka://{found.get('kafka', '')}")
                     .replace("http://127.0.0.1:PORT", found.get("elasticsearch", ""))
                     .replace("POOLLEDGER_GRAPHITE=127.0.0.1:PORT",
                              f"POOLLEDGER_GRAPHITE={found.get('graphite', '')}")
                     .replace("TOPIC", found.get("TOPIC", "TOPIC"))
                     .replace("DATA_DIR", found["DATA_DIR"]))
            run_env = dict(env, ES=found.get("elasticsearch", ""))
            where = f"README.md:{number}: {command.splitlines()[0]}"
            if shell.startswith("python\n"):
                code = f"ES = {found.get('elasticsearch', '')!r}\n" + shell.split("\n", 1)[1]
                argv = [str(ROOT / ".venv" / "bin" / "python"), "-c", code]
                done = subprocess.run(argv, cwd=work, env=run_env, capture_output=True,
                                      text=True, timeout=600)
            elif re.search(r"&\s*(#.*)?$", shell):
                line = re.sub(r"&\s*(#.*)?$", "", shell).strip()
                log = open(work / f"background-{number}.log", "wb")
                background.append(subprocess.Popen(["bash", "-c", f"exec env {line}"], cwd=work,
                                                   env=run_env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))
                log.close()
                time.sleep(3)  # the HA pair and the worker: started before what follows
                assert background[-1].poll() is None, (where, (work / log.name).read_text())
                continue
            else:
                if " faust-status" in shell:  # the worker reports every 10 s
                    for _ in range(30):
                        probe = subprocess.run(["bash", "-c", shell], cwd=work, env=run_env,
                                               capture_output=True, text=True)
                        if probe.returncode == 0 and "active" in probe.stdout:
                            break
                        time.sleep(2)
                done = subprocess.run(["bash", "-c", shell], cwd=work, env=run_env,
                                      capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"{where}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr, f"{where}\n{done.stderr}"
            outputs[command] = done.stdout
            if command.startswith(PREFIX + "services start ") or " services start " in command:
                svc = command.split("services start ")[1].split()[0]
                found[svc] = (_found(r"--broker kafka://(\S+)", done.stdout, where)
                              if svc == "kafka" else
                              _found(r"--se_host (\S+)", done.stdout, where)
                              if svc in ("elasticsearch", "opensearch") else
                              _found(r"POOLLEDGER_GRAPHITE=(\S+)", done.stdout, where)
                              if svc == "graphite" else svc)
            if "--broker" in command and " run " in command:
                found["TOPIC"] = _found(r"^Events topic: (\S+)", done.stdout, where)
    finally:
        for proc in background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for svc in ("kafka", "elasticsearch", "gmond", "graphite", "prometheus"):
            if svc in found:
                subprocess.run([str(ROOT / ".venv" / "bin" / "poolledger"), "services", "stop",
                                svc], cwd=work, env=env, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    # what the "Using it" lines promise
    userprio = next(o for c, o in outputs.items() if c.startswith(PREFIX + "userprio -all"))
    assert "alice@example.org" in userprio
    gpu = next(o for c, o in outputs.items() if "-name gpu" in c)
    assert "alice@example.org" in gpu and "bob@example.org" not in gpu
    queue = next(o for c, o in outputs.items() if "q -nobatch alice" in c)
    assert " alice " in queue and " bob " not in queue and "Total for all users:" in queue
    assert "curie" in next(o for c, o in outputs.items() if "Owner == \"curie\"" in c)
    if skipped:
        pytest.skip("every other README line ran; not run here: "
                    + "; ".join(f"{svc}: {why}" for svc, why in sorted(skipped.items())))

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
