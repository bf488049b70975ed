"""Every faust/aiokafka internal the faust runner relies on, in one module.

Checked against faust-streaming 0.15.3, aiokafka 0.14.0 and kafka-python 3.0 (the reader).
A faust upgrade re-checks what this module reaches into; nothing else in the repo does.

The protocol of a flush (streams.faust_app folds batches of events, then, once a flush is due):
1. `stage`: the table entries whose bytes changed (`streams.faust_tables.TableMirror`) go
   into each table's local copy (`table.data`, so faust does not write them a second time)
   and become changelog records keyed as faust's changelog serializer keys them, so faust's
   own recovery restores the tables from them.
2. `BatchWriter.flush`: dead letters, derived events and those entries are written as record
   batches through faust's own aiokafka producer (`app.producer._producer`; faust's `send` is
   one future per message), partitioned by Kafka's default partitioner as KafkaLog writes
   them; once the broker acknowledged every one, the flush's COMMIT entry alone. Only then are
   the events folded since the last flush acknowledged to faust, which commits their offsets.
3. A crash between the two, or before, leaves COMMIT at the flush before
   (`faust_tables.resolve`); the restarted worker rebuilds the ledger as of it, and folds
   those events again (their derived events are sent again under the same ids).
4. The COMMIT entry also carries the events offset after the flush's batch; folding is
   strictly in offset order (`faust_tables.in_order`): after a rebalance `rewind` seeks the
   events partition to that offset (to the topic's `earliest` offset with empty tables), a
   record below it is skipped, and one above it (faust delivering records its fetcher
   buffered before that seek) ends the batch's fold and `seek`s back. faust's own committed
   offsets only matter to a COMMIT written before it carried the offset (`rewind`).

`read_state` is the Kafka-side snapshot for the services: the ledger (job ads included) as of
the last committed flush, read from the changelog topics with kafka-python (not faust).
"""
from __future__ import annotations

import asyncio
import struct
import time
from typing import TYPE_CHECKING, Any, Iterable

import faust
import orjson
from kafka.partitioner.default import murmur2

from schemas.config import SettingsLike
from streams.core.ledger import Ledger
from streams.faust_tables import POOL, SUBMITTERS, restore
from streams.log.kafka import TS_HEADER

if TYPE_CHECKING:
    from streams.log.kafka import SaslLogin

#: (topic, [(key, value, event time)]): what one produce call writes
Records = list[tuple[bytes | None, bytes, float]]
Groups = list[tuple[str, Records]]
_F64 = struct.Struct("<d")  # the exact event time in the `pl.ts` header, as KafkaLog writes it


def credentials(sasl: SaslLogin | None) -> faust.SASLCredentials | None:
    """faust's broker credentials for the Kafka clients' SASL login (SASL over plaintext, as
    `SaslLogin.client_config` gives kafka-python)."""
    if sasl is None:
        return None
    return faust.SASLCredentials(username=sasl.username, password=sasl.password,
                                 mechanism=sasl.mechanism)


def _producer(app: faust.App) -> Any:
    """faust's aiokafka AIOKafkaProducer, started with the app."""
    producer = app.producer._producer  # type: ignore[attr-defined]
    if producer is None:
        raise RuntimeError("faust's producer is not started")
    return producer


async def partition_count(app: faust.App, topic: str) -> int:
    """How many partitions `topic` has, as the producer's metadata says."""
    return len(await _producer(app).partitions_for(topic))


def entries(table: Any) -> dict[str, bytes]:
    """A recovered table's raw entries (str keys, bytes values; empty values are no entry)."""
    return {_s(k): bytes(v) for k, v in table.items() if v}


def stage(table: Any, writes: list[tuple[str, bytes]], ts: float) -> tuple[str, Records]:
    """Put `writes` into `table`'s local copy and return them as its changelog's records."""
    changelog = table.changelog_topic
    for key, value in writes:
        table.data[key] = value  # the local copy, without a second changelog write
    return changelog.get_topic_name(), [(changelog.prepare_key(key, None)[0], value, ts)
                                        for key, value in writes]


class BatchWriter:
    """Writes groups of records through faust's producer, one record batch per partition
    (built in C, no future per message); `flush` is one flush's two acknowledged waves."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.counts: dict[str, int] = {}  # partitions per output topic
        self.keyed: dict[str, dict[bytes, int]] = {}  # partition per key, per output topic

    async def flush(self, effects: Groups, commit: Groups) -> None:
        """The flush's effects, then (once all acknowledged) its COMMIT entry."""
        if effects:
            await self.write(effects)
        if commit:
            await self.write(commit)

    async def write(self, groups: Groups) -> None:
        """Write `groups` and return once the broker acknowledged every record. Partitions,
        timestamps and the `pl.ts` header are as KafkaLog writes them."""
        producer = _producer(self.app)
        pending: list[Any] = []
        for name, records in groups:
            count = self.counts.get(name)
            if count is None:
                count = self.counts[name] = await partition_count(self.app, name)
            builders: dict[int, Any] = {}
            cache = self.keyed.setdefault(name, {})
            for key, value, ts in records:
                if key is None or count == 1:
                    partition = 0
                else:  # Kafka's default partitioner, as KafkaLog and faust's producer use
                    partition = cache.get(key, -1)
                    if partition < 0:
                        partition = (murmur2(key) & 0x7FFFFFFF) % count
                        if len(cache) < 65_536:
                            cache[key] = partition
                ms = round(ts * 1000)
                headers = [] if ms / 1000 == ts else [(TS_HEADER, _F64.pack(ts))]
                builder = builders.get(partition)
                if builder is None:
                    builder = builders[partition] = producer.create_batch()
                if builder.append(timestamp=ms, key=key, value=value, headers=headers) is None:
                    builder.close()  # full: send it, start the next one
                    pending.append(await producer.send_batch(builder, name, partition=partition))
                    builder = builders[partition] = producer.create_batch()
                    if builder.append(timestamp=ms, key=key, value=value, headers=headers) is None:
                        raise RuntimeError(f"{name}: a record of {len(value)} bytes does not fit a batch")
            for partition, builder in builders.items():
                builder.close()
                pending.append(await producer.send_batch(builder, name, partition=partition))
        await asyncio.gather(*pending)  # raises if any batch was not acknowledged


def holds(app: faust.App, topic: str) -> bool:
    """Whether this worker is assigned `topic`'s partition (the one the ledger folds)."""
    return any(tp.topic == topic for tp in app.consumer.assignment())


async def rewind(app: faust.App, topic: str, start: int | None) -> None:
    """After a rebalance: put the partition of `topic` at `start`, the offset folding
    resumes at.

    `start` None (the tables' COMMIT predates the offset it now carries): at the committed
    offset, and at 0 when that is 0 or unset — faust's recovery lets the fetcher read the
    events partitions while it restores the tables, and its seek to the committed offsets
    skips 0 (a worker restarted after one that died in its first flush sat at offset 10,502 of
    10,502, and those events were never folded)."""
    consumer = app.consumer
    tps = [tp for tp in consumer.assignment() if tp.topic == topic]
    if start is not None:
        await consumer.seek_wait({tp: start for tp in tps})  # type: ignore[attr-defined]
        return
    offsets = await consumer.seek_to_committed()  # type: ignore[attr-defined]
    for tp in tps:
        if not offsets.get(tp):
            await consumer.seek(tp, 0)  # a truncated log resets to its earliest offset


async def earliest(app: faust.App, topic: str) -> int:
    """The first offset the (one-partition) events topic still holds: where a worker with
    empty tables starts folding."""
    tps = [tp for tp in app.consumer.assignment() if tp.topic == topic]
    return min((await app.consumer.earliest_offsets(*tps)).values(), default=0)


async def seek(app: faust.App, events: Iterable[Any], offset: int) -> None:
    """Put the partition `events` came from back at `offset`: a batch had a gap before it.
    On faust's consumer thread (`seek_wait`): aiokafka's consumer lives there, and faust's
    `seek` from the agent's loop while it fetches corrupted its fetch state (a KeyError in
    faust's fetcher, records re-read from `offset` never delivered)."""
    await app.consumer.seek_wait({event.message.tp: offset for event in events})  # type: ignore[attr-defined]


def _s(key: Any) -> str:
    return key.decode() if isinstance(key, (bytes, bytearray)) else str(key)


def read_state(bootstrap: str, settings: SettingsLike, app_id: str, timeout_s: float = 30.0,
               sasl: SaslLogin | None = None) -> Ledger | None:
    """The ledger, job ads included, as of the last committed flush of faust app `app_id`,
    read from its changelog topics (None: no flush yet). A flush that commits while the
    submitters are being read makes it read again (until `timeout_s`), so both tables are
    from the same flush."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=int(timeout_s * 1000),
                             **(sasl.client_config() if sasl else {}))

    def ends_of(topic: str) -> dict[Any, int]:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return consumer.end_offsets(tps) if tps else {}

    def read(topic: str) -> tuple[dict[str, bytes], dict[Any, int]]:
        """`topic`'s entries up to its end offsets, and those offsets."""
        found: dict[str, bytes] = {}
        ends = ends_of(topic)
        if not ends:
            return found, ends
        consumer.assign(list(ends))
        consumer.seek_to_beginning(*ends)
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            for records in consumer.poll(timeout_ms=1000).values():
                for rec in records:
                    if rec.offset >= ends[TopicPartition(rec.topic, rec.partition)]:
                        continue  # past the end this read is as of
                    key = orjson.loads(rec.key)  # str keys travel JSON-encoded
                    if rec.value:
                        found[key] = rec.value
                    else:  # a tombstone
                        found.pop(key, None)
        return found, ends

    pool_topic, subs_topic = (f"{app_id}-{t}-changelog" for t in (POOL, SUBMITTERS))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            pool_raw, ends = read(pool_topic)
            subs_raw, _ = read(subs_topic)
            if ends_of(pool_topic) == ends or time.monotonic() > deadline:
                break
    finally:
        consumer.close()
    return restore(subs_raw, pool_raw, settings)[0]
