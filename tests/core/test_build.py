"""The compiled core (setup.py, mypyc): it is what runs, and a stale build is refused."""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
from pathlib import Path

import pytest

import streams.core
from streams.core import check_build, jobs, ledger
from streams.core.errors import StaleBuildError

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.mark.skipif(os.environ.get("POOLLEDGER_COMPILE", "1") == "0",
                    reason="installed with POOLLEDGER_COMPILE=0 (plain Python core)")
def test_the_core_that_runs_is_the_compiled_one() -> None:
    for module in (ledger, jobs):
        assert module.__file__ is not None and module.__file__.endswith(SUFFIX), module.__file__
    check_build(Path(streams.core.__file__).parent)  # and it matches the sources


def _build(tmp_path: Path, source: str, recorded: str) -> None:
    (tmp_path / "fold.py").write_text(source)
    (tmp_path / f"fold{SUFFIX}").write_bytes(b"")
    (tmp_path / "_compiled.json").write_text(
        json.dumps({"fold": hashlib.sha256(recorded.encode()).hexdigest()}))


def test_a_build_older_than_its_source_is_refused(tmp_path: Path) -> None:
    _build(tmp_path, "X = 2\n", recorded="X = 1\n")
    with pytest.raises(StaleBuildError, match=r"fold\.py changed since the core was compiled"):
        check_build(tmp_path)


def test_a_current_build_or_none_passes(tmp_path: Path) -> None:
    _build(tmp_path, "X = 1\n", recorded="X = 1\n")
    check_build(tmp_path)
    (tmp_path / f"fold{SUFFIX}").unlink()  # the record alone (a failed optional build)
    (tmp_path / "fold.py").write_text("X = 2\n")
    check_build(tmp_path)

