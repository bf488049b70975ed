"""Invariant 2: one log folded by the embedded runner, the replay runner and the faust app on a
real broker ends in byte-identical state; a faust restart mid-stream changes nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from schemas.events import Envelope
from schemas.settings import load_settings
from streams.faust_app import read_state
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.kafka import KafkaLog
from streams.log.port import TopicSpec
from streams.replay import Until, jsonl_events, replay
from streams.runner import EmbeddedRunner
from streams.synthetic import mixed_config, mixed_events

N_EVENTS = 10_500


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("conf") / "mixed.conf"
    path.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    return path


@pytest.fixture(scope="module")
def events() -> list[Envelope]:
    evs = list(mixed_events(N_EVENTS))
    kinds = {e.type for e in evs}
    assert {"job.started", "job.stopped", "admin.command", "config.changed", "ad.updated",
            "ad.invalidated", "negotiation.cycle"} <= kinds
    return evs


@pytest.fixture(scope="module")
def expected(events: list[Envelope], config_file: Path) -> str:
    return replay(events, load_settings(config_file)).to_json()


def test_mixed_log_exercises_every_fold(events: list[Envelope], config_file: Path) -> None:
    ledger = replay(events, load_settings(config_file))
    doc = ledger.to_doc()
    assert ledger.applied < len(events)  # duplicates were dropped
    assert any(n.startswith("group_physics") for n in doc["accountant"]["Customers"])
    assert doc["limits"]["in_use"]
    assert doc["knobs"]["PRIORITY_HALFLIFE"] in ("43200", "86400")


def test_embedded_runner_matches_replay(tmp_path: Path, events: list[Envelope], config_file: Path,
                                        expected: str) -> None:
    settings = load_settings(config_file)
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec("poolledger.events"))
    elog.log.create_topic(TopicSpec("poolledger.derived"))
    half = len(events) // 2
    elog.append("poolledger.events", events[:half])
    first = EmbeddedRunner(elog, settings, tmp_path / "state")
    assert first.run_once() == half
    # A second runner process resumes from the snapshot: nothing twice, nothing lost.
    elog.append("poolledger.events", events[half:])
    second = EmbeddedRunner(elog, settings, tmp_path / "state")
    assert second.run_once() == len(events) - half
    assert second.ledger.to_json() == expected
    assert EmbeddedRunner(elog, settings, tmp_path / "state").run_once() == 0


def test_replay_of_exported_log_matches(tmp_path: Path, events: list[Envelope], config_file: Path,
                                        expected: str) -> None:
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec("poolledger.events"))
    elog.append("poolledger.events", events)
    path = tmp_path / "events.jsonl"
    assert elog.export_jsonl("poolledger.events", path) == len(events)
    skipped: list = []
    ledger = replay(jsonl_events(path, skipped), load_settings(config_file))
    assert not skipped
    assert ledger.to_json() == expected
    cut = replay(events, load_settings(config_file), Until(position=100))
    assert cut.applied <= 100 and cut.to_json() != expected


def _worker(bootstrap: str, app_id: str, topic: str, config: Path, home: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, POOLLEDGER_BROKER=f"kafka://{bootstrap}", POOLLEDGER_FAUST_APP=app_id,
               POOLLEDGER_EVENTS_TOPIC=topic, POOLLEDGER_CONFIG=str(config),
               POOLLEDGER_HOME=str(home))
    log = open(home / f"{app_id}-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "streams.faust_app", "worker", "-l", "warn"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)


def _wait_committed(klog: KafkaLog, app_id: str, topic: str, target: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        done = sum(klog.committed(app_id, topic).values())
        if done >= target:
            return done
        time.sleep(0.5)
    return done


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture()
def faust_env(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[KafkaLog, str, str]]:
    klog = KafkaLog(kafka_bootstrap)
    app_id = f"pl-{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}.events"
    klog.create_topic(TopicSpec(topic, 1))
    yield klog, app_id, topic
    klog.close()


@pytest.mark.kafka
def test_faust_matches_replay_with_restart(faust_env: tuple[KafkaLog, str, str], kafka_bootstrap: str,
                                           tmp_path: Path, events: list[Envelope], config_file: Path,
                                           expected: str) -> None:
    klog, app_id, topic = faust_env
    elog = EventLog(klog)
    half = len(events) // 2
    elog.append(topic, events[:half])
    worker = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path)
    try:
        assert _wait_committed(klog, app_id, topic, half, 180) >= half
    finally:
        _stop(worker)
    midway = read_state(kafka_bootstrap, load_settings(config_file), app_id)
    assert midway is not None and midway.applied > 0
    # Restart: the tables are recovered from their changelogs, the stream resumes.
    elog.append(topic, events[half:])
    worker = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path)
    try:
        assert _wait_committed(klog, app_id, topic, len(events), 180) >= len(events)
    finally:
        _stop(worker)
    state = read_state(kafka_bootstrap, load_settings(config_file), app_id)
    assert state is not None
    assert state.to_json() == expected
