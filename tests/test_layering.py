"""DESIGN.md's layering as import-linter contracts (pyproject.toml [tool.importlinter]): the
pure core (`streams/core`) and the matchmaking policy import no log, runner, service, broker,
sink, network or clock module, directly or through another module."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    res = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                         cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "streams.core is pure" in res.stdout and "matchmaking policy" in res.stdout
    assert "2 kept, 0 broken" in res.stdout
