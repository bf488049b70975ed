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
from typing import Iterator

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
        with pytest.raises(KafkaLauncherError, match="(?s)exited with code.*failed to bind"):
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


# --------------------------------------------------------------------------- Kafka-specific
# What the shared contract suite cannot see: how KafkaLog maps the port onto Kafka, so other
# Kafka clients (faust, kafka-python, Java tools) agree with it.


@pytest.fixture
def kafka_log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    with KafkaLog(kafka_bootstrap) as log:
        yield log


def test_keys_land_where_kafkas_default_partitioner_puts_them(kafka_log: KafkaLog) -> None:
    from kafka.partitioner.default import murmur2

    topic = f"keys-{uuid.uuid4().hex[:8]}"
    kafka_log.create_topic(TopicSpec(topic, partitions=4))
    keys = [f"group_physics.u{i}@example.org".encode() for i in range(40)]
    landed = kafka_log.append(topic, [(k, b"v", 1.0) for k in keys] + [(None, b"u", 2.0)])
    assert [a.partition for a in landed[:-1]] == [(murmur2(k) & 0x7FFFFFFF) % 4 for k in keys]
    assert landed[-1].partition == 0  # unkeyed: partition 0
    assert sum(kafka_log.end_offsets(topic).values()) == 41


def test_sub_millisecond_event_times_round_trip_exactly(kafka_log: KafkaLog) -> None:
    topic = f"ts-{uuid.uuid4().hex[:8]}"
    kafka_log.create_topic(TopicSpec(topic))
    times = [1763800000.0, 1763800000.0004, 1763800000.0003, 1763799999.0, 1763800000.123456]
    kafka_log.append(topic, [(None, b"x", t) for t in times])
    assert [r.timestamp for r in kafka_log.read(topic, 0, 0)] == times
    assert kafka_log.offset_for_time(topic, 0, 1763800000.00035) == 1
    assert kafka_log.offset_for_time(topic, 0, 1763800000.0005) == 4
    assert kafka_log.offset_for_time(topic, 0, 2e9) == 5


def test_topic_configs_and_group_offsets_are_kafkas_own(kafka_log: KafkaLog,
                                                         kafka_bootstrap: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    topic = f"ads-{uuid.uuid4().hex[:8]}"
    kafka_log.create_topic(TopicSpec(topic, partitions=2, compact=True))
    kafka_log.create_topic(TopicSpec(topic, partitions=2, compact=True))  # idempotent
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert "'cleanup.policy'" in str(described) and "compact" in str(described)
    finally:
        admin.close()
    kafka_log.append(topic, [(b"a", b"1", 1.0), (b"b", b"2", 2.0)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert kafka_log.committed(group, topic) == {}
    kafka_log.commit(group, topic, {0: 1, 1: 1})
    assert kafka_log.committed(group, topic) == {0: 1, 1: 1}
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        assert consumer.committed(TopicPartition(topic, 1)) == 1  # a plain Kafka consumer sees it
    finally:
        consumer.close()


def test_cluster_ids_never_start_with_a_dash() -> None:
    """One id in 64 would; the storage tool then reads it as an option and formatting fails
    (seen once in CI: "argument --cluster-id/-t: expected one argument")."""
    import base64

    from compose.kafka import _cluster_id

    ids = [_cluster_id() for _ in range(10_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
