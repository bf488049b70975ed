"""The log: the port every adapter implements, the embedded adapter, the topic table and the
event layer. The Kafka adapter (`streams.log.kafka`) is imported only when a Kafka URL is
opened, so one-machine use never loads kafka-python."""
from __future__ import annotations

from streams.log.embedded import EmbeddedLog
from streams.log.events import DeadLetter, EventLog, open_log
from streams.log.port import (Appended, Log, LogError, Outgoing, Record, TopicNotFoundError,
                              TopicSpec, iter_topic)
from streams.log.topics import ADS, DERIVED, DLQ_SUFFIX, EVENTS, TOPICS, dlq_topic, ensure_topics

__all__ = [
    "ADS", "DERIVED", "DLQ_SUFFIX", "EVENTS", "TOPICS", "Appended", "DeadLetter", "EmbeddedLog",
    "EventLog", "Log", "LogError", "Outgoing", "Record", "TopicNotFoundError", "TopicSpec",
    "dlq_topic", "ensure_topics", "iter_topic", "open_log",
]
