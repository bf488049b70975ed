"""`poolledger --broker kafka://... run`: the same main loop appends to Kafka while a faust
worker folds the same topic; at the end the worker's changelog state equals the loop's."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from compose.kafka import free_port
from services.cli import main

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.kafka
def test_run_on_kafka_as_the_readme_writes_it_leaves_the_embedded_run_alone(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`make run` then `poolledger --broker kafka://... run` from the same directory: relative
    paths (the faust worker runs in its own directory) and the embedded run's files kept."""
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_CONFIG", "POOLLEDGER_BROKER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "small", "--hours", "0.2", "--quiet"]) == 0
    embedded = (tmp_path / "out" / "events.jsonl").read_bytes()
    capsys.readouterr()
    rc = main(["--broker", f"kafka://{kafka_bootstrap}", "run", "small", "--hours", "0.5",
               "--quiet"])
    text, err = capsys.readouterr()
    assert rc == 0, text + err
    assert "faust check: OK" in text
    assert (tmp_path / "out" / "kafka" / "rup.png").exists()
    assert (tmp_path / "out" / "events.jsonl").read_bytes() == embedded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _faust_worker(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streams.faust_app", "worker", "-l", "info"],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_faust_worker_without_a_broker_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLLEDGER_")}
    env["PYTHONPATH"] = str(ROOT)
    res = _faust_worker(env, tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "streams.faust_app worker: no broker: set POOLLEDGER_BROKER=kafka://HOST:PORT "
        "(`poolledger services start kafka` prints one)"]
    res = _faust_worker({**env, "POOLLEDGER_BROKER": f"kafka://127.0.0.1:{free_port()}"}, tmp_path)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("streams.faust_app worker: broker kafka://127.0.0.1:")
    assert list(tmp_path.iterdir()) == []  # no ./poolledger-data


@pytest.mark.kafka
def test_faust_worker_creates_its_topics_on_a_fresh_broker(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.faust_app import prepare_worker
    from streams.log.kafka import KafkaLog

    topic = f"poolledger.fresh-{uuid.uuid4().hex[:8]}.events"
    monkeypatch.setenv("POOLLEDGER_BROKER", f"kafka://{kafka_bootstrap}")
    monkeypatch.setenv("POOLLEDGER_EVENTS_TOPIC", topic)
    assert prepare_worker() == 0
    log = KafkaLog(kafka_bootstrap)
    try:
        assert {topic, topic + ".dlq"} <= set(log.topics())
    finally:
        log.close()
