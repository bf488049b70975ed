"""The log port's contract suite runs unchanged on every adapter: this fixture supplies them."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from streams.log.embedded import EmbeddedLog
from streams.log.port import Log

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
