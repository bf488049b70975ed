"""Contract of `streams.log.port.Log`, run on the embedded log and on a real Kafka broker."""
from __future__ import annotations

import uuid
from collections import defaultdict

import pytest

from streams.log.port import Log, LogError, Outgoing, TopicNotFoundError, TopicSpec, iter_topic

T0 = 1_763_800_000.0  # whole milliseconds: Kafka keeps event time in ms


def test_create_is_idempotent(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 3))
    log.create_topic(TopicSpec(topic, 3))
    assert topic in log.topics()
    assert log.topics().count(topic) == 1
    assert log.partitions(topic) == 3
    assert log.end_offsets(topic) == {0: 0, 1: 0, 2: 0}


def test_compact_topic_can_be_created(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 2, compact=True))
    assert log.partitions(topic) == 2


def test_missing_topic_is_reported(log: Log) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TopicNotFoundError):
        log.partitions(missing)
    with pytest.raises(TopicNotFoundError):
        log.append(missing, [(None, b"x", T0)])
    with pytest.raises(LogError):
        log.read(missing, 0, 0)


def test_append_returns_dense_offsets(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 1))
    first = log.append(topic, [(None, b"v%d" % i, T0 + i) for i in range(5)])
    second = log.append(topic, [(b"k", b"w%d" % i, T0 + i) for i in range(3)])
    assert [(a.partition, a.offset) for a in first + second] == [(0, i) for i in range(8)]
    assert log.end_offsets(topic) == {0: 8}
    assert log.append(topic, []) == []


def test_offsets_are_dense_per_partition(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 4))
    landed = log.append(topic, [(b"key-%d" % (i % 13), b"v%d" % i, T0) for i in range(200)])
    per_partition: dict[int, list[int]] = defaultdict(list)
    for a in landed:
        per_partition[a.partition].append(a.offset)
    assert len(per_partition) > 1
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))
    assert log.end_offsets(topic) == {p: len(per_partition.get(p, [])) for p in range(4)}


def test_same_key_same_partition_in_order(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 4))
    keys = [f"user{i}@example.org".encode() for i in range(8)]
    records: list[Outgoing] = [(keys[i % 8], b"%d" % i, T0 + i) for i in range(400)]
    landed = log.append(topic, records[:200]) + log.append(topic, records[200:])
    home: dict[bytes, set[int]] = defaultdict(set)
    for (key, _, _), a in zip(records, landed):
        assert key is not None
        home[key].add(a.partition)
    assert all(len(parts) == 1 for parts in home.values())
    for key in keys:
        (partition,) = home[key]
        values = [r.value for r in log.read(topic, partition, 0) if r.key == key]
        assert values == [v for k, v, _ in records if k == key]


def test_read_from_a_position(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 1))
    log.append(topic, [(b"k%d" % i if i % 2 else None, b"value-%d" % i, T0 + i) for i in range(10)])
    got = log.read(topic, 0, 3, max_records=4)
    assert [(r.topic, r.partition, r.offset) for r in got] == [(topic, 0, o) for o in range(3, 7)]
    assert [r.value for r in got] == [b"value-%d" % i for i in range(3, 7)]
    assert [r.key for r in got] == [b"k3", None, b"k5", None]
    assert [r.timestamp for r in got] == [T0 + i for i in range(3, 7)]
    rest = log.read(topic, 0, 7)
    assert [r.offset for r in rest] == [7, 8, 9]
    again = log.read(topic, 0, 0, max_records=2)  # seeking backwards works
    assert [r.offset for r in again] == [0, 1]


def test_read_at_the_end_is_empty(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 2))
    assert log.read(topic, 0, 0) == []
    log.append(topic, [(None, b"only", T0)])
    assert log.read(topic, 0, 1) == []
    assert len(log.read(topic, 0, 0)) == 1
    log.append(topic, [(None, b"next", T0)])  # the end moves after a read at the end
    assert [r.value for r in log.read(topic, 0, 1)] == [b"next"]


def test_offset_for_time(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 1))
    log.append(topic, [(None, b"%d" % i, T0 + 10 * i) for i in range(10)])
    assert log.offset_for_time(topic, 0, 0.0) == 0  # before the first
    assert log.offset_for_time(topic, 0, T0) == 0
    assert log.offset_for_time(topic, 0, T0 + 30) == 3  # exact
    assert log.offset_for_time(topic, 0, T0 + 31) == 4  # between
    assert log.offset_for_time(topic, 0, T0 + 90) == 9  # the last
    assert log.offset_for_time(topic, 0, T0 + 91) == 10  # after the last: the end offset
    assert log.offset_for_time(topic, 0, T0 + 1e6) == 10


def test_offset_for_time_with_late_events(log: Log, topic: str) -> None:
    """Event time need not be monotonic: the answer is the first offset with ts >= t."""
    log.create_topic(TopicSpec(topic, 1))
    log.append(topic, [(None, b"a", T0 + 10), (None, b"b", T0 + 30), (None, b"c", T0 + 20)])
    log.append(topic, [(None, b"d", T0 + 40), (None, b"e", T0 + 5)])
    assert log.offset_for_time(topic, 0, T0 + 15) == 1
    assert log.offset_for_time(topic, 0, T0 + 25) == 1
    assert log.offset_for_time(topic, 0, T0 + 35) == 3
    assert log.offset_for_time(topic, 0, T0 + 41) == 5


def test_commit_and_committed(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 2))
    log.append(topic, [(b"k%d" % i, b"v", T0) for i in range(20)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert log.committed(group, topic) == {}
    log.commit(group, topic, {0: 5})
    assert log.committed(group, topic) == {0: 5}
    log.commit(group, topic, {1: 3})
    assert log.committed(group, topic) == {0: 5, 1: 3}
    log.commit(group, topic, {0: 7})
    assert log.committed(group, topic) == {0: 7, 1: 3}
    assert log.committed(f"other-{group}", topic) == {}


def test_iter_topic_reads_every_partition(log: Log, topic: str) -> None:
    log.create_topic(TopicSpec(topic, 3))
    records: list[Outgoing] = [(b"s%d" % (i % 7), b"event-%d" % i, T0 + i) for i in range(3000)]
    landed = log.append(topic, records)
    got = list(iter_topic(log, topic, batch=500))
    assert len(got) == 3000
    assert sorted(r.value for r in got) == sorted(v for _, v, _ in records)
    by_partition: dict[int, list[int]] = defaultdict(list)
    for r in got:
        by_partition[r.partition].append(r.offset)
    assert all(offs == list(range(len(offs))) for offs in by_partition.values())
    where = {v: (a.partition, a.offset) for (_, v, _), a in zip(records, landed)}
    assert all(where[r.value] == (r.partition, r.offset) for r in got)
    start = {p: n // 2 for p, n in log.end_offsets(topic).items()}
    tail = list(iter_topic(log, topic, start))
    assert len(tail) == sum(n - start[p] for p, n in log.end_offsets(topic).items())
