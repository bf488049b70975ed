"""The faust-streaming runner: the ledger's pure folds as an agent with changelog-backed tables.

Per-submitter accountant records live in the `submitters` table keyed by submitter (or group)
name; the pool-wide rest of the ledger (ads, jobs, quotas, limits, dedup marks, knob overrides)
lives in the `pool` global table, one key per entry. Both are faust tables, so their changelog
topics on Kafka are the durable state: a restarted worker recovers them, rebuilds the ledger and
resumes from its committed offset; events it sees again are dropped by the ledger's dedup marks.

Run with `python -m streams.faust_app worker` (`POOLLEDGER_BROKER=kafka://HOST:PORT`).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, AsyncIterator

import faust
import orjson

from schemas.errors import EventValidationError
from schemas.events import decode, encode, partition_key
from schemas.settings import load_settings
from streams.core.ledger import Ledger
from streams.log.events import DeadLetter
from streams.log.topics import DERIVED, EVENTS, dlq_topic

log = logging.getLogger(__name__)

APP_ID = os.environ.get("POOLLEDGER_FAUST_APP", "poolledger")
SUBMITTERS = "submitters"
POOL = "pool"
BATCH = 500

# --- the ledger as table entries ------------------------------------------------------------


def flatten(doc: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Split a ledger document into submitter-table and pool-table entries (JSON bytes).

    Customer records go to the submitter table by name; every other section is split one
    level down (e.g. one entry per ad) so a change rewrites only the entries it touched.
    """
    dumps = orjson.dumps
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}
    for section, value in doc.items():
        if section == "accountant":
            for name, rec in value["Customers"].items():
                subs[name] = dumps(rec, option=orjson.OPT_SORT_KEYS)
            rest = {k: v for k, v in value.items() if k != "Customers"}
            value = rest
        if isinstance(value, dict):
            pool[f"{section}\x1f"] = b"{}"
            for key, sub in value.items():
                pool[f"{section}\x1f{key}"] = dumps(sub, option=orjson.OPT_SORT_KEYS)
        else:
            pool[section] = dumps(value)
    return subs, pool


def unflatten(subs: dict[str, bytes], pool: dict[str, bytes]) -> dict[str, Any] | None:
    """The ledger document back from table entries; None when the tables are empty."""
    if not pool:
        return None
    doc: dict[str, Any] = {}
    for key, raw in pool.items():
        section, sep, sub = key.partition("\x1f")
        if not sep:
            doc[section] = orjson.loads(raw)
            continue
        target = doc.setdefault(section, {})
        if sub:
            target[sub] = orjson.loads(raw)
    doc.setdefault("accountant", {})["Customers"] = {n: orjson.loads(r) for n, r in subs.items()}
    return doc


class TableMirror:
    """Writes only the entries whose bytes changed since the last flush into the tables."""

    def __init__(self) -> None:
        self.subs: dict[str, bytes] = {}
        self.pool: dict[str, bytes] = {}

    def load(self, subs: dict[str, bytes], pool: dict[str, bytes]) -> None:
        self.subs, self.pool = dict(subs), dict(pool)

    def flush(self, ledger: Ledger, sub_table: Any, pool_table: Any) -> int:
        subs, pool = flatten(ledger.to_doc())
        written = 0
        for mine, table, new in ((self.subs, sub_table, subs), (self.pool, pool_table, pool)):
            for key, value in new.items():
                if mine.get(key) != value:
                    table[key] = value
                    written += 1
            for key in [k for k in mine if k not in new]:
                del table[key]
                written += 1
        self.subs, self.pool = subs, pool
        return written


# --- the app ---------------------------------------------------------------------------------


def create_app(broker: str | None = None, partitions: int | None = None) -> faust.App:
    """A faust app on `broker` (default POOLLEDGER_BROKER) folding the events topic."""
    settings = load_settings()
    url = broker or str(settings.get("POOLLEDGER_BROKER") or "kafka://127.0.0.1:9092")
    nparts = partitions or int(settings.get("POOLLEDGER_EVENTS_PARTITIONS") or 1)
    app = faust.App(
        APP_ID, broker=url, store="memory://", topic_partitions=nparts,
        topic_replication_factor=1, processing_guarantee="at_least_once",
        web_enabled=False, consumer_auto_offset_reset="earliest",
        broker_commit_every=BATCH, broker_commit_interval=1.0,
        table_cleanup_interval=3600.0, producer_acks=-1,
    )
    topic = os.environ.get("POOLLEDGER_EVENTS_TOPIC", EVENTS)
    events = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", partitions=nparts)
    derived = app.topic(f"{topic}.derived" if topic != EVENTS else DERIVED, key_serializer="raw",
                        value_serializer="raw", partitions=nparts, internal=True)
    dead = app.topic(dlq_topic(topic), key_serializer="raw", value_serializer="raw",
                     partitions=1, internal=True)
    sub_table = app.Table(SUBMITTERS, default=None, key_type=str, value_type=bytes, use_partitioner=True,
                          partitions=nparts)
    pool_table = app.GlobalTable(POOL, default=None, key_type=str, value_type=bytes, use_partitioner=True,
                                 partitions=nparts)
    state: dict[str, Any] = {}

    def ledger() -> Ledger:
        """The in-memory ledger, rebuilt from the recovered tables on first use."""
        if "ledger" not in state:
            subs = {_s(k): bytes(v) for k, v in sub_table.items() if v is not None}
            pool = {_s(k): bytes(v) for k, v in pool_table.items() if v is not None}
            doc = unflatten(subs, pool)
            led = Ledger(settings) if doc is None else Ledger.from_json(settings, orjson.dumps(doc))
            mirror = TableMirror()
            mirror.load(subs, pool)
            state["ledger"], state["mirror"] = led, mirror
            log.info("ledger rebuilt from tables: %d events applied so far", led.applied)
        led_: Ledger = state["ledger"]
        return led_

    @app.agent(events)
    async def fold(stream: faust.StreamT[Any]) -> AsyncIterator[None]:
        for out_topic in (derived, dead):  # the broker may not auto-create topics
            await out_topic.maybe_declare()
        async for batch in stream.take(BATCH, within=0.2):
            led = ledger()
            out = []
            for raw in batch:
                try:
                    env = decode(raw)
                except EventValidationError as exc:
                    letter = DeadLetter(reason=str(exc), raw=bytes(raw), topic=topic)
                    await dead.send(value=letter.to_json())
                    continue
                out.extend(led.apply(env))
            for env in out:
                await derived.send(key=partition_key(env).encode(), value=encode(env))
            state["mirror"].flush(led, sub_table, pool_table)
            yield None

    app.poolledger_ledger = ledger  # type: ignore[attr-defined]
    return app


def _s(key: Any) -> str:
    return key.decode() if isinstance(key, (bytes, bytearray)) else str(key)


def read_state(bootstrap: str, settings: Any, app_id: str = APP_ID,
               timeout_s: float = 30.0) -> Ledger | None:
    """The ledger as the changelog topics hold it (read with kafka-python, not faust)."""
    from kafka import KafkaConsumer, TopicPartition

    result: dict[str, dict[str, bytes]] = {}
    for table in (SUBMITTERS, POOL):
        topic = f"{app_id}-{table}-changelog"
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                 consumer_timeout_ms=int(timeout_s * 1000))
        try:
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in parts]
            entries: dict[str, bytes] = {}
            if tps:
                consumer.assign(tps)
                consumer.seek_to_beginning(*tps)
                ends = consumer.end_offsets(tps)
                while any(consumer.position(tp) < ends[tp] for tp in tps):
                    for records in consumer.poll(timeout_ms=1000).values():
                        for rec in records:
                            key = orjson.loads(rec.key)  # str keys travel JSON-encoded
                            if rec.value is None:
                                entries.pop(key, None)
                            else:
                                entries[key] = rec.value
            result[table] = entries
        finally:
            consumer.close()
    doc = unflatten(result[SUBMITTERS], result[POOL])
    return None if doc is None else Ledger.from_json(settings, orjson.dumps(doc))


app = create_app(os.environ.get("POOLLEDGER_BROKER") or None)

if __name__ == "__main__":
    # No web server: several workers (tests, benches) share a machine and would fight over 6066.
    if "worker" in sys.argv and not any(a.startswith("--with") for a in sys.argv):
        sys.argv.append("--without-web")
    app.main()
