"""The local Kafka launcher runs a real broker, and leaves nothing behind when stopped."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from compose.kafka import KafkaLauncherError, KafkaServer, pid_alive, port_is_free, service_status
from streams.log.kafka import KafkaLog, parse_broker_url
from streams.log.port import TopicSpec

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[1]


def _round_trip(bootstrap: str) -> None:
    """Create a topic, produce three records and consume them back with plain kafka-python."""
    topic = f"launcher-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}},
                            wait_for_metadata=True)
        assert topic in admin.list_topics()
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    sent = [producer.send(topic, f"v{i}".encode(), partition=1, timestamp_ms=1_000 + i)
            for i in range(3)]
    producer.flush()
    assert [f.get(10).offset for f in sent] == [0, 1, 2]
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 1)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[tuple[int, bytes, int]] = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        for rec in consumer.poll(timeout_ms=500).get(tp, []):
            got.append((rec.offset, rec.value, rec.timestamp))
    consumer.close()
    assert got == [(0, b"v0", 1000), (1, b"v1", 1001), (2, b"v2", 1002)]


def test_server_round_trip_and_clean_stop() -> None:
    server = KafkaServer()
    bootstrap = server.start()
    pid, data_dir = server.pid, server.data_dir
    port = int(bootstrap.rsplit(":", 1)[1])
    try:
        assert bootstrap.startswith("127.0.0.1:")
        assert pid_alive(pid) and not port_is_free(port)
        assert os.getpgid(pid) == pid  # own process group: Ctrl-C of the owner does not hit it
        _round_trip(bootstrap)
        assert "started" in server.server_log.read_text()
    finally:
        server.stop()
    assert not pid_alive(pid)
    assert port_is_free(port)
    assert not data_dir.exists()  # the temp dir it made is gone


def test_port_in_use_fails_with_server_log(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = KafkaServer(tmp_path / "kafka", port=port, startup_timeout=60)
        with pytest.raises(KafkaLauncherError, match="(?s)exited with code.*server log tail"):
            server.start()
    assert (tmp_path / "kafka" / "server.log").exists()


def test_service_survives_its_starter_and_stops_from_another_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cli = [sys.executable, "-m", "compose.kafka"]
    started = subprocess.run(cli + ["start", "--home", str(home)], cwd=REPO, capture_output=True,
                             text=True, timeout=300, check=True)
    bootstrap = started.stdout.strip()
    state = json.loads((home / "services" / "kafka.json").read_text())
    pid = int(state["pid"])
    try:
        assert state["bootstrap"] == bootstrap
        assert pid_alive(pid)  # the starting process has exited, the broker has not
        status = subprocess.run(cli + ["status", "--home", str(home)], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and bootstrap in status.stdout
        again = subprocess.run(cli + ["start", "--home", str(home)], cwd=REPO,
                               capture_output=True, text=True, timeout=120, check=True)
        assert again.stdout.strip() == bootstrap  # idempotent
        _round_trip(bootstrap)
    finally:
        stopped = subprocess.run(cli + ["stop", "--home", str(home)], cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not pid_alive(pid)
    assert port_is_free(int(bootstrap.rsplit(":", 1)[1]))
    assert service_status(home) is None
    status = subprocess.run(cli + ["status", "--home", str(home)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 3 and "not running" in status.stdout


def test_session_fixture_serves_the_log_adapter(kafka_bootstrap: str) -> None:
    topic = f"fixture-{uuid.uuid4().hex[:8]}"
    with KafkaLog(f"kafka://{kafka_bootstrap}") as log:
        log.create_topic(TopicSpec(topic))
        assert log.append(topic, [(b"k", b"v", 1.5)])[0].offset == 0
        assert [r.value for r in log.read(topic, 0, 0)] == [b"v"]


def test_parse_broker_url() -> None:
    assert parse_broker_url("kafka://h:9092") == "h:9092"
    assert parse_broker_url("a:1,kafka://b:2") == "a:1,b:2"
    with pytest.raises(Exception, match="host:port"):
        parse_broker_url("kafka://nohost")
