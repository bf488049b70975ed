"""Fixtures of the collector endpoint's tests: a finished simulated run to replay."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`poolledger run small`'s output directory (its log exported as events.jsonl)."""
    from services.cli import main

    out = tmp_path_factory.mktemp("small_run")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "small", "--out", str(out)]) == 0
    return out
