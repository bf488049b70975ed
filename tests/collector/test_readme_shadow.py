"""README "Shadow your pool": its one-machine block runs as written in a scratch directory laid
out like a fresh clone, the htcondor2 client library standing in for the pool. The one change:
port 9618 becomes a free port (another collector may hold 9618 on a shared machine)."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.test_readme import first_block

ROOT = Path(__file__).resolve().parents[2]


def shadow_block() -> list[str]:
    """The indented block after "On one machine" in the README's Shadow section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Shadow your pool\n"):]
    return first_block(section[section.index("On one machine"):])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_one_machine_block_works_as_written(tmp_path: Path) -> None:
    block = shadow_block()
    assert block[0].endswith(" &") and block[-1] == "kill %1" and len(block) >= 5
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home")}
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG", "CONDOR_CONFIG"):
        env.pop(var, None)
    port = str(free_port())
    service: subprocess.Popen[str] | None = None
    outputs: list[str] = []
    try:
        for line in block:
            line = line.replace("9618", port)
            if line.endswith(" &"):
                service = subprocess.Popen(shlex.split(line[:-2]), cwd=clone, env=env, text=True,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                assert service.stdout is not None and service.stderr is not None
                first = service.stdout.readline()
                assert "listening on 127.0.0.1:" in first, first + service.stderr.read()
            elif line == "kill %1":
                assert service is not None
                service.send_signal(signal.SIGTERM)
                out, err = service.communicate(timeout=60)
                assert service.returncode == 0, err
                assert "stopped after" in out
                service = None
            else:
                done = subprocess.run(line, shell=True, cwd=clone, env=env, text=True,
                                      capture_output=True, timeout=120)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
    finally:
        if service is not None:
            service.kill()
            service.wait()
    query, status, stats = outputs[1], outputs[2], outputs[3]
    assert query.strip() == "['slot1@ep1.example.org', 'slot2@ep1.example.org']"
    assert "slot1@ep1.example.org" in status and "slot2@ep1.example.org" in status
    assert stats.count("Stats: Total=1, Seq=1, Lost=0") == 2
    assert sorted(p.name for p in clone.iterdir()) == [".venv", "out"]
