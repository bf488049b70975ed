"""The sink runner over the Log port: checkpoint after acknowledgement, DLQs, lag, once/follow.

The target is a JSON-lines file (one document per delivered event) that can be switched off
(unavailable) and refuses events whose job ad has `Reject = true`, so every promise of the
runner is checked by reading what really reached the file and what really is in the log.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import orjson
import pytest

from schemas.events import AdminCommanded, JobHistory, encode, make_event
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.port import Log, TopicSpec
from streams.log.topics import DERIVED, EVENTS, dlq_topic
from streams.sink import (Positions, Rejection, SinkItem, SinkRunner, TargetUnavailableError,
                          sink_group)

T0 = 1_763_800_000.0


class JsonFileTarget:
    """Appends one JSON line per accepted item; records the checkpoint it was promised."""

    def __init__(self, path: Path, name: str = "jsonfile",
                 topics: tuple[str, ...] = (EVENTS,)) -> None:
        self.name = name
        self.topics = topics
        self.path = path
        self.up = True
        self.calls: list[tuple[int, Positions]] = []
        self.fail_after: int | None = None  # become unavailable after this many deliveries

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            self.up = False
        if not self.up:
            raise TargetUnavailableError(f"{self.path} is switched off")
        out: list[Rejection] = []
        with self.path.open("ab") as f:
            for it in items:
                if isinstance(it.event.data, JobHistory) and it.event.data.ad.get("Reject"):
                    out.append(Rejection(it, "mapper_parsing_exception: field [Reject]"))
                    continue
                f.write(orjson.dumps({"id": it.event.id, "topic": it.topic,
                                      "partition": it.partition, "offset": it.offset}) + b"\n")
        self.calls.append((len(items), {t: dict(p) for t, p in upto.items()}))
        return out

    def positions(self) -> Positions | None:
        return None

    def close(self) -> None:
        pass

    def docs(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        return [orjson.loads(line) for line in self.path.read_bytes().splitlines()]


def history(i: int, **extra: object) -> bytes:
    ad = {"GlobalJobId": f"ap1#{i}.0#{int(T0)}", "ClusterId": i, "ProcId": 0, **extra}
    return encode(make_event(JobHistory(ad), ts=T0 + i, source="schedd@ap1", seq=i))


def append(log: Log, values: list[bytes], topic: str = EVENTS) -> None:
    log.append(topic, [(None, v, T0) for v in values])


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    lg = EmbeddedLog(tmp_path / "log")
    lg.create_topic(TopicSpec(EVENTS, 1))
    lg.create_topic(TopicSpec(DERIVED, 1))
    yield lg
    lg.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_once_delivers_everything_and_checkpoints_after_each_ack(log: EmbeddedLog,
                                                                 tmp_path: Path, overlap: bool) -> None:
    append(log, [history(i) for i in range(25)])
    target = JsonFileTarget(tmp_path / "out.jsonl")
    runner = SinkRunner(log, target, batch=10, progress=False, overlap=overlap)
    assert runner.lag() == 25
    report = runner.run_once()
    assert (report.delivered, report.rejected, report.lag) == (25, 0, 0)
    assert [d["offset"] for d in target.docs()] == list(range(25))
    # batches of 10, each promising the checkpoint just after its last item
    assert [(n, upto[EVENTS][0]) for n, upto in target.calls] == [(10, 10), (10, 20), (5, 25)]
    assert log.committed(sink_group("jsonfile"), EVENTS) == {0: 25}
    # a second run finds nothing new and writes nothing
    again = runner.run_once()
    assert (again.delivered, again.lag, len(target.docs())) == (0, 0, 25)


@pytest.mark.parametrize("overlap", [False, True])
def test_checkpoint_never_ahead_of_the_ack_while_the_target_is_down(
        log: EmbeddedLog, tmp_path: Path, caplog: pytest.LogCaptureFixture, overlap: bool) -> None:
    append(log, [history(i) for i in range(30)])
    target = JsonFileTarget(tmp_path / "out.jsonl")
    target.fail_after = 2
    runner = SinkRunner(log, target, batch=10, backoff=0.01, max_backoff=0.02,
                        give_up_after=0.2, progress=False, overlap=overlap)
    with caplog.at_level(logging.WARNING, logger="streams.sink"):
        with pytest.raises(TargetUnavailableError):
            runner.run_once()
    # two batches acknowledged: exactly those are in the file and in the checkpoint
    assert len(target.docs()) == 20
    assert log.committed(sink_group("jsonfile"), EVENTS) == {0: 20}
    assert runner.lag() == 10
    # one line for the whole outage, however many retries
    down = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(down) == 1 and "[0]@20" in down[0].getMessage()
    # back up: the rest follows, nothing twice
    target.fail_after = None
    target.up = True
    assert runner.run_once().delivered == 10
    assert [d["offset"] for d in target.docs()] == list(range(30))


@pytest.mark.parametrize("overlap", [False, True])
def test_rejections_go_to_the_sink_dlq_with_the_reason_and_the_stream_goes_on(
        log: EmbeddedLog, tmp_path: Path, overlap: bool) -> None:
    append(log, [history(0), history(1, Reject=True), history(2)])
    target = JsonFileTarget(tmp_path / "out.jsonl")
    runner = SinkRunner(log, target, batch=2, progress=False, overlap=overlap)
    report = runner.run_once()
    assert (report.delivered, report.rejected) == (2, 1)
    assert [d["offset"] for d in target.docs()] == [0, 2]
    (dead,) = runner.dead_letters()
    assert dead.reason == (f"jsonfile rejected event schedd@ap1:1: "
                           "mapper_parsing_exception: field [Reject]")
    assert (dead.topic, dead.partition, dead.offset) == (EVENTS, 0, 1)
    assert orjson.loads(dead.raw)["data"]["ad"]["Reject"] is True
    assert log.committed(sink_group("jsonfile"), EVENTS) == {0: 3}
    assert EventLog(log).dead_letters(sink_group("jsonfile")) == [dead]
    assert dlq_topic(sink_group("jsonfile")) in log.topics()


@pytest.mark.parametrize("overlap", [False, True])
def test_undecodable_records_go_to_the_topic_dlq_and_the_checkpoint_passes_them(
        log: EmbeddedLog, tmp_path: Path, overlap: bool) -> None:
    append(log, [history(0), b"{not json", history(2), b'{"id": "x"}'])
    target = JsonFileTarget(tmp_path / "out.jsonl")
    runner = SinkRunner(log, target, batch=1, progress=False, overlap=overlap)
    report = runner.run_once()
    assert (report.delivered, report.dead_lettered_at_decode, report.lag) == (2, 2, 0)
    assert [d["offset"] for d in target.docs()] == [0, 2]
    # the trailing bad record too is behind the checkpoint
    assert log.committed(sink_group("jsonfile"), EVENTS) == {0: 4}
    dead = EventLog(log).dead_letters(EVENTS)
    assert sorted(d.offset for d in dead if d.offset is not None) == [1, 3]
    # re-running adds no second DLQ entry
    runner2 = SinkRunner(log, JsonFileTarget(tmp_path / "o2.jsonl"), progress=False)
    runner2.run_once()
    assert len(EventLog(log).dead_letters(EVENTS)) == 2


@pytest.mark.parametrize("overlap", [False, True])
def test_several_topics_and_partitions(tmp_path: Path, overlap: bool) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic(TopicSpec(EVENTS, 3))
    log.create_topic(TopicSpec(DERIVED, 1))
    log.append(EVENTS, [(b"k%d" % i, history(i), T0) for i in range(40)])
    admin = make_event(AdminCommanded(op="setfactor", target="a@x", value=2.0, by="root",
                                      reason="r"), ts=T0, source="admin", seq=1)
    log.append(DERIVED, [(None, encode(admin), T0)])
    target = JsonFileTarget(tmp_path / "out.jsonl", topics=(EVENTS, DERIVED))
    runner = SinkRunner(log, target, batch=7, progress=False, overlap=overlap)
    assert runner.lag() == 41
    report = runner.run_once()
    assert (report.delivered, report.lag) == (41, 0)
    docs = target.docs()
    assert sorted((d["topic"], d["partition"], d["offset"]) for d in docs) == sorted(
        [(EVENTS, p, o) for p, n in log.end_offsets(EVENTS).items() for o in range(n)]
        + [(DERIVED, 0, 0)])
    assert log.committed(sink_group("jsonfile"), EVENTS) == log.end_offsets(EVENTS)
    log.close()


def test_follow_delivers_new_events_until_stopped(log: EmbeddedLog, tmp_path: Path) -> None:
    target = JsonFileTarget(tmp_path / "out.jsonl")
    runner = SinkRunner(log, target, progress=False)
    stop = threading.Event()
    result = []
    th = threading.Thread(target=lambda: result.append(runner.follow(stop, poll_seconds=0.05)))
    th.start()
    try:
        append(log, [history(i) for i in range(5)])
        deadline = time.monotonic() + 10
        while len(target.docs()) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        append(log, [history(i) for i in range(5, 8)])
        while len(target.docs()) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        th.join(10)
    assert not th.is_alive()
    assert [d["offset"] for d in target.docs()] == list(range(8))
    assert result[0].delivered == 8 and result[0].lag == 0


def test_follow_stops_while_the_target_is_down(log: EmbeddedLog, tmp_path: Path) -> None:
    append(log, [history(i) for i in range(3)])
    target = JsonFileTarget(tmp_path / "out.jsonl")
    target.up = False
    runner = SinkRunner(log, target, backoff=0.01, max_backoff=0.05, progress=False)
    stop = threading.Event()
    th = threading.Thread(target=runner.follow, args=(stop, 0.05))
    th.start()
    time.sleep(0.3)
    stop.set()
    th.join(10)
    assert not th.is_alive()
    assert log.committed(sink_group("jsonfile"), EVENTS) == {}
    assert runner.lag() == 3


@pytest.mark.kafka
def test_on_kafka_as_a_consumer_group(kafka_bootstrap: str, tmp_path: Path) -> None:
    from streams.log.kafka import KafkaLog

    suffix = f"{time.time_ns()}"
    topic = f"sinktest.{suffix}"
    with KafkaLog(kafka_bootstrap) as log:
        log.create_topic(TopicSpec(topic, 2))
        log.append(topic, [(b"k%d" % i, history(i), T0) for i in range(20)])
        log.append(topic, [(b"k0", b"garbage", T0)])
        log.append(topic, [(b"k%d" % i, history(i, Reject=(i == 21)), T0) for i in (21, 22)])
        target = JsonFileTarget(tmp_path / "out.jsonl", name=f"t{suffix}", topics=(topic,))
        target.fail_after = 1
        runner = SinkRunner(log, target, batch=6, backoff=0.01, give_up_after=0.1,
                            progress=False)
        with pytest.raises(TargetUnavailableError):
            runner.run_once()
        assert sum(log.committed(runner.group, topic).values()) == 6
        target.fail_after = None
        target.up = True
        report = runner.run_once()
        assert (report.rejected, report.dead_lettered_at_decode, report.lag) == (1, 1, 0)
        assert len(target.docs()) == 21  # 22 events, one refused
        assert len({(d["partition"], d["offset"]) for d in target.docs()}) == 21
        assert log.committed(runner.group, topic) == log.end_offsets(topic)
        (dead,) = runner.dead_letters()
        assert "schedd@ap1:21" in dead.reason


class RecordingTarget(JsonFileTarget):
    """Keeps every item it is handed; refuses the event at offset `refuse`."""

    def __init__(self, path: Path, refuse: int) -> None:
        super().__init__(path, topics=(EVENTS, DERIVED))
        self.items: list[SinkItem] = []
        self.refuse = refuse

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        self.items += items
        return [Rejection(it, "refused") for it in items if it.offset == self.refuse]


@pytest.mark.parametrize("overlap", [False, True])
def test_lean_events_are_validated_then_handed_over_as_their_stored_bytes(
        log: EmbeddedLog, tmp_path: Path, overlap: bool) -> None:
    """A type read lean comes with `data=None` and its stored bytes; a bad one of that type
    is dead-lettered exactly as when read whole; other types stay decoded; a refused lean
    item reaches the sink's DLQ with its stored bytes."""
    deep = orjson.loads(history(1))
    deep["data"]["ad"]["Nested"] = [[[[[1]]]]]  # five levels: beyond JSON_DEPTH
    stored = [history(0), orjson.dumps(deep), history(2), history(3)]
    append(log, stored)
    admin = make_event(AdminCommanded(op="setfactor", target="a@x", value=2.0, by="root",
                                      reason="r"), ts=T0, source="admin", seq=1)
    append(log, [encode(admin)], topic=DERIVED)
    target = RecordingTarget(tmp_path / "out.jsonl", refuse=3)
    runner = SinkRunner(log, target, batch=2, progress=False, overlap=overlap,
                        lean=frozenset({JobHistory.TYPE}))
    report = runner.run_once()
    assert (report.delivered, report.rejected, report.dead_lettered_at_decode) == (3, 1, 1)
    jobs = [it for it in target.items if it.topic == EVENTS]
    assert [it.offset for it in jobs] == [0, 2, 3]
    assert all(it.event.data is None and it.raw == stored[it.offset] for it in jobs)
    assert [it.event.id for it in jobs] == ["schedd@ap1:0", "schedd@ap1:2", "schedd@ap1:3"]
    (adm,) = [it for it in target.items if it.topic == DERIVED]
    assert adm.event.data == admin.data and adm.raw == b""
    (bad,) = EventLog(log).dead_letters(EVENTS)
    assert bad.offset == 1 and "nested deeper" in bad.reason
    (refused,) = runner.dead_letters()
    assert refused.offset == 3 and refused.raw == stored[3]


class StagedJsonFileTarget(JsonFileTarget):
    """The file target split into a stage (the item list, and the thread that made it) and
    the write; it records the threads each part ran on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.threads: list[tuple[str, str]] = []

    def stage(self, items: Sequence[SinkItem]) -> tuple[list[SinkItem], str]:
        return list(items), threading.current_thread().name

    def deliver_staged(self, staged: tuple[list[SinkItem], str],
                       upto: Positions) -> list[Rejection]:
        items, staged_on = staged
        self.threads.append((staged_on, threading.current_thread().name))
        return JsonFileTarget.deliver(self, items, upto)

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        return self.deliver_staged(self.stage(items), upto)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_staged_target_is_staged_on_the_reading_thread_and_written_on_the_worker(
        log: EmbeddedLog, tmp_path: Path, overlap: bool) -> None:
    """Overlapped, each batch is staged on the runner's thread and written on the worker,
    with the same batches, checkpoints, rejections (DLQ) and retries as an unstaged
    target; without overlap, everything stays on the runner's thread."""
    append(log, [history(i, Reject=i == 12) for i in range(25)])
    target = StagedJsonFileTarget(tmp_path / "out.jsonl")
    target.fail_after = 2
    runner = SinkRunner(log, target, batch=10, backoff=0.01, max_backoff=0.02,
                        give_up_after=0.2, progress=False, overlap=overlap)
    with pytest.raises(TargetUnavailableError):
        runner.run_once()
    assert log.committed(sink_group("jsonfile"), EVENTS) == {0: 20}
    target.fail_after = None
    target.up = True
    report = runner.run_once()
    assert (report.delivered, report.lag) == (5, 0)
    assert [d["offset"] for d in target.docs()] == [o for o in range(25) if o != 12]
    assert [(n, upto[EVENTS][0]) for n, upto in target.calls] == [(10, 10), (10, 20), (5, 25)]
    assert [d.offset for d in runner.dead_letters()] == [12]
    main = threading.current_thread().name
    assert all(staged_on == main for staged_on, _ in target.threads)
    assert all((written_on != main) == overlap for _, written_on in target.threads)
