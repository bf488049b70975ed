"""The metrics sink on the sink runner (embedded log): same series as a direct fold, its own
checkpoint, a down publisher retried without folding twice, following new events."""
from __future__ import annotations

import io
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from ganglia.errors import PublisherUnavailableError
from ganglia.gangliad import Gangliad
from ganglia.metrics import GangliadConfig, Metric, load_metrics
from ganglia.publish import HISTORY, Delivery
from ganglia.sink import MetricsTarget
from schemas.events import Envelope
from schemas.settings import load_settings
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from streams.sink import SinkRunner
from streams.sink import TargetUnavailableError as SinkUnavailableError
from tests.ganglia.helpers import evaluations, simulate


class Recorder:
    """A history publisher that keeps what it got, and can be switched off."""

    name = "recorder"

    def __init__(self) -> None:
        self.got: list[tuple[float, list[Metric]]] = []
        self.down = False
        self.calls = 0

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        self.calls += 1
        if self.down:
            raise PublisherUnavailableError("recorder is down")
        self.got.append((at, list(metrics)))
        return len(metrics)

    def close(self) -> None:
        pass


def target(recorder: Recorder, topic: str = EVENTS) -> MetricsTarget:
    settings = load_settings()
    defs, _ = load_metrics(None)
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings)
    return MetricsTarget(daemon, Delivery([(recorder, HISTORY)], err=io.StringIO()), topic=topic)


def events_of(log_dir: Path) -> list[Envelope]:
    source = EmbeddedLog(log_dir)
    try:
        return [env for _rec, env in EventLog(source).read(EVENTS)]
    finally:
        source.close()


def test_runner_gives_the_direct_folds_series_and_survives_a_down_publisher(tmp_path: Path) -> None:
    log_dir = simulate(tmp_path)
    want, final, _ = evaluations(log_dir)
    rec = Recorder()
    t = target(rec)
    log = EmbeddedLog(log_dir)
    try:
        rec.down = True
        runner = SinkRunner(log, t, batch=500, backoff=0.01, max_backoff=0.02, give_up_after=0.2,
                            progress=False)
        with pytest.raises(SinkUnavailableError, match="recorder"):  # held, then given up
            runner.run_once()
        held = t.positions()
        assert held in ({}, {EVENTS: {0: 0}})  # folded but not published: not acknowledged
        assert rec.calls >= 2  # folded (evaluations to publish), publishing retried
        rec.down = False
        report = SinkRunner(log, t, batch=500, progress=False).run_once()
        assert report.lag == 0
        assert t.positions() == {EVENTS: log.end_offsets(EVENTS)}
        # never committed to a consumer group: a restart refolds from the start
        assert log.committed("poolledger.sink.gangliad", EVENTS) in ({}, {0: 0})
    finally:
        log.close()
    assert [(at, ms) for at, ms in rec.got] == [(e.at, e.metrics) for e in want]
    end = t.finish()
    assert end is not None and end.metrics == final.metrics


def test_follow_publishes_each_new_boundary(tmp_path: Path) -> None:
    log_dir = simulate(tmp_path)
    events = events_of(log_dir)
    half = len(events) // 2
    log = EmbeddedLog(tmp_path / "follow")
    try:
        from streams.log.events import ensure_topics

        ensure_topics(log)
        elog = EventLog(log)
        elog.append(EVENTS, events[:half])
        rec = Recorder()
        t = target(rec)
        runner = SinkRunner(log, t, progress=False)
        runner.run_once()
        before = len(rec.got)
        stop = threading.Event()
        worker = threading.Thread(target=runner.follow, args=(stop, 0.05))
        worker.start()
        try:
            elog.append(EVENTS, events[half:])
            pause = threading.Event()
            for _ in range(200):
                if runner.lag() == 0 and len(rec.got) > before:
                    break
                pause.wait(0.05)
        finally:
            stop.set()
            worker.join(10)
        assert len(rec.got) > before
        direct, _, _ = evaluations(log_dir)
        assert [at for at, _ in rec.got] == [e.at for e in direct]
    finally:
        log.close()


@pytest.mark.kafka
def test_on_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    from streams.log.kafka import KafkaLog
    from streams.log.port import TopicSpec

    log_dir = simulate(tmp_path)
    want, _, _ = evaluations(log_dir)
    topic = f"metricstest.{time.time_ns()}"
    with KafkaLog(kafka_bootstrap) as log:
        log.create_topic(TopicSpec(topic, 1))
        EventLog(log).append(topic, events_of(log_dir))
        rec = Recorder()
        report = SinkRunner(log, target(rec, topic), progress=False).run_once()
        assert report.lag == 0
    assert [(at, ms) for at, ms in rec.got] == [(e.at, e.metrics) for e in want]
