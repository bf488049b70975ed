"""The faust-streaming runner: the ledger's pure folds as an agent with changelog-backed tables.

The ledger, with its job-ad fold, lives in two faust tables (`streams.faust_tables`): their
changelog topics on Kafka are the durable state. A restarted worker recovers them, rebuilds
the ledger as of the last flush that committed and resumes from its committed offset; events
it sees again are dropped by the ledger's dedup marks. The flush protocol and every faust
internal it needs are in `streams.faust_adapter`; this module builds the app (`build_app`, no
side effects at import).

Run with `python -m streams.faust_app worker` (`POOLLEDGER_BROKER=kafka://HOST:PORT`, the
POOLLEDGER_KAFKA_* SASL knobs as for the other Kafka clients); it runs on uvloop unless
`-L`/`--loop` names another loop.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable

import faust
import uvloop
from faust.types import TP

from schemas.errors import EventValidationError
from schemas.events import Envelope, decode, encode, partition_key
from schemas.settings import load_settings
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.faust_adapter import BatchWriter, Groups, Records, credentials, earliest, entries, \
    holds, partition_count, rewind, seek, stage
from streams.faust_tables import POOL, SUBMITTERS, in_order, restore
from streams.gcpolicy import long_fold
from streams.log.events import DeadLetter, EventLog
from streams.log.kafka import KafkaLog, SaslLogin
from streams.log.topics import DERIVED, EVENTS, dlq_topic, one_partition_message

log = logging.getLogger(__name__)

BATCH = 5000
#: A flush writes what changed since the last one, and with ~40% of a large section's
#: children changed per batch that is most of the state (~5 MB for bench/accounting.py's
#: 2,000-slot log): its cost follows the state, not the batch. So while a backlog fills whole
#: batches the worker folds on and flushes once folding took FLUSH_RATIO times as long as the
#: last flush did (a flush then costs at most ~1/(1+FLUSH_RATIO) of the worker's time), or
#: FLUSH_MAX events are pending, or the stream has caught up (less than a batch behind).
FLUSH_RATIO = 4.0
FLUSH_MAX = 50_000
#: seconds without a batch after which what is pending is flushed anyway (`flush_idle`)
FLUSH_IDLE = 1.0
CHANGELOG_SEGMENT_BYTES = 32 << 20
#: seconds between the worker's progress lines and status files (`poolledger faust-status`)
STATUS_EVERY = 10.0


def status_dir(home: str) -> Path:
    """Where workers write their status files: `<home>/faust-status/<app>-<pid>.json`."""
    return Path(os.path.expanduser(home)) / "faust-status"



@dataclass
class Pending:
    """What the batches folded since the last flush owe it: their dead letters and derived
    events, their latest event time, how many events and how long folding them took."""

    derived: list[Envelope] = field(default_factory=list)
    letters: Records = field(default_factory=list)
    ts: float = 0.0
    events: int = 0
    folding: float = 0.0
    #: the faust events to acknowledge once flushed (folded, or folded before)
    acks: list[Any] = field(default_factory=list)
    #: when a batch was folded last (time.monotonic)
    last: float = 0.0

    @property
    def owed(self) -> bool:
        """Whether anything was folded since the last flush."""
        return bool(self.events or self.letters)

    def due(self, caught_up: bool, last_flush: float | None) -> bool:
        """Whether to flush now: the stream caught up, the worker's first flush (which
        measures what one costs), FLUSH_MAX events pending, or folding took FLUSH_RATIO times
        as long as the last flush."""
        if not self.owed:
            return False
        return (caught_up or last_flush is None or self.events >= FLUSH_MAX
                or self.folding >= FLUSH_RATIO * last_flush)


def app_id() -> str:
    """The faust app id (POOLLEDGER_FAUST_APP): its consumer group and changelog topic prefix."""
    return str(load_settings().get("POOLLEDGER_FAUST_APP") or "poolledger")


def build_app(broker: str | None = None, partitions: int | None = None,
              writer: type[BatchWriter] = BatchWriter) -> faust.App:
    """A faust app on `broker` (default POOLLEDGER_BROKER) folding the events topic; `writer`
    writes each flush (the crash test passes one that dies midway)."""
    settings = load_settings()
    url = broker or str(settings.get("POOLLEDGER_BROKER") or "kafka://127.0.0.1:9092")
    nparts = partitions or int(settings.get("POOLLEDGER_EVENTS_PARTITIONS") or 1)
    home = os.path.expanduser(str(settings.get("POOLLEDGER_HOME") or "out"))
    name = app_id()
    app = faust.App(
        name, broker=url, store="memory://", topic_partitions=nparts,
        broker_credentials=credentials(SaslLogin.from_settings(settings)),
        datadir=os.path.join(home, "{conf.name}-data"),  # not ./poolledger-data
        topic_replication_factor=1, processing_guarantee="at_least_once",
        web_enabled=False, consumer_auto_offset_reset="earliest",
        broker_commit_every=BATCH, broker_commit_interval=1.0,
        # a worker that died is out of the group after 10 s, not 60: its replacement resumes
        # that much sooner (heartbeats come from faust's consumer thread, not the fold's loop)
        broker_session_timeout=10.0,
        table_cleanup_interval=3600.0, producer_acks=-1,
        # the writer sends whole record batches: let one hold ~1 MB (Kafka's default
        # message.max.bytes), not 16 kB, so a batch's effects take a few round trips
        producer_max_batch_size=900_000,
        consumer_max_fetch_size=16 << 20,
        # room for a few batches: faust pauses fetching the partition while its queue is full,
        # and at its default (4,096, less than a batch) it was full whenever a batch folded
        stream_buffer_maxsize=4 * BATCH,
    )
    topic = str(settings.get("POOLLEDGER_EVENTS_TOPIC") or EVENTS)
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
    agent_stream: list[Any] = []  # the agent's stream, which acknowledges events (kept by `state.clear`)

    def first_version(event_id: str) -> Envelope | None:
        """The ledger's port to the events topic (`Ledger.first_version`), asked only for a
        duplicate older than its window: a client of its own, opened on first use."""
        if "log" not in state:
            state["log"] = EventLog(KafkaLog(url, sasl=SaslLogin.from_settings(settings)))
        found: Envelope | None = state["log"].first_version(topic)(event_id)
        return found

    def ledger() -> Ledger:
        """The in-memory ledger, rebuilt from the recovered tables on first use."""
        if "ledger" not in state:
            led, mirror = restore(entries(sub_table), entries(pool_table), settings)
            if mirror.undone[0] or mirror.undone[1]:
                log.warning("%d table entries of a flush that did not commit were undone",
                            len(mirror.undone[0]) + len(mirror.undone[1]))
            state["ledger"] = Ledger(settings) if led is None else led
            state["ledger"].first_version = first_version
            state["mirror"], state["writer"] = mirror, writer(app)
            state["next"], state["fresh"] = mirror.next_offset, led is None
            log.info("ledger rebuilt from tables: %d events applied so far", state["ledger"].applied)
        current: Ledger = state["ledger"]
        return current

    lock = asyncio.Lock()  # one fold or flush at a time: the agent's and `flush_idle`'s

    async def guarded(step: Awaitable[None]) -> None:
        """Run a fold or flush; any error ends the worker (exit 70) with nothing acknowledged."""
        try:
            await step
        except Exception:  # noqa: BLE001 - a crashed agent would go on acking unfolded events
            log.exception("fold failed; exiting so the batch is redelivered")
            os._exit(70)

    @app.agent(events)
    async def fold(stream: faust.StreamT[Any]) -> AsyncIterator[None]:
        for out_topic in (derived, dead):  # the broker may not auto-create topics
            await out_topic.maybe_declare()
        # the ledger folds one total order: a multi-partition events topic is refused, loudly
        found = await partition_count(app, topic)
        if found != 1:
            log.error("%s", one_partition_message(topic, found))
            os._exit(2)
        agent_stream.append(stream)
        with long_fold():  # the worker is one long fold: the replay runner's collector settings
            # events are acknowledged when a flush wrote what they caused (`flush`), not when
            # faust hands the next batch over
            async for batch in stream.noack_take(BATCH, within=0.5):  # type: ignore[attr-defined]
                async with lock:
                    await guarded(fold_batch(batch))
                yield None

    @app.timer(FLUSH_IDLE)
    async def flush_idle() -> None:
        """Flush what is pending once no batch came for FLUSH_IDLE seconds: the stream went
        quiet with a backlog folded, or faust stopped the flow to rebalance (it waits for
        every event it handed over to be acknowledged first)."""
        async with lock:
            pending: Pending | None = state.get("pending")
            if pending is not None and pending.owed and time.monotonic() - pending.last >= FLUSH_IDLE:
                await guarded(flush(state["ledger"], pending, state["next"]))

    @app.timer(STATUS_EVERY)
    async def report_progress() -> None:
        """Every STATUS_EVERY seconds, off the fold's path: one progress line (events folded,
        the events partition's end and the lag behind it) and the status file saying the same
        (`poolledger faust-status` reads it)."""
        doc: dict[str, Any] = {"app": name, "topic": topic, "pid": os.getpid(),
                               "updated": time.time(), "role": "standby"}
        if "ledger" in state and holds(app, topic):
            led: Ledger = state["ledger"]
            nxt = state.get("next")
            try:
                end: int | None = int(app.consumer.highwater(TP(topic, 0)))
            except Exception:  # noqa: BLE001 - not known before the first fetch
                end = None
            lag = None if end is None or nxt is None else max(0, end - int(nxt))
            doc.update(role="active", applied=led.applied, next_offset=nxt, end_offset=end,
                       lag=lag, event_time=led.now)
            log.info("folded %d events of %s; next offset %s, end %s, lag %s", led.applied,
                     topic, nxt, end, lag)
        else:
            log.info("standing by: the events partition of %s is another worker's", topic)
        folder = status_dir(home)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        os.replace(tmp, path)

    @app.on_rebalance_complete.connect
    async def on_rebalanced(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Resume folding at the offset the tables' last COMMIT names (the tables are
        recovered by now); a worker without the events partition forgets its ledger, which
        another worker may move on meanwhile."""
        if not holds(app, topic):
            state.clear()
            return
        if "ledger" not in state:
            ledger()
            if state["next"] is None and state["fresh"]:
                state["next"] = await earliest(app, topic)
        await rewind(app, topic, state["next"])

    async def fold_batch(batch: list[Any]) -> None:
        """Fold one batch in offset order, then flush what is pending if it is due (`due`);
        a gap before a record ends the fold and seeks back to fill it.

        The batch's events are acknowledged to faust (which commits their offsets) only by
        the flush that wrote what they caused: a crash before it folds them again from the
        offset the tables' COMMIT names, and faust's committed offset never passes it."""
        led = ledger()
        pending: Pending = state.setdefault("pending", Pending())
        take, after, gap = in_order([event.message.offset for event in batch], state["next"])
        if gap and after is not None:
            # every time: a record faust's fetcher loop hands over after the seek moves its
            # read offset past `after` again, and the records re-read from there are dropped
            log.warning("events above offset %d arrived before it: folding resumes there", after)
            await seek(app, batch, after)
        state["next"] = after
        started = time.perf_counter()
        out, letters = pending.derived, pending.letters
        ts = pending.ts
        for raw in (batch[i].value for i in take):
            try:
                env = decode(raw)
            except EventValidationError as exc:
                letters.append((None, DeadLetter(reason=str(exc), raw=bytes(raw), topic=topic).to_json(), ts))
                continue
            try:
                out.extend(led.apply(env))
            except EventRejectedError as exc:  # too far ahead, invalid, or a poison event
                letters.append((None, DeadLetter(reason=str(exc), raw=bytes(raw), topic=topic).to_json(), ts))
                continue
            ts = max(ts, env.ts)
        pending.ts, pending.events = ts, pending.events + len(take)
        pending.folding += time.perf_counter() - started
        pending.last = time.monotonic()
        # the records above a gap are not acknowledged: they come again after the seek
        pending.acks += [event for event in batch if after is None or event.message.offset < after]
        if not pending.owed:  # records folded and flushed before: nothing to write for them
            await acknowledge(pending)
        elif pending.due(behind(batch, after) < BATCH, state.get("flushed")):
            await flush(led, pending, after)

    async def acknowledge(pending: Pending) -> None:
        """Acknowledge the pending events to faust, which commits their offsets."""
        for event in pending.acks:
            await agent_stream[-1].ack(event)
        pending.acks.clear()

    def behind(batch: list[Any], after: int | None) -> int:
        """How many events the partition holds past `after` (0 when not known yet)."""
        try:
            end = app.consumer.highwater(batch[-1].message.tp)
        except Exception:  # noqa: BLE001 - not known before the first fetch
            return 0
        return 0 if end is None or after is None else max(0, int(end) - after)

    async def flush(led: Ledger, pending: Pending, after: int | None) -> None:
        """Write the pending dead letters, derived events and changed table entries, then
        COMMIT (`streams.faust_adapter`'s protocol)."""
        started = time.perf_counter()
        effects: Groups = []
        if pending.letters:
            effects.append((dead.get_topic_name(), pending.letters))
        if pending.derived:
            effects.append((derived.get_topic_name(),
                            [(partition_key(e).encode(), encode(e), e.ts) for e in pending.derived]))
        subs, pool, commit = state["mirror"].changes(led, after)
        effects += [stage(table, writes, pending.ts) for table, (_, writes) in
                    ((sub_table, subs), (pool_table, pool)) if writes]
        await state["writer"].flush(effects, [stage(pool_table, commit[1], pending.ts)]
                                    if commit[1] else [])
        await acknowledge(pending)
        state["pending"] = Pending(ts=pending.ts)
        state["flushed"] = time.perf_counter() - started
        log.debug("flushed %d events (folded in %.2fs) in %.2fs", pending.events, pending.folding,
                  state["flushed"])

    return app


def prepare_worker() -> int:
    """Before `worker` starts: the broker must be configured and reachable, and the topics
    the app reads must exist (created as `poolledger` would, so a fresh broker works). One
    line and 2 (no broker configured) or 1 (broker down) instead of faust's traceback or its
    endless "Topic ... not found"."""
    from streams.log.kafka import KafkaLog
    from streams.log.port import LogError, TopicSpec

    settings = load_settings()
    url = str(settings.get("POOLLEDGER_BROKER") or "")
    if not url:
        print("streams.faust_app worker: no broker: set POOLLEDGER_BROKER=kafka://HOST:PORT "
              "(`poolledger services start kafka` prints one)", file=sys.stderr)
        return 2
    sasl = SaslLogin.from_settings(settings)
    topic = str(settings.get("POOLLEDGER_EVENTS_TOPIC") or EVENTS)
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
    # faust makes its datadir (`build_app`) without parents
    os.makedirs(os.path.expanduser(str(settings.get("POOLLEDGER_HOME") or "out")), exist_ok=True)
    return 0


def main(writer: type[BatchWriter] = BatchWriter) -> None:
    """`python -m streams.faust_app worker ...`: faust's command line on the app."""
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
    build_app(os.environ.get("POOLLEDGER_BROKER") or None, writer=writer).main()


if __name__ == "__main__":
    main()
