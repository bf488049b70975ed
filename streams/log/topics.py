"""The topic table: every topic PoolLedger writes, with how it is created.

One place for names so the CLI, the processors and the sinks cannot drift apart. Event topics
are keyed by `schemas.events.partition_key` (the submitter for job events), so the partition
count can grow with the pool without reordering any one submitter's events.
"""
from __future__ import annotations

from dataclasses import dataclass

from streams.log.port import Log, LogError, TopicSpec

EVENTS = "poolledger.events"
DERIVED = "poolledger.derived"
ADS = "poolledger.ads"
DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A row of the topic table."""

    name: str
    compact: bool
    purpose: str


TOPICS: dict[str, TopicInfo] = {t.name: t for t in (
    TopicInfo(EVENTS, False, "every daemon event: ads, job lifecycle, matches, admin commands"),
    TopicInfo(DERIVED, False, "events derived by processors: priority, quota and limit changes"),
    TopicInfo(ADS, True, "latest ClassAd per (ad type, name); compacted"),
)}


class PartitionsError(LogError):
    """An events topic with more than one partition: folding it would interleave partitions
    in an arbitrary order, so every runner refuses it."""


def require_one_partition(log: Log, topic: str) -> None:
    """Raise PartitionsError unless `topic` has exactly one partition (the ledger folds one
    total order; DESIGN.md, Scale-out: shard by named negotiators instead)."""
    n = log.partitions(topic)
    if n != 1:
        raise PartitionsError(one_partition_message(topic, n))


def one_partition_message(topic: str, partitions: int) -> str:
    return (f"events topic {topic} has {partitions} partitions: the ledger folds one total "
            "order, so it needs exactly 1 (recreate the topic with one partition)")


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of `topic` (created on demand, one partition)."""
    return topic + DLQ_SUFFIX


def topic_specs(partitions: int = 1) -> list[TopicSpec]:
    """Specs of the table's topics, all with `partitions` partitions."""
    return [TopicSpec(t.name, partitions, t.compact) for t in TOPICS.values()]


def ensure_topics(log: Log, partitions: int = 1) -> list[TopicSpec]:
    """Create the table's topics if missing (idempotent; existing topics keep their layout)."""
    specs = topic_specs(partitions)
    for spec in specs:
        log.create_topic(spec)
    return specs
