"""`poolledger collector` refuses what it cannot do in one line and a status, not a traceback."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.cli import main


def test_a_busy_port_a_foreign_address_and_a_bad_port_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--home", home, "collector", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"poolledger collector: 127.0.0.1:{port} is already in use (another "
                   "collector on this port? --port N)"]
    assert main(["--home", home, "--set", "POOLLEDGER_COLLECTOR_ADDRESS=192.0.2.1",
                 "collector", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poolledger collector: 192.0.2.1:0: cannot bind")
    assert "POOLLEDGER_COLLECTOR_ADDRESS" in err[0]
    assert main(["--home", home, "collector", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == \
        "poolledger collector: --port must be between 0 and 65535, got 70000"
