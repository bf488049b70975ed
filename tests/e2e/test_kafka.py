"""`poolledger --broker kafka://... run`: the same main loop appends to Kafka while a faust
worker folds the same topic; at the end the worker's changelog state equals the loop's."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import main


@pytest.mark.kafka
def test_run_on_kafka_faust_state_equals_loop_state(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "out"
    rc = main(["--broker", f"kafka://{kafka_bootstrap}", "run", "small", "--hours", "1",
               "--out", str(out), "--quiet"])
    text, err = capsys.readouterr()
    assert rc == 0, text + err
    assert "faust check: OK" in text
    assert (out / "rup.png").exists() and (out / "share.png").exists()
    assert "Number of users:" in text
