"""The faust-streaming runner: the ledger's pure folds as an agent with changelog-backed tables.

Per-submitter accountant records live in the `submitters` table keyed by submitter (or group)
name; the pool-wide rest of the ledger (ads, jobs, quotas, limits, dedup marks, knob overrides)
lives in the `pool` global table, one key per entry. Both are faust tables, so their changelog
topics on Kafka are the durable state: a restarted worker recovers them, rebuilds the ledger and
resumes from its committed offset; events it sees again are dropped by the ledger's dedup marks.

Run with `python -m streams.faust_app worker` (`POOLLEDGER_BROKER=kafka://HOST:PORT`).
"""
from __future__ import annotations

import asyncio
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
from streams.log.kafka import KafkaLog, parse_broker_url
from streams.log.topics import DERIVED, EVENTS, dlq_topic

log = logging.getLogger(__name__)

APP_ID = os.environ.get("POOLLEDGER_FAUST_APP", "poolledger")
SUBMITTERS = "submitters"
POOL = "pool"
BATCH = 5000

# --- the ledger as table entries ------------------------------------------------------------


SEP = "\x1f"
# Entries larger than this are split by key, so no changelog message nears Kafka's 1 MB limit
# and a change rewrites only the small entries it touched.
SPLIT_BYTES = 16_384


def _split(path: str, value: Any, out: dict[str, bytes], depth: int) -> None:
    raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if isinstance(value, dict) and (depth < 2 or len(raw) > SPLIT_BYTES):
        out[path + SEP] = b"{}"  # marks a dict node, so empty dicts survive the round trip
        for key, sub in value.items():
            _split(f"{path}{SEP}{key}", sub, out, depth + 1)
    else:
        out[path] = raw


def flatten(doc: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Split a ledger document into submitter-table and pool-table entries (JSON bytes).

    Customer records go to the submitter table by name; every other section is split by key
    two levels down, and further wherever an entry would be large (e.g. one entry per ad).
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
        if parts[-1]:
            node[parts[-1]] = orjson.loads(pool[key])
    doc.setdefault("accountant", {})["Customers"] = {n: orjson.loads(r) for n, r in subs.items()}
    return doc


#: Pool entries that mark progress; written only after every other entry of a batch landed.
PROGRESS = ("applied", "now", "derived_seq")
#: An empty value is a deleted entry (a global table's local copy may not hold the key any
#: more when we delete it, so deletion is an ordinary write).
GONE = b""


def _is_progress(key: str) -> bool:
    return key in PROGRESS or key.startswith("dedup" + SEP)


class TableMirror:
    """Writes only the entries whose bytes changed since the last flush into the tables."""

    def __init__(self) -> None:
        self.subs: dict[str, bytes] = {}
        self.pool: dict[str, bytes] = {}

    def load(self, subs: dict[str, bytes], pool: dict[str, bytes]) -> None:
        self.subs, self.pool = dict(subs), dict(pool)

    def changes(self, ledger: Ledger) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """The writes of one flush in three waves: submitter entries, pool entries, progress.

        The runner has the first two acknowledged before it writes the last, so a crash leaves
        the dedup marks behind the effects they stand for, never ahead of them.
        """
        subs, pool = flatten(ledger.to_doc())

        def diff(mine: dict[str, bytes], new: dict[str, bytes]) -> list[tuple[str, bytes]]:
            out = [(k, GONE) for k in mine if k not in new]
            out += [(k, v) for k, v in new.items() if mine.get(k) != v]
            return out

        pool_changes = diff(self.pool, pool)
        self.subs, self.pool, sub_changes = subs, pool, diff(self.subs, subs)
        return [(SUBMITTERS, sub_changes),
                (POOL, [(k, v) for k, v in pool_changes if not _is_progress(k)]),
                (POOL, [(k, v) for k, v in pool_changes if _is_progress(k)])]


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

    def derived_log() -> KafkaLog:
        if "derived_log" not in state:
            state["derived_log"] = KafkaLog(parse_broker_url(url))
        log_: KafkaLog = state["derived_log"]
        return log_

    def ledger() -> Ledger:
        """The in-memory ledger, rebuilt from the recovered tables on first use."""
        if "ledger" not in state:
            subs = {_s(k): bytes(v) for k, v in sub_table.items() if v}
            pool = {_s(k): bytes(v) for k, v in pool_table.items() if v}
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
        async for batch in stream.take(BATCH, within=0.5):
            try:
                await fold_batch(batch)
            except Exception:  # noqa: BLE001 - a crashed agent would go on acking unfolded events
                log.exception("fold failed; exiting so the batch is redelivered")
                os._exit(70)
            yield None

    async def fold_batch(batch: list[Any]) -> None:
        """Fold one batch; dead letters, derived events and table effects are acknowledged
        before the progress entries are written."""
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
            out.extend(led.apply(env))
            ts = max(ts, env.ts)
        # Derived events and the changed table entries go straight to their topics through the
        # kafka-python adapter (faust's producer sends one message at a time): the changelog
        # entries are keyed and serialized as faust writes them (JSON str keys, raw values), so
        # faust's own recovery restores the tables. Effects are acknowledged in one flush before
        # the progress entries (dedup marks, `applied`) are written in a second.
        effects: list[tuple[str, list[tuple[bytes | None, bytes, float]]]] = []
        if letters:
            effects.append((dead.get_topic_name(), letters))
        if out:
            effects.append((derived.get_topic_name(),
                            [(partition_key(e).encode(), encode(e), e.ts) for e in out]))
        waves = state["mirror"].changes(led)
        progress: list[tuple[str, list[tuple[bytes | None, bytes, float]]]] = []
        for i, (name, writes) in enumerate(waves):
            if not writes:
                continue
            table = sub_table if name == SUBMITTERS else pool_table
            for key, value in writes:
                table.data[key] = value  # the local copy, without a second changelog write
            changelog = table.changelog_topic
            records = [(changelog.prepare_key(key, None)[0], value, ts) for key, value in writes]
            (progress if i == len(waves) - 1 else effects).append(
                (changelog.get_topic_name(), records))
        loop = asyncio.get_running_loop()
        for group in (effects, progress):
            if group:
                await loop.run_in_executor(None, derived_log().append_many, group)

    app.poolledger_ledger = ledger  # type: ignore[attr-defined]
    return app


def _s(key: Any) -> str:
    return key.decode() if isinstance(key, (bytes, bytearray)) else str(key)


def read_state(bootstrap: str, settings: Any, app_id: str = APP_ID,
               timeout_s: float = 30.0) -> Ledger | None:
    """The ledger as the changelog topics hold it (read with kafka-python, not faust)."""
    from kafka import KafkaConsumer, TopicPartition

    result: dict[str, dict[str, bytes]] = {}
    for table in (POOL, SUBMITTERS):  # progress before effects: see fold_batch
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
                            if not rec.value:  # a tombstone or GONE
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
