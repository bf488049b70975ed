"""The faust-streaming runner: the ledger's pure folds as an agent with changelog-backed tables.

Per-submitter accountant records live in the `submitters` table keyed by submitter (or group)
name; the pool-wide rest of the ledger (ads, jobs, quotas, limits, dedup marks, knob overrides)
lives in the `pool` global table (large sections in hash buckets). Both are faust tables, so
their changelog topics on Kafka are the durable state: a restarted worker recovers them, rebuilds
the ledger and resumes from its committed offset; events it sees again are dropped by the
ledger's dedup marks. A flush's entries only count once its COMMIT entry landed (`resolve`), so
a worker killed midway through writing them restarts from the flush before.

Run with `python -m streams.faust_app worker` (`POOLLEDGER_BROKER=kafka://HOST:PORT`); it runs
on uvloop unless `-L`/`--loop` names another loop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
import sys
import time
import zlib
from typing import Any, AsyncIterator

import faust
import orjson
import uvloop
from kafka.partitioner.default import murmur2

from schemas.errors import EventValidationError
from schemas.events import decode, encode, partition_key
from schemas.settings import load_settings
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.gcpolicy import long_fold
from streams.log.events import DeadLetter
from streams.log.kafka import TS_HEADER
from streams.log.topics import DERIVED, EVENTS, dlq_topic, one_partition_message

log = logging.getLogger(__name__)

APP_ID = os.environ.get("POOLLEDGER_FAUST_APP", "poolledger")
SUBMITTERS = "submitters"
POOL = "pool"
BATCH = 5000
CHANGELOG_SEGMENT_BYTES = 32 << 20
#: Fault injection for the crash test: at this flush the worker writes only its submitter
#: entries, then exits (75): a crash midway through a flush's writes. 0: never.
CRASH_AT = int(os.environ.get("POOLLEDGER_FAUST_CRASH_AT") or 0)
_F64 = struct.Struct("<d")  # the exact event time in the `pl.ts` header, as KafkaLog writes it

# --- the ledger as table entries ------------------------------------------------------------


SEP = "\x1f"
#: Starts the last part of a bucket entry's key: its value holds several siblings at once.
BUCKET = "\x1e"
# Entries larger than this are split, so no changelog message nears Kafka's 1 MB limit and a
# change rewrites only a small part of the state.
SPLIT_BYTES = 16_384


def _split(path: str, value: Any, out: dict[str, bytes], depth: int) -> None:
    if not isinstance(value, dict):
        out[path] = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        return
    # a node above depth 2 is always split: no need to serialize it just to measure it
    raw = None if depth < 2 else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if raw is not None and len(raw) <= SPLIT_BYTES:
        out[path] = raw
        return
    out[path + SEP] = b"{}"  # marks a dict node, so empty dicts survive the round trip
    if raw is None:
        for key, sub in value.items():
            _split(f"{path}{SEP}{key}", sub, out, depth + 1)
        return
    _bucket(path, value, len(raw), out, depth)


def _bucket(path: str, value: dict[str, Any], size: int, out: dict[str, bytes], depth: int) -> None:
    """Write a large section's children as a few hash buckets of about SPLIT_BYTES / 2.

    One entry per child (a job, an ad) made a 5,000-event batch write ~5,000 changelog
    messages, each of which the global table then reads back one at a time; a bucket carries
    tens of children in one message. A child too large for a bucket is split on its own.
    """
    count = 1
    while count * SPLIT_BYTES < 2 * size:
        count *= 2
    buckets: list[dict[str, Any]] = [{} for _ in range(count)]
    for key, sub in value.items():
        buckets[zlib.crc32(key.encode()) & (count - 1)][key] = sub
    for i, bucket in enumerate(buckets):
        raw = orjson.dumps(bucket, option=orjson.OPT_SORT_KEYS)
        if len(raw) <= 2 * SPLIT_BYTES:
            if bucket:
                out[f"{path}{SEP}{BUCKET}{i}"] = raw
            continue
        for key, sub in bucket.items():  # skewed or holding a giant: one entry per child
            _split(f"{path}{SEP}{key}", sub, out, depth + 1)


def flatten(doc: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Split a ledger document into submitter-table and pool-table entries (JSON bytes).

    Customer records go to the submitter table by name; every other section is split by key
    two levels down, and large sections below that into hash buckets (see `_bucket`).
    """
    subs = {name: orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
            for name, rec in doc["accountant"]["Customers"].items()}
    rest = dict(doc)
    rest["accountant"] = {k: v for k, v in doc["accountant"].items() if k != "Customers"}
    pool: dict[str, bytes] = {}
    for section, value in rest.items():
        _split(section, value, pool, 1)
    return subs, pool


def unflatten(subs: dict[str, bytes], pool: dict[str, bytes]) -> dict[str, Any] | None:
    """The ledger document back from table entries; None when the tables are empty."""
    if not pool:
        return None
    doc: dict[str, Any] = {}
    for key in sorted(pool, key=lambda k: k.count(SEP)):  # parents before children
        parts = key.split(SEP)
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        last = parts[-1]
        if last.startswith(BUCKET):
            node.update(orjson.loads(pool[key]))
        elif last:
            node[last] = orjson.loads(pool[key])
    doc.setdefault("accountant", {})["Customers"] = {n: orjson.loads(r) for n, r in subs.items()}
    return doc


#: The pool entry holding the tag of the last flush whose writes all landed. Written alone,
#: after them: a crash in between leaves it at the previous flush.
COMMIT = "commit"
#: An entry's value: the tag of the flush that wrote it, the previous value, the new value.
_PACKED = struct.Struct("<qI")
#: An empty value is no entry (a deletion is an ordinary write: a global table's local copy
#: may not hold the key any more when we delete it).
GONE = b""


def pack(tag: int, previous: bytes, value: bytes) -> bytes:
    """A table entry written by flush `tag`, keeping the value it replaces."""
    return _PACKED.pack(tag, len(previous)) + previous + value


def committed(pool: dict[str, bytes]) -> int:
    """The tag of the last flush that committed, from the pool table's raw entries (-1: none)."""
    raw = pool.get(COMMIT)
    return int(raw) if raw else -1


def resolve(entries: dict[str, bytes], commit: int) -> tuple[dict[str, bytes], set[str]]:
    """The plain entries as of the flush `commit`, and the keys a later flush wrote.

    A flush tags every entry it writes with the ledger's `applied` count after it, then writes
    COMMIT. An entry tagged above COMMIT belongs to a flush that died before committing: it
    reads as the value it replaced. Flushes run one after another, so one level of undo is
    enough, provided the next flush rewrites those keys (TableMirror.load) before it commits.
    """
    plain: dict[str, bytes] = {}
    undone: set[str] = set()
    for key, packed in entries.items():
        if key == COMMIT:
            continue
        tag, size = _PACKED.unpack_from(packed)
        if tag <= commit:
            value = packed[_PACKED.size + size:]
        else:
            value = packed[_PACKED.size:_PACKED.size + size]
            undone.add(key)
        if value:
            plain[key] = value
    return plain, undone


class TableMirror:
    """Writes only the entries whose bytes changed since the last flush into the tables."""

    def __init__(self) -> None:
        self.subs: dict[str, bytes] = {}
        self.pool: dict[str, bytes] = {}
        self.undone: tuple[set[str], set[str]] = (set(), set())

    def load(self, subs: dict[str, bytes], pool: dict[str, bytes],
             undone: tuple[set[str], set[str]] = (set(), set())) -> None:
        """Start from resolved tables; the `undone` keys (submitters, pool) are rewritten by
        the next flush whether they changed or not, so no uncommitted tag outlives it."""
        self.subs, self.pool = dict(subs), dict(pool)
        self.undone = (set(undone[0]), set(undone[1]))

    def changes(self, ledger: Ledger) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """The writes of one flush: submitter entries and pool entries (tagged with the
        ledger's `applied + rejected`), then the COMMIT entry alone.

        The runner has the first two acknowledged before it writes the last; until it lands,
        readers (`resolve`) see the previous flush's state, dedup marks included.
        """
        tag = ledger.applied + ledger.rejected  # grows with every event folded or rejected
        subs, pool = flatten(ledger.to_doc())

        def diff(mine: dict[str, bytes], new: dict[str, bytes],
                 undone: set[str]) -> list[tuple[str, bytes]]:
            out = [(k, pack(tag, v, GONE)) for k, v in mine.items() if k not in new]
            out += [(k, pack(tag, mine.get(k, GONE), v)) for k, v in new.items()
                    if k in undone or mine.get(k) != v]
            out += [(k, pack(tag, GONE, GONE)) for k in undone if k not in new and k not in mine]
            return out

        sub_writes, pool_writes = diff(self.subs, subs, self.undone[0]), diff(self.pool, pool,
                                                                               self.undone[1])
        self.subs, self.pool, self.undone = subs, pool, (set(), set())
        commit = [(COMMIT, str(tag).encode())] if sub_writes or pool_writes else []
        return [(SUBMITTERS, sub_writes), (POOL, pool_writes), (POOL, commit)]


# --- the app ---------------------------------------------------------------------------------


def create_app(broker: str | None = None, partitions: int | None = None) -> faust.App:
    """A faust app on `broker` (default POOLLEDGER_BROKER) folding the events topic."""
    settings = load_settings()
    url = broker or str(settings.get("POOLLEDGER_BROKER") or "kafka://127.0.0.1:9092")
    nparts = partitions or int(settings.get("POOLLEDGER_EVENTS_PARTITIONS") or 1)
    home = os.path.expanduser(str(settings.get("POOLLEDGER_HOME") or "out"))
    app = faust.App(
        APP_ID, broker=url, store="memory://", topic_partitions=nparts,
        datadir=os.path.join(home, "{conf.name}-data"),  # not ./poolledger-data
        topic_replication_factor=1, processing_guarantee="at_least_once",
        web_enabled=False, consumer_auto_offset_reset="earliest",
        broker_commit_every=BATCH, broker_commit_interval=1.0,
        # a worker that died is out of the group after 10 s, not 60: its replacement resumes
        # that much sooner (heartbeats come from faust's consumer thread, not the fold's loop)
        broker_session_timeout=10.0,
        table_cleanup_interval=3600.0, producer_acks=-1,
        # fold_batch writes whole record batches: let one hold ~1 MB (Kafka's default
        # message.max.bytes), not 16 kB, so a batch's effects take a few round trips
        producer_max_batch_size=900_000,
        consumer_max_fetch_size=16 << 20,
    )
    topic = os.environ.get("POOLLEDGER_EVENTS_TOPIC", EVENTS)
    events = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", partitions=nparts)
    derived = app.topic(f"{topic}.derived" if topic != EVENTS else DERIVED, key_serializer="raw",
                        value_serializer="raw", partitions=nparts, internal=True)
    dead = app.topic(dlq_topic(topic), key_serializer="raw", value_serializer="raw",
                     partitions=1, internal=True)
    # Changelog segments of 32 MiB instead of Kafka's 1 GiB: compaction only cleans closed
    # segments, and a restarted worker reads the whole changelog (the bench's 200k events
    # write ~185 MB to the pool's).
    compacted = {"segment.bytes": CHANGELOG_SEGMENT_BYTES}
    sub_table = app.Table(SUBMITTERS, default=None, key_type=str, value_type=bytes, use_partitioner=True,
                          partitions=nparts, extra_topic_configs=compacted)
    pool_table = app.GlobalTable(POOL, default=None, key_type=str, value_type=bytes, use_partitioner=True,
                                 partitions=nparts, extra_topic_configs=compacted)
    state: dict[str, Any] = {}
    counts: dict[str, int] = {}  # partitions per output topic
    keyed: dict[str, dict[bytes, int]] = {}  # partition per key, per output topic

    def ledger() -> Ledger:
        """The in-memory ledger, rebuilt from the recovered tables on first use."""
        if "ledger" not in state:
            pool_raw = {_s(k): bytes(v) for k, v in pool_table.items() if v}
            commit = committed(pool_raw)
            subs, subs_undone = resolve({_s(k): bytes(v) for k, v in sub_table.items() if v},
                                        commit)
            pool, pool_undone = resolve(pool_raw, commit)
            doc = unflatten(subs, pool)
            led = Ledger(settings) if doc is None else Ledger.from_json(settings, orjson.dumps(doc))
            mirror = TableMirror()
            mirror.load(subs, pool, (subs_undone, pool_undone))
            if subs_undone or pool_undone:
                log.warning("%d table entries of a flush that did not commit were undone",
                            len(subs_undone) + len(pool_undone))
            state["ledger"], state["mirror"] = led, mirror
            log.info("ledger rebuilt from tables: %d events applied so far", led.applied)
        led_: Ledger = state["ledger"]
        return led_

    @app.agent(events)
    async def fold(stream: faust.StreamT[Any]) -> AsyncIterator[None]:
        for out_topic in (derived, dead):  # the broker may not auto-create topics
            await out_topic.maybe_declare()
        # the ledger folds one total order: a multi-partition events topic is refused, loudly
        found = len(await app.producer._producer.partitions_for(topic))  # type: ignore[attr-defined]
        if found != 1:
            log.error("%s", one_partition_message(topic, found))
            os._exit(2)
        anchored: set[Any] = set()
        with long_fold():  # the worker is one long fold: the replay runner's collector settings
            async for events in stream.take_events(BATCH, within=0.5):  # type: ignore[attr-defined]
                try:
                    await anchor(events, anchored)
                    await fold_batch([event.value for event in events])
                except Exception:  # noqa: BLE001 - a crashed agent would go on acking unfolded events
                    log.exception("fold failed; exiting so the batch is redelivered")
                    os._exit(70)
                yield None

    @app.on_rebalance_complete.connect
    async def rewind(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Put each events partition back at its committed offset when that is 0 or unset.

        faust's recovery lets the fetcher read the events partitions while it restores the
        tables, and its seek to the committed offsets skips 0 (aiokafka's `seek_to_committed`
        only seeks to a positive one): a worker restarted after one that died in its first
        flush sat at offset 10,502 of 10,502, and those events were never folded."""
        consumer = app.consumer
        committed = await consumer.seek_to_committed()  # type: ignore[attr-defined]
        for tp in consumer.assignment():
            if tp.topic == topic and not committed.get(tp):
                await consumer.seek(tp, 0)  # a truncated log resets to its earliest offset

    async def anchor(events: Any, anchored: set[Any]) -> None:
        """Commit the offset this worker starts each partition at, before its first flush, so
        a worker that dies in that flush leaves its successor a committed offset to resume
        from (`rewind`). faust's own commit covers acknowledged events only, hence its internal
        `_commit_offsets`."""
        first: dict[Any, int] = {}
        for event in events:
            tp = event.message.tp
            if tp not in anchored and tp not in first:
                first[tp] = event.message.offset
        if first:
            await app.consumer._commit_offsets(first)  # type: ignore[attr-defined]
            anchored.update(first)

    async def fold_batch(batch: list[Any]) -> None:
        """Fold one batch; dead letters, derived events and table entries are acknowledged
        before the flush's COMMIT entry is written."""
        led = ledger()
        out = []
        letters: list[tuple[bytes | None, bytes, float]] = []
        ts = 0.0
        for raw in batch:
            try:
                env = decode(raw)
            except EventValidationError as exc:
                letter = DeadLetter(reason=str(exc), raw=bytes(raw), topic=topic)
                letters.append((None, letter.to_json(), ts))
                continue
            try:
                out.extend(led.apply(env))
            except EventRejectedError as exc:  # too far ahead, invalid, or a poison event
                letter = DeadLetter(reason=str(exc), raw=bytes(raw), topic=topic)
                letters.append((None, letter.to_json(), ts))
                continue
            ts = max(ts, env.ts)
        # Derived events and the changed table entries go straight to their topics as record
        # batches of faust's own producer (its `send` is one message at a time): the changelog
        # entries are keyed and serialized as faust writes them (JSON str keys, raw values), so
        # faust's own recovery restores the tables. All of them are acknowledged by the broker
        # before the COMMIT entry is written, awaited in the event loop (no thread contending
        # for the GIL); it is acknowledged before the batch is. A crash in between leaves the
        # tables reading as the previous flush (`resolve`); the batch is folded again and its
        # derived events are sent again under the same ids.
        effects: list[tuple[str, list[tuple[bytes | None, bytes, float]]]] = []
        if letters:
            effects.append((dead.get_topic_name(), letters))
        if out:
            effects.append((derived.get_topic_name(),
                            [(partition_key(e).encode(), encode(e), e.ts) for e in out]))
        waves = state["mirror"].changes(led)
        commit: list[tuple[str, list[tuple[bytes | None, bytes, float]]]] = []
        for i, (name, writes) in enumerate(waves):
            if not writes:
                continue
            table = sub_table if name == SUBMITTERS else pool_table
            for key, value in writes:
                table.data[key] = value  # the local copy, without a second changelog write
            changelog = table.changelog_topic
            records = [(changelog.prepare_key(key, None)[0], value, ts) for key, value in writes]
            (commit if i == len(waves) - 1 else effects).append(
                (changelog.get_topic_name(), records))
        state["flushes"] = flushes = state.get("flushes", 0) + 1
        if flushes == CRASH_AT:  # fault injection (tests): only the submitter entries land
            await produce([g for g in effects if g[0] == sub_table.changelog_topic.get_topic_name()])
            os._exit(75)
        if effects:
            await produce(effects)
        if commit:
            await produce(commit)

    async def produce(groups: list[tuple[str, list[tuple[bytes | None, bytes, float]]]]) -> None:
        """Write `groups` through faust's own aiokafka producer, one record batch per
        partition (built in C, no per-message future), and return once the broker acknowledged
        every record. Partitions, timestamps and the `pl.ts` header are as KafkaLog writes them."""
        producer = app.producer._producer  # type: ignore[attr-defined]  # aiokafka's AIOKafkaProducer
        if producer is None:
            raise RuntimeError("faust's producer is not started")
        pending: list[Any] = []
        for name, records in groups:
            count = counts.get(name)
            if count is None:
                count = counts[name] = len(await producer.partitions_for(name))
            builders: dict[int, Any] = {}
            cache = keyed.setdefault(name, {})
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

    app.poolledger_ledger = ledger  # type: ignore[attr-defined]
    return app


def _s(key: Any) -> str:
    return key.decode() if isinstance(key, (bytes, bytearray)) else str(key)


def read_state(bootstrap: str, settings: Any, app_id: str = APP_ID,
               timeout_s: float = 30.0) -> Ledger | None:
    """The ledger as of the last committed flush, read from the changelog topics with
    kafka-python (not faust). A flush that commits while the submitters are being read makes
    it read again (until `timeout_s`), so the two tables are always from the same flush."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=int(timeout_s * 1000))

    def ends_of(topic: str) -> dict[Any, int]:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return consumer.end_offsets(tps) if tps else {}

    def read(topic: str) -> tuple[dict[str, bytes], dict[Any, int]]:
        """`topic`'s entries up to its end offsets, and those offsets."""
        entries: dict[str, bytes] = {}
        ends = ends_of(topic)
        if not ends:
            return entries, ends
        consumer.assign(list(ends))
        consumer.seek_to_beginning(*ends)
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            for records in consumer.poll(timeout_ms=1000).values():
                for rec in records:
                    if rec.offset >= ends[TopicPartition(rec.topic, rec.partition)]:
                        continue  # past the end this read is as of
                    key = orjson.loads(rec.key)  # str keys travel JSON-encoded
                    if rec.value:
                        entries[key] = rec.value
                    else:  # a tombstone
                        entries.pop(key, None)
        return entries, ends

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
    commit = committed(pool_raw)
    doc = unflatten(resolve(subs_raw, commit)[0], resolve(pool_raw, commit)[0])
    return None if doc is None else Ledger.from_json(settings, orjson.dumps(doc))


def prepare_worker() -> int:
    """Before `worker` starts: the broker must be configured and reachable, and the topics
    the app reads must exist (created as `poolledger` would, so a fresh broker works). One
    line and 2 (no broker configured) or 1 (broker down) instead of faust's traceback or its
    endless "Topic ... not found"."""
    from streams.log.kafka import KafkaLog, SaslLogin
    from streams.log.port import LogError, TopicSpec

    settings = load_settings()
    url = str(settings.get("POOLLEDGER_BROKER") or "")
    if not url:
        print("streams.faust_app worker: no broker: set POOLLEDGER_BROKER=kafka://HOST:PORT "
              "(`poolledger services start kafka` prints one)", file=sys.stderr)
        return 2
    mechanism = str(settings.get("POOLLEDGER_KAFKA_SASL_MECHANISM") or "")
    sasl = SaslLogin(mechanism, str(settings.get("POOLLEDGER_KAFKA_USER") or ""),
                     str(settings.get("POOLLEDGER_KAFKA_PASSWORD") or "")) if mechanism else None
    topic = os.environ.get("POOLLEDGER_EVENTS_TOPIC", EVENTS)
    nparts = int(settings.get("POOLLEDGER_EVENTS_PARTITIONS") or 1)
    try:
        kafka = KafkaLog(url, request_timeout_ms=10_000, sasl=sasl)
        try:
            kafka.create_topic(TopicSpec(topic, partitions=nparts))
            kafka.create_topic(TopicSpec(dlq_topic(topic)))
        finally:
            kafka.close()
    except LogError as exc:
        print(f"streams.faust_app worker: broker {url}: {exc}", file=sys.stderr)
        return 1
    # faust makes its datadir (`create_app`) without parents
    os.makedirs(os.path.expanduser(str(settings.get("POOLLEDGER_HOME") or "out")), exist_ok=True)
    return 0


app = create_app(os.environ.get("POOLLEDGER_BROKER") or None)

if __name__ == "__main__":
    if "worker" in sys.argv:
        status = prepare_worker()
        if status:
            sys.exit(status)
    # No web server: several workers (tests, benches) share a machine and would fight over 6066.
    if "worker" in sys.argv and not any(a.startswith("--with") for a in sys.argv):
        sys.argv.append("--without-web")
    # uvloop, as faust recommends: faust spends ~4 tasks per consumed message, which it makes cheaper
    if not any(a in ("-L", "--loop") or a.startswith("--loop=") for a in sys.argv):
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    app.main()
