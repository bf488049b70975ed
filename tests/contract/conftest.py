"""The port contract suites run unchanged on every adapter: these fixtures supply them (the
log's adapters; the sink targets, each over a real store: `sink_targets.py`)."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from streams.log.embedded import EmbeddedLog
from streams.log.port import Log
from tests.contract import sink_targets
from tests.contract.sink_targets import Subject

ADAPTERS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]


@pytest.fixture(params=ADAPTERS)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """A fresh adapter: an embedded log in a temp dir, or a client of the session's Kafka."""
    adapter: Log
    if request.param == "embedded":
        adapter = EmbeddedLog(tmp_path / "log")
    else:
        from streams.log.kafka import KafkaLog

        adapter = KafkaLog(request.getfixturevalue("kafka_bootstrap"))
    try:
        yield adapter
    finally:
        adapter.close()


@pytest.fixture
def topic() -> str:
    """A topic name no other test (or earlier run against the same broker) uses."""
    return f"contract-{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- sink targets

SINK_TARGETS = [pytest.param("elasticsearch", marks=pytest.mark.elasticsearch),
                pytest.param("opensearch", marks=pytest.mark.opensearch),
                "jsonfile", "checkpoint_file", "history", "metrics"]


@pytest.fixture(scope="session")
def carbon() -> Iterator[dict[str, Any]]:
    """A real carbon-cache for the session (the metrics target's service): its line port and
    whisper directory."""
    from compose.monitoring import MonitoringServer

    with MonitoringServer("graphite") as info:
        yield info


@pytest.fixture(params=SINK_TARGETS)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    """One sink target kind over a fresh store of its own (tests/contract/sink_targets.py)."""
    kind = request.param
    if kind in ("elasticsearch", "opensearch"):
        fixture = "es_url" if kind == "elasticsearch" else "opensearch_url"
        made = sink_targets.search_engine(kind, str(request.getfixturevalue(fixture)))
    elif kind == "metrics":
        made = sink_targets.metrics(request.getfixturevalue("carbon"))
    else:
        made = {"jsonfile": sink_targets.json_files, "checkpoint_file": sink_targets.checkpoint_file,
                "history": sink_targets.history_db}[kind](tmp_path)
    yield from sink_targets.closing(made)
