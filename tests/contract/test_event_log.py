"""Contract of `streams.log.events.EventLog` (envelopes, DLQ, .jsonl), on every adapter."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from schemas.events import Envelope, JobStarted, JobStopped, JobSubmitted, encode, make_event
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog, open_log
from streams.log.port import Log, LogError, TopicSpec
from streams.log.topics import ADS, DERIVED, EVENTS, dlq_topic, ensure_topics

T0 = 1_763_800_000.0
USERS = ["alice@example.org", "bob@example.org", "group_physics.carol@example.org"]


def events(n: int, source: str = "schedd@ap1.example.org") -> list[Envelope]:
    out = []
    for i in range(n):
        user = USERS[i % len(USERS)]
        jid = f"{i // 3}.{i % 3}"
        payload = (JobSubmitted(jid, source, user, {"ClusterId": i // 3, "ProcId": i % 3})
                   if i % 3 == 0 else
                   JobStarted(jid, source, user, f"slot{i % 8}@ep{i % 5}.example.org", 1.0,
                              {"Cpus": 1, "Memory": 2048}, "xsw")
                   if i % 3 == 1 else
                   JobStopped(jid, f"slot{i % 8}@ep{i % 5}.example.org", "completed", source, user))
        out.append(make_event(payload, ts=T0 + i * 0.25, source=source, seq=i + 1))
    return out


def test_envelopes_roundtrip_keyed_by_submitter(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 3))
    elog = EventLog(log)
    sent = events(300)
    landed = elog.append(topic, sent)
    assert len(landed) == 300
    got = list(elog.read(topic))
    assert sorted(e.id for _, e in got) == sorted(e.id for e in sent)
    assert {e.id: e for _, e in got} == {e.id: e for e in sent}
    for rec, env in got:
        assert rec.key == env.data.submitter.encode()
        assert rec.timestamp == env.ts
    assert elog.dlq_count == 0
    assert dlq_topic(topic) not in log.topics()


def test_read_until_and_from_positions(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 1))
    elog = EventLog(log)
    sent = events(40)
    elog.append(topic, sent)
    assert [e.id for _, e in elog.read(topic, until_ts=T0 + 2.5)] == [e.id for e in sent[:11]]
    assert [e.id for _, e in elog.read(topic, start_positions={0: 35})] == [e.id for e in sent[35:]]


def test_bad_records_go_to_the_dlq(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 1))
    elog = EventLog(log, batch=3)  # the bad records straddle read chunks
    good = events(4)
    invalid = json.loads(encode(good[1]))
    invalid["data"]["slot_weight"] = "heavy"
    unknown = dict(json.loads(encode(good[0])), type="job.exploded")
    bad = [b"\xff\x00 not json", json.dumps(invalid).encode(), json.dumps(unknown).encode(),
           b'{"id": "x"}']
    lines = [(None, encode(good[0]), T0), (None, bad[0], T0), (b"k", bad[1], T0 + 1),
             (None, encode(good[1]), T0), (None, bad[2], T0), (None, encode(good[2]), T0),
             (None, bad[3], T0 + 2), (None, encode(good[3]), T0)]
    elog.append_raw(topic, lines)
    assert [e.id for _, e in elog.read(topic)] == [e.id for e in good]
    assert elog.dlq_count == 4
    letters = elog.dead_letters(topic)
    assert [d.raw for d in letters] == bad
    assert [d.offset for d in letters] == [1, 2, 4, 6]
    assert all(d.topic == topic and d.partition == 0 for d in letters)
    assert letters[1].key == b"k" and letters[0].key is None
    assert "not valid JSON" in letters[0].reason
    assert "data.slot_weight" in letters[1].reason and "job.started" in letters[1].reason
    assert "unknown event type" in letters[2].reason
    assert "missing" in letters[3].reason
    # the stored DLQ value is JSON naming reason, raw bytes and source position
    (stored,) = log.read(dlq_topic(topic), 0, 1, max_records=1)
    value = json.loads(stored.value)
    assert value["topic"] == topic and value["partition"] == 0 and value["offset"] == 2
    assert "raw_b64" in value and "reason" in value
    # reading again, here or in another EventLog, adds no duplicates to the DLQ
    list(elog.read(topic))
    again = EventLog(log)
    assert len(list(again.read(topic))) == 4
    assert again.dlq_count == 4
    assert len(again.dead_letters(topic)) == 4


def test_export_import_roundtrip(log: Log, topic: str, tmp_path: Path) -> None:
    log.create_topic(TopicSpec(topic, 1))
    elog = EventLog(log)
    sent = events(500)
    elog.append(topic, sent)
    out = tmp_path / "events.jsonl"
    assert elog.export_jsonl(topic, out) == 500
    lines = out.read_bytes().splitlines()
    assert lines == [encode(e) for e in sent]
    copy = f"{topic}-copy"
    log.create_topic(TopicSpec(copy, 1))
    assert elog.import_jsonl(out, copy) == (500, 0)
    again = tmp_path / "again.jsonl"
    assert elog.export_jsonl(copy, again) == 500
    assert again.read_bytes() == out.read_bytes()
    assert dlq_topic(copy) not in log.topics()
    with pytest.raises(LogError, match="cannot write"):
        elog.export_jsonl(topic, tmp_path / "no" / "such" / "dir.jsonl")
    with pytest.raises(LogError, match="cannot read"):
        elog.import_jsonl(tmp_path / "missing.jsonl", topic)


def test_import_rejects_bad_lines_to_the_dlq(log: Log, topic: str, tmp_path: Path) -> None:
    log.create_topic(TopicSpec(topic, 2))
    elog = EventLog(log)
    sent = events(6)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join([encode(sent[0]), b"{broken", encode(sent[1]), b"",
                                 b'{"id": "y", "type": "job.started"}', encode(sent[2])]) + b"\n")
    assert elog.import_jsonl(path, topic) == (3, 2)
    assert sorted(e.id for _, e in elog.read(topic)) == sorted(e.id for e in sent[:3])
    letters = elog.dead_letters(topic)
    assert [d.raw for d in letters] == [b"{broken", b'{"id": "y", "type": "job.started"}']
    assert letters[0].reason.startswith(f"{path}:2: ")
    assert letters[1].reason.startswith(f"{path}:5: ")
    assert [d.line for d in letters] == [2, 5]
    assert elog.dlq_count == 2


def test_ensure_topics_is_idempotent(log: Log) -> None:
    specs = ensure_topics(log, partitions=2)
    ensure_topics(log, partitions=2)
    assert {s.name for s in specs} == {EVENTS, DERIVED, ADS}
    assert {EVENTS, DERIVED, ADS} <= set(log.topics())
    assert [s.compact for s in specs if s.name == ADS] == [True]
    if isinstance(log, EmbeddedLog):  # on a shared broker another test may have made them first
        assert all(log.partitions(s.name) == 2 for s in specs)


@pytest.mark.slow
def test_hundred_thousand_events_roundtrip(log: Log, topic: str) -> None:
    """No loss, no duplication at volume (on Kafka this crosses many produce/fetch batches)."""
    log.create_topic(TopicSpec(topic, 3))
    elog = EventLog(log)
    sent = events(100_000, source=f"schedd@{uuid.uuid4().hex[:6]}")
    for i in range(0, len(sent), 10_000):
        elog.append(topic, sent[i:i + 10_000])
    ids = [env.id for _, env in elog.read(topic)]
    assert len(ids) == 100_000
    assert set(ids) == {e.id for e in sent}
    assert sum(log.end_offsets(topic).values()) == 100_000


def test_open_log(tmp_path: Path) -> None:
    embedded = open_log(None, tmp_path)
    assert isinstance(embedded, EmbeddedLog) and embedded.root == tmp_path / "log"
    embedded.close()
    elsewhere = open_log(f"file://{tmp_path}/other", tmp_path)
    assert isinstance(elsewhere, EmbeddedLog) and elsewhere.root == tmp_path / "other"
    elsewhere.close()
    for url in ("http://broker:9092", "broker:9092", "pulsar://x:6650"):
        with pytest.raises(LogError, match=url.replace(".", r"\.")):
            open_log(url, tmp_path)


@pytest.mark.kafka
def test_open_log_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    from streams.log.kafka import KafkaLog

    log = open_log(f"kafka://{kafka_bootstrap}", tmp_path)
    try:
        assert isinstance(log, KafkaLog)
        assert isinstance(log.topics(), list)
    finally:
        log.close()
