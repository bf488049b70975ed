"""The Kafka adapter of the log port (kafka-python 3.x).

Mapping of the port onto Kafka:

* keyed records go to partition `murmur2(key) & 0x7fffffff % partitions` — Kafka's own
  default partitioner, so Java, faust/aiokafka and kafka-python producers that write the same
  key agree with us (the embedded log uses crc32: partition numbers differ between adapters,
  "same key, same partition" holds in each); unkeyed records go to partition 0, so
  pool-wide events keep one total order (as in the embedded log);
* a record's Kafka timestamp (CreateTime) is its event time in milliseconds; an event time
  that is not a whole millisecond also travels exactly in a `pl.ts` header (a float64), so a
  fold over Kafka sees the very same timestamps as one over the embedded log;
* topics are created with `retention.ms=-1` (the log is the system of record) and
  `cleanup.policy=compact` when the spec asks for it;
* group positions are Kafka consumer-group offsets stored by the group coordinator, so
  `kafka-consumer-groups.sh` and other Kafka consumers see them.

Throughput matters (the benchmark holds us to >= 0.8x a raw kafka-python loop), so the hot
paths avoid per-record work beyond the port's own objects: partitions are memoised per key,
one producer and one consumer are reused, and batching/fetch knobs are constructor args.
"""
from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kerrors
from kafka.partitioner.default import murmur2
from kafka.structs import OffsetAndMetadata

from schemas.config import SettingsLike
from streams.log.lease import LeaseLostError
from streams.log.port import Appended, LogError, Outgoing, Record, TopicNotFoundError, TopicSpec

T = TypeVar("T")

_KEY_CACHE_LIMIT = 65_536  # distinct keys memoised per topic (submitters, ad names, ...)
_GROUP_RETRY_S = 30.0  # the group coordinator needs a moment after __consumer_offsets appears
TS_HEADER = "pl.ts"  # exact event time (float64, little endian) when not a whole millisecond
_F64 = struct.Struct("<d")


@dataclass(frozen=True)
class SaslLogin:
    """SASL credentials of a Kafka client (knobs POOLLEDGER_KAFKA_SASL_MECHANISM, _USER,
    _PASSWORD); the password never appears in a repr, a message or a log line."""

    mechanism: str
    username: str
    password: str = field(repr=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> SaslLogin | None:
        """The login the POOLLEDGER_KAFKA_* knobs configure, None when no mechanism is set."""
        mechanism = str(settings.get("POOLLEDGER_KAFKA_SASL_MECHANISM") or "")
        if not mechanism:
            return None
        return cls(mechanism, str(settings.get("POOLLEDGER_KAFKA_USER") or ""),
                   str(settings.get("POOLLEDGER_KAFKA_PASSWORD") or ""))

    def client_config(self) -> dict[str, Any]:
        """kafka-python's settings for this login (SASL over plaintext, as the launcher's
        secured broker serves on loopback)."""
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username, "sasl_plain_password": self.password}


def parse_broker_url(url: str) -> str:
    """Turn `kafka://host:port`, `host:port` or a comma list of them into a bootstrap string."""
    parts = []
    for item in url.split(","):
        item = item.strip()
        if item.startswith("kafka://"):
            item = item[len("kafka://"):]
        elif "://" in item:
            raise LogError(f"unsupported broker URL scheme in {url!r} (expected kafka://)")
        item = item.rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise LogError(f"broker address {item!r} is not host:port")
        parts.append(item)
    if not parts:
        raise LogError("empty broker URL")
    return ",".join(parts)


@contextlib.contextmanager
def _translated(topic: str | None = None) -> Iterator[None]:
    """Re-raise kafka-python errors as the port's errors so callers never import kafka."""
    try:
        yield
    except LogError:
        raise
    except kerrors.UnknownTopicOrPartitionError as exc:
        raise TopicNotFoundError(f"topic {topic!r} does not exist") from exc
    except (kerrors.AuthorizationError, kerrors.SaslAuthenticationFailedError) as exc:
        raise LogError(f"kafka: permission denied{f' on topic {topic!r}' if topic else ''}: "
                       f"{type(exc).__name__}") from exc
    except kerrors.KafkaTimeoutError as exc:
        raise LogError(f"kafka: no answer from the cluster ({exc})") from exc
    except kerrors.KafkaError as exc:
        raise LogError(f"kafka: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise LogError(f"kafka: {exc}") from exc


def _exact_ts(headers: Sequence[tuple[str, bytes]], ms: int) -> float:
    """The event time of a record with headers: `pl.ts` if present (other producers may add
    headers of their own), else the Kafka timestamp."""
    for name, value in headers:
        if name == TS_HEADER and len(value) == 8:
            return float(_F64.unpack(value)[0])
    return ms / 1000


class KafkaLog:
    """`Log` on an Apache Kafka cluster.

    The producer is idempotent with acks=all, and `append` flushes, so an append that returned
    is on the broker. `linger_ms`/`batch_size`/`compression_type` tune the producer and
    `max_partition_fetch_bytes`/`fetch_max_bytes`/`fetch_max_wait_ms`/`check_crcs` the
    consumer; a benchmark passes the same values to its raw kafka-python baseline.
    `bootstrap_timeout_ms` bounds how long an unreachable cluster takes to be reported (the
    CLI answers within ~10 s, DESIGN.md "Trust").
    Not thread-safe: use one instance per thread.
    """

    def __init__(self, bootstrap: str, *, client_id: str = "poolledger",
                 linger_ms: int = 5, batch_size: int = 1 << 20,
                 compression_type: str | None = None, max_request_size: int = 8 << 20,
                 max_partition_fetch_bytes: int = 8 << 20, fetch_max_bytes: int = 64 << 20,
                 fetch_max_wait_ms: int = 100, check_crcs: bool = True,
                 request_timeout_ms: int = 30_000, bootstrap_timeout_ms: int = 6_000,
                 replication_factor: int = -1, sasl: SaslLogin | None = None) -> None:
        self.bootstrap = parse_broker_url(bootstrap)
        auth = sasl.client_config() if sasl is not None else {}
        self.client_id = client_id
        self.replication_factor = replication_factor
        self.request_timeout_ms = request_timeout_ms
        self.producer_config: dict[str, Any] = dict(
            bootstrap_servers=self.bootstrap, client_id=f"{client_id}-producer",
            enable_idempotence=True, acks="all", linger_ms=linger_ms, batch_size=batch_size,
            compression_type=compression_type, max_request_size=max_request_size,
            allow_auto_create_topics=False, max_block_ms=request_timeout_ms,
            request_timeout_ms=request_timeout_ms, **auth)
        self.consumer_config: dict[str, Any] = dict(
            bootstrap_servers=self.bootstrap, client_id=f"{client_id}-reader", group_id=None,
            enable_auto_commit=False, auto_offset_reset="none", allow_auto_create_topics=False,
            max_partition_fetch_bytes=max_partition_fetch_bytes, fetch_max_bytes=fetch_max_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms, check_crcs=check_crcs,
            max_poll_records=10_000, request_timeout_ms=request_timeout_ms,
            receive_message_max_bytes=max(100_000_000, fetch_max_bytes + (1 << 20)), **auth)
        with _translated():
            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap,
                                           client_id=f"{client_id}-admin",
                                           request_timeout_ms=request_timeout_ms,
                                           bootstrap_timeout_ms=bootstrap_timeout_ms, **auth)
        self._producer: KafkaProducer | None = None
        self._consumer: KafkaConsumer | None = None
        self._assigned: TopicPartition | None = None
        self._next: int = -1  # the consumer's position on `_assigned` after the last read
        self._partition_counts: dict[str, int] = {}
        self._key_partitions: dict[str, dict[bytes, int]] = {}
        self._closed = False

    # ------------------------------------------------------------------ topics

    def create_topic(self, spec: TopicSpec) -> None:
        """Create the topic if it does not exist (an existing topic is left as it is)."""
        self._open()
        configs = {"retention.ms": "-1", "retention.bytes": "-1"}
        if spec.compact:
            configs = {"cleanup.policy": "compact"}
        with _translated(spec.name):
            try:
                self._admin.create_topics(
                    {spec.name: {"num_partitions": spec.partitions,
                                 "replication_factor": self.replication_factor,
                                 "configs": configs}},
                    timeout_ms=self.request_timeout_ms, wait_for_metadata=True)
            except kerrors.TopicAlreadyExistsError:
                pass
        self._partition_counts.pop(spec.name, None)

    def topics(self) -> list[str]:
        """Names of the existing topics (Kafka's internal `__…` topics excluded)."""
        self._open()
        with _translated():
            return sorted(t for t in self._admin.list_topics() if not t.startswith("__"))

    def partitions(self, topic: str) -> int:
        """Number of partitions of `topic` (memoised; Kafka partitions only ever grow)."""
        if self._closed:
            raise LogError("the Kafka log is closed")
        count = self._partition_counts.get(topic)
        if count is None:
            with _translated(topic):
                described = self._admin.describe_topics([topic])
            info = next((t for t in described if t["name"] == topic), None)
            if info is None or info["error_code"] == kerrors.UnknownTopicOrPartitionError.errno:
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
            if info["error_code"]:
                error = kerrors.for_code(info["error_code"])
                denied = "permission denied: " if issubclass(error, kerrors.AuthorizationError) else ""
                raise LogError(f"kafka: {denied}describing {topic!r} failed: {error.__name__}")
            count = len(info["partitions"])
            self._partition_counts[topic] = count
        return count

    def _open(self) -> None:
        if self._closed:
            raise LogError("the Kafka log is closed")

    def _check_partition(self, topic: str, partition: int) -> None:
        if not 0 <= partition < self.partitions(topic):
            raise LogError(f"topic {topic!r} has no partition {partition}")

    # ------------------------------------------------------------------ append

    def append(self, topic: str, records: Sequence[Outgoing]) -> list[Appended]:
        """Send every record, flush, and return where each landed (durable on return)."""
        if not records:
            self.partitions(topic)  # still report a missing topic
            return []
        n = self.partitions(topic)
        for _, _, ts in records:  # reject bad input before anything is sent: no partial append
            if not 0.0 <= ts < 1e14:  # also false for NaN
                raise LogError(f"{topic}: event time {ts!r} is not a time after 1970")
        producer = self._producer or self._make_producer()
        send = producer.send
        cache = self._key_partitions.setdefault(topic, {})
        pack = _F64.pack
        futures: list[Any] = []
        add = futures.append
        with _translated(topic):
            for key, value, ts in records:
                if key is None:
                    partition = 0
                else:
                    partition = cache.get(key, -1)
                    if partition < 0:
                        partition = (murmur2(key) & 0x7FFFFFFF) % n
                        if len(cache) < _KEY_CACHE_LIMIT:
                            cache[key] = partition
                ms = round(ts * 1000)
                if ms / 1000 == ts:
                    add(send(topic, value, key, None, partition, ms))
                else:
                    add(send(topic, value, key, [(TS_HEADER, pack(ts))], partition, ms))
            producer.flush()
            out: list[Appended] = []
            for future in futures:
                if not future.succeeded():
                    raise future.exception if future.is_done else LogError("append not acknowledged")
                meta = future.value
                out.append(Appended(meta.partition, meta.offset))
        return out

    def _make_producer(self) -> KafkaProducer:
        with _translated():
            self._producer = KafkaProducer(**self.producer_config)
        return self._producer

    # ------------------------------------------------------------------ read

    def read(self, topic: str, partition: int, offset: int, max_records: int = 10_000) -> list[Record]:
        """Records of one partition from `offset` on; empty at the end (never waits for new ones)."""
        self._check_partition(topic, partition)
        if offset < 0:
            raise LogError(f"{topic}[{partition}]: negative offset {offset}")
        if max_records <= 0:
            return []
        consumer = self._consumer or self._make_consumer()
        tp = TopicPartition(topic, partition)
        out: list[Record] = []
        with _translated(topic):
            end = self._known_end(consumer, tp)
            if offset >= end:
                end = consumer.end_offsets([tp])[tp]
                if offset >= end:
                    return out
            if self._assigned != tp:
                consumer.assign([tp])
                self._assigned = tp
                self._next = -1
            if offset != self._next:
                consumer.seek(tp, offset)
            self._next = -1  # unknown until the loop finishes cleanly
            add = out.append
            position = offset
            deadline = time.monotonic() + self.request_timeout_ms / 1000
            while len(out) < max_records and position < end:
                try:
                    batch = consumer.poll(timeout_ms=self.consumer_config["fetch_max_wait_ms"] + 200,
                                          max_records=max_records - len(out)).get(tp)
                except kerrors.OffsetOutOfRangeError:
                    # below the log start (records deleted): continue from the first kept one
                    consumer.seek_to_beginning(tp)
                    continue
                if batch:
                    for r in batch:
                        add(Record(topic, partition, r.offset, r.key, r.value,
                                   _exact_ts(r.headers, r.timestamp) if r.headers else r.timestamp / 1000))
                    deadline = time.monotonic() + self.request_timeout_ms / 1000
                elif time.monotonic() > deadline:
                    raise LogError(f"kafka: no data from {topic}[{partition}] at offset {position}"
                                   f" (end {end}) within {self.request_timeout_ms} ms")
                position = consumer.position(tp)
                # compaction and control records leave gaps: the end offset can exceed the
                # last record, so trust the broker's high watermark once we have reached it
                hw = consumer.highwater(tp)
                if hw is not None:
                    end = hw
            self._next = position
        return out

    @staticmethod
    def _known_end(consumer: KafkaConsumer, tp: TopicPartition) -> int:
        """The last high watermark seen for `tp` (0 when none yet); refreshed on demand."""
        with contextlib.suppress(kerrors.IllegalStateError, AssertionError):
            if consumer.assignment() == {tp}:
                hw = consumer.highwater(tp)
                if hw is not None:
                    return int(hw)
        return 0

    def _make_consumer(self) -> KafkaConsumer:
        with _translated():
            self._consumer = KafkaConsumer(**self.consumer_config)
        return self._consumer

    # ------------------------------------------------------------------ offsets

    def offset_for_time(self, topic: str, partition: int, ts: float) -> int:
        """The first offset whose timestamp is >= ts (the end offset if none)."""
        self._check_partition(topic, partition)
        consumer = self._consumer or self._make_consumer()
        tp = TopicPartition(topic, partition)
        with _translated(topic):
            found = consumer.offsets_for_times({tp: max(round(ts * 1000), 0)})[tp]
            if found is None:
                return int(consumer.end_offsets([tp])[tp])
        # Kafka answers to the millisecond: every record before `found` is earlier than ts,
        # but records in ts's own millisecond may still be earlier (exact ts in the header)
        offset = int(found.offset)
        while True:
            chunk = self.read(topic, partition, offset, 500)
            if not chunk:
                return offset
            for record in chunk:
                if record.timestamp >= ts:
                    return record.offset
            offset = chunk[-1].offset + 1

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition."""
        n = self.partitions(topic)
        consumer = self._consumer or self._make_consumer()
        tps = [TopicPartition(topic, p) for p in range(n)]
        with _translated(topic):
            ends = consumer.end_offsets(tps)
        return {tp.partition: int(off) for tp, off in ends.items()}

    # ------------------------------------------------------------------ groups

    def commit(self, group: str, topic: str, positions: Mapping[int, int]) -> None:
        """Store `group`'s next offsets for `topic` with the Kafka group coordinator."""
        if not positions:
            return
        for p, o in positions.items():
            self._check_partition(topic, p)
            if o < 0:
                raise LogError(f"cannot commit {topic}[{p}]@{o} for group {group!r}")
        offsets = {TopicPartition(topic, p): OffsetAndMetadata(int(o), "", None)
                   for p, o in positions.items()}
        with _translated(topic):
            result = self._retry(lambda: self._admin.alter_group_offsets(group, offsets))
        for tp, error in result.items():
            if error is not kerrors.NoError:
                if error is kerrors.UnknownTopicOrPartitionError:
                    raise TopicNotFoundError(f"topic {topic!r} does not exist")
                raise LogError(f"kafka: committing {group!r} {tp.topic}[{tp.partition}] "
                               f"failed: {error.__name__}")

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """`group`'s stored next offsets for `topic`; {} for an unknown group or topic."""
        self._open()
        with _translated(topic):
            result = self._retry(lambda: self._admin.list_group_offsets({group: None}))
        return {tp.partition: int(meta.offset) for tp, meta in result.get(group, {}).items()
                if tp.topic == topic and meta.offset >= 0}

    @staticmethod
    def _retry(call: Callable[[], T]) -> T:
        """Run a group-coordinator call, retrying while the coordinator is still loading."""
        deadline = time.monotonic() + _GROUP_RETRY_S
        delay = 0.05
        while True:
            try:
                return call()
            except kerrors.KafkaError as exc:
                if not getattr(exc, "retriable", False) or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    # ------------------------------------------------------------------ leases

    def lease(self, group: str, topic: str) -> GroupLease:
        """A lease (`streams.log.lease.Lease`) held by the member of consumer group `group`
        that is assigned partition 0 of `topic`."""
        self.partitions(topic)  # a missing topic is named now, not by a silent empty group
        return GroupLease(self, group, topic)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Flush and close the producer, the reader and the admin client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for client in (self._producer, self._consumer, self._admin):
            if client is None:
                continue
            try:
                client.close()
            except Exception as exc:  # close everything even when one client fails
                errors.append(exc)
        self._producer = self._consumer = None
        if errors:
            raise LogError(f"kafka: close failed: {errors[0]}") from errors[0]

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupLease:
    """A lease that is membership of a Kafka consumer group (`KafkaLog.lease`).

    Every contender subscribes to `topic` in `group`; the group coordinator assigns partition 0
    to exactly one live member. The sticky assignor keeps it with its holder when a standby
    joins; when the holder stops heartbeating (kill -9, a lost host), the coordinator drops it
    after `session_timeout_ms` and a standby's next `held()` (a poll) is assigned it. The
    group is a lease, not a reader (readers use `KafkaLog.read`): the one offset it commits is
    `fence`'s proof of membership, never read.
    """

    def __init__(self, log: KafkaLog, group: str, topic: str, *,
                 session_timeout_ms: int = 6_000, heartbeat_interval_ms: int = 1_000) -> None:
        from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

        self.group, self.topic = group, topic
        self._tp = TopicPartition(topic, 0)
        config = {k: v for k, v in log.consumer_config.items()
                  if k not in ("group_id", "client_id", "enable_auto_commit", "auto_offset_reset")}
        with _translated(topic):
            self._consumer: KafkaConsumer | None = KafkaConsumer(
                **config, group_id=group, client_id=f"{log.client_id}-lease",
                enable_auto_commit=False, auto_offset_reset="latest",
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
                partition_assignment_strategy=[StickyPartitionAssignor])
            self._consumer.subscribe([topic])

    def held(self) -> bool:
        """Poll the group (joining, heartbeating, taking part in a rebalance) and say whether
        this member is assigned partition 0. Assigned partitions are paused: nothing is
        fetched."""
        if self._consumer is None:
            return False
        with _translated(self.topic):
            self._consumer.poll(timeout_ms=50, max_records=1, update_offsets=False)
            assigned = self._consumer.assignment()
            if assigned:
                self._consumer.pause(*assigned)
            return self._tp in assigned

    @contextlib.contextmanager
    def fence(self) -> Iterator[None]:
        """Refuse the block unless this member is still assigned partition 0 (a holder that
        stalled past the session timeout learns it here, before it appends).

        Its own view of the assignment is not enough: a member resumed after a SIGSTOP still
        lists partition 0 until its next rebalance. So it commits an offset, synchronously:
        the coordinator takes a commit only from a member of the current generation (Kafka's
        fencing of zombie consumers), and refuses the stopped one's."""
        lost = LeaseLostError(f"{self.group}: partition 0 of {self.topic} was assigned to "
                              "another member")
        if not self.held() or self._consumer is None:
            raise lost
        try:
            with _translated(self.topic):
                self._consumer.commit({self._tp: OffsetAndMetadata(0, "lease", -1)})
        except LogError as exc:
            if isinstance(exc.__cause__, (kerrors.CommitFailedError, kerrors.IllegalGenerationError,
                                          kerrors.UnknownMemberIdError,
                                          kerrors.RebalanceInProgressError)):
                self.held()  # rejoin now: a standby again
                raise lost from exc
            raise
        yield

    def release(self) -> None:
        """Leave the group (the coordinator rebalances to a standby at once)."""
        if self._consumer is not None:
            with _translated(self.topic):
                self._consumer.close(autocommit=False)
            self._consumer = None
