"""Log throughput: both adapters against raw kafka-python loops, measured in the same run.

    python bench/log_throughput.py [--events 200000] [--batch 5000] [--partitions 1]

Every path moves the same ~390-byte event envelopes (job.started, keyed by submitter) in the
same batches. Kafka: `KAFKA_BOOTSTRAP` if set, else a broker started with
`compose.kafka.KafkaServer` for the run. The raw baselines use the adapter's own producer and
consumer settings, so the ratios measure the adapter's overhead and nothing else. The embedded
log (SQLite, checksums verified on read) is measured beside the segment format it replaced:
its frames written by `streams.log.segments.write_segment_log` (one frame per batch, as the old
writer did, without its index files and locks) and read back by the migration reader (CRC
checked), one partition. Decoding alone (`schemas.events.decode`: parse, validate, build the
envelope) is timed beside `orjson.loads` (parse only) on the same bytes. Targets: Kafka adapter
>= 0.8x raw both ways; embedded >= 200,000 events/s both ways. The last line is one line of
key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import orjson

from compose.kafka import broker
from schemas.events import JobStarted, decode, encode, make_event, partition_key
from streams.log.embedded import EmbeddedLog
from streams.log.port import Log, Outgoing, Record, TopicSpec
from streams.log.segments import SegmentLog, write_segment_log

T0 = 1_763_800_000.0


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def make_events(n: int) -> list[Outgoing]:
    """n encoded job.started envelopes of about 300 bytes, keyed by submitter."""
    users = [f"user{i:02d}@example.org" for i in range(40)]
    out: list[Outgoing] = []
    for i in range(n):
        user = users[i % len(users)]
        env = make_event(JobStarted(f"{i}.0", "schedd@ap1", user,
                                    f"slot1_{i % 64}@ep{i % 500:03d}.example.org", 1.0,
                                    {"Cpus": 1, "Memory": 2048}, "xsw"),
                         ts=T0 + i * 0.001, source="schedd@ap1", seq=i + 1)
        out.append((partition_key(env).encode(), encode(env), env.ts))
    return out


def timed(label: str, n: int, fn: Callable[[], int]) -> float:
    """Run fn (which returns how many events it moved) and return events per second."""
    progress(f"{label}: {n:,} events ...")
    t = time.perf_counter()
    moved = fn()
    dt = time.perf_counter() - t
    if moved != n:
        raise SystemExit(f"{label}: moved {moved} events, expected {n}")
    eps = n / dt
    progress(f"{label}: {eps:,.0f} events/s ({dt:.2f}s)")
    return eps


def append_all(log: Log, topic: str, events: list[Outgoing], batch: int) -> int:
    n = 0
    for i in range(0, len(events), batch):
        n += len(log.append(topic, events[i:i + batch]))
    return n


def read_all(log: Log, topic: str, batch: int) -> int:
    n = 0
    for p in range(log.partitions(topic)):
        offset = 0
        while chunk := log.read(topic, p, offset, batch):
            n += len(chunk)
            offset = chunk[-1].offset + 1
    return n


# --------------------------------------------------------------------------- embedded

def bench_embedded(events: list[Outgoing], batch: int, partitions: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="poolledger-bench-"))
    try:
        writer = EmbeddedLog(root)
        writer.create_topic(TopicSpec("bench", partitions))
        append = timed("embedded append", len(events), lambda: append_all(writer, "bench", events, batch))
        writer.close()
        reader = EmbeddedLog(root)
        read = timed("embedded read", len(events), lambda: read_all(reader, "bench", batch))
        reader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"embedded_append_eps": append, "embedded_read_eps": read}


def bench_marker(events: list[Outgoing], n: int = 3_000, rounds: int = 3) -> dict[str, float]:
    """One-record appends (a negotiation cycle's size, the marker's worst case) with the commit
    marker `log.commits` written after each commit, against the same appends without it
    (`_mark_commits` a no-op), alternating, best of `rounds`."""
    best = {True: 0.0, False: 0.0}
    for _ in range(rounds):
        for marked in (False, True):
            root = Path(tempfile.mkdtemp(prefix="poolledger-bench-"))
            try:
                log = EmbeddedLog(root)
                log.create_topic(TopicSpec("bench", 1))
                if not marked:
                    log._mark_commits = lambda ends: None  # type: ignore[method-assign]
                start = time.perf_counter()
                for record in events[:n]:
                    log.append("bench", [record])
                best[marked] = max(best[marked], n / (time.perf_counter() - start))
                log.close()
            finally:
                shutil.rmtree(root, ignore_errors=True)
    progress(f"one-record appends: {best[True]:,.0f}/s with the commit marker, "
             f"{best[False]:,.0f}/s without")
    return {"marker_append_eps": best[True], "unmarked_append_eps": best[False],
            "marker_append_ratio": best[True] / best[False]}


def bench_segments(events: list[Outgoing], batch: int) -> dict[str, float]:
    """The old segment format's baseline, one partition."""
    root = Path(tempfile.mkdtemp(prefix="poolledger-bench-"))
    batches = [events[i:i + batch] for i in range(0, len(events), batch)]
    try:
        def write() -> int:
            write_segment_log(root, "bench", batches)
            return len(events)

        append = timed("segment append (legacy format)", len(events), write)
        old = SegmentLog(root)
        (spec,) = old.topics()
        read = timed("segment read (legacy format)", len(events),
                     lambda: sum(isinstance(r, Record) for r in old.read(spec, 0)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"segment_append_eps": append, "segment_read_eps": read}


def bench_decode(events: list[Outgoing], rounds: int = 3) -> dict[str, float]:
    """Decoding alone against parsing alone, best of `rounds`, the order alternating."""
    raws = [value for _, value, _ in events]
    best = {"decode": float("inf"), "orjson_loads": float("inf")}
    paths: dict[str, Callable[[bytes], object]] = {"decode": decode, "orjson_loads": orjson.loads}
    for r in range(rounds):
        for name in sorted(paths, reverse=r % 2 == 1):
            fn = paths[name]
            t = time.perf_counter()
            for raw in raws:
                fn(raw)
            best[name] = min(best[name], time.perf_counter() - t)
            progress(f"{name}: {best[name] / len(raws) * 1e6:.2f} µs/event (round {r + 1})")
    n = len(raws)
    return {"decode_us": best["decode"] / n * 1e6, "orjson_loads_us": best["orjson_loads"] / n * 1e6,
            "decode_eps": n / best["decode"], "decode_ratio": best["orjson_loads"] / best["decode"]}


# --------------------------------------------------------------------------- kafka

def raw_append(producer_config: dict[str, object], topic: str, events: list[Outgoing],
               batch: int) -> int:
    """The baseline: kafka-python's producer, send per record, flush per batch."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**producer_config)
    try:
        send = producer.send
        for i in range(0, len(events), batch):
            for key, value, ts in events[i:i + batch]:
                send(topic, value=value, key=key, timestamp_ms=int(round(ts * 1000)))
            producer.flush()
    finally:
        producer.close()
    return len(events)


def raw_read(consumer_config: dict[str, object], topic: str, partitions: int, n: int,
             batch: int) -> int:
    """The baseline: kafka-python's consumer, assign + seek to the start, poll until all seen."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**consumer_config)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        seen = 0
        deadline = time.monotonic() + 300
        while seen < n and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500, max_records=batch).values():
                seen += len(recs)
    finally:
        consumer.close()
    return seen


def bench_kafka(bootstrap: str, events: list[Outgoing], batch: int, partitions: int,
                rounds: int) -> dict[str, float]:
    from streams.log.kafka import KafkaLog

    log = KafkaLog(bootstrap)
    best: dict[str, float] = {}

    def keep(name: str, eps: float) -> None:
        best[name] = max(best.get(name, 0.0), eps)

    try:
        for r in range(rounds):
            raw_topic, ada_topic = (f"bench-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("raw", "adapter"))
            for t in (raw_topic, ada_topic):
                log.create_topic(TopicSpec(t, partitions))
            n = len(events)
            tag = f"round {r + 1}/{rounds}"
            # alternate who goes first, so a noisy neighbour hurts both alike
            order = ["raw", "adapter"] if r % 2 == 0 else ["adapter", "raw"]
            for who in order:
                if who == "raw":
                    keep("kafka_raw_append_eps", timed(f"kafka raw append ({tag})", n,
                         lambda: raw_append(log.producer_config, raw_topic, events, batch)))
                else:
                    keep("kafka_append_eps", timed(f"kafka adapter append ({tag})", n,
                         lambda: append_all(log, ada_topic, events, batch)))
            for who in order:
                if who == "raw":
                    keep("kafka_raw_read_eps", timed(f"kafka raw read ({tag})", n,
                         lambda: raw_read(log.consumer_config, raw_topic, partitions, n, batch)))
                else:
                    fresh = KafkaLog(bootstrap)  # a cold reader, like the raw one
                    try:
                        keep("kafka_read_eps", timed(f"kafka adapter read ({tag})", n,
                             lambda: read_all(fresh, ada_topic, batch)))
                    finally:
                        fresh.close()
    finally:
        log.close()
    best["kafka_append_ratio"] = best["kafka_append_eps"] / best["kafka_raw_append_eps"]
    best["kafka_read_ratio"] = best["kafka_read_eps"] / best["kafka_raw_read_eps"]
    return best


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per path (default 200000)")
    parser.add_argument("--batch", type=int, default=5_000, help="events per append/read (default 5000)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions per topic (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="Kafka rounds, best kept (default 2)")
    parser.add_argument("--no-kafka", action="store_true", help="only the embedded log")
    args = parser.parse_args(argv)

    progress(f"building {args.events:,} events ...")
    events = make_events(args.events)
    size = sum(len(v) for _, v, _ in events) / len(events)
    progress(f"mean event size {size:.0f} bytes, batch {args.batch}, partitions {args.partitions}")
    results = bench_decode(events)
    results.update(bench_embedded(events, args.batch, args.partitions))
    results.update(bench_segments(events, args.batch))
    results.update(bench_marker(events))
    if not args.no_kafka:
        with broker(progress) as bootstrap:
            results.update(bench_kafka(bootstrap, events, args.batch, args.partitions, args.rounds))

    nan = float("nan")
    rows = [
        ("segment files (old, 1 part.)", results["segment_append_eps"], results["segment_read_eps"],
         "1.00", "1.00"),
        ("embedded (SQLite)", results["embedded_append_eps"], results["embedded_read_eps"],
         f"{results['embedded_append_eps'] / results['segment_append_eps']:.2f}",
         f"{results['embedded_read_eps'] / results['segment_read_eps']:.2f}"),
        ("kafka raw (kafka-python)", results.get("kafka_raw_append_eps", nan),
         results.get("kafka_raw_read_eps", nan), "1.00", "1.00"),
        ("kafka adapter (KafkaLog)", results.get("kafka_append_eps", nan),
         results.get("kafka_read_eps", nan), f"{results.get('kafka_append_ratio', nan):.2f}",
         f"{results.get('kafka_read_ratio', nan):.2f}"),
    ]
    print(f"\nlog throughput: {args.events:,} events of ~{size:.0f} bytes, batches of {args.batch}, "
          f"{args.partitions} partition(s)")
    print(f"{'path':28} {'append ev/s':>12} {'read ev/s':>12} {'append x':>9} {'read x':>7}")
    for name, a, r, ax, rx in rows:
        print(f"{name:28} {a:12,.0f} {r:12,.0f} {ax:>9} {rx:>7}")
    print(f"decode (schemas.events.decode): {results['decode_us']:.2f} µs/event "
          f"({results['decode_eps']:,.0f} ev/s); orjson.loads alone {results['orjson_loads_us']:.2f} "
          f"µs/event; decode {results['decode_ratio']:.2f}x orjson.loads' speed")
    print(f"one-record appends with the commit marker (log.commits): "
          f"{results['marker_append_eps']:,.0f}/s, {results['marker_append_ratio']:.2f}x without")
    ok_embedded = min(results["embedded_append_eps"], results["embedded_read_eps"]) >= 200_000
    ok_kafka = args.no_kafka or min(results["kafka_append_ratio"], results["kafka_read_ratio"]) >= 0.8
    print(f"targets: embedded >= 200,000 ev/s {'met' if ok_embedded else 'MISSED'}; "
          f"kafka adapter >= 0.8x raw {'met' if ok_kafka else 'MISSED'}")
    keys = ["kafka_append_ratio", "kafka_read_ratio", "embedded_append_eps", "embedded_read_eps",
            "kafka_append_eps", "kafka_read_eps", "kafka_raw_append_eps", "kafka_raw_read_eps",
            "segment_append_eps", "segment_read_eps", "decode_us", "orjson_loads_us", "decode_eps",
            "decode_ratio", "marker_append_eps", "marker_append_ratio"]
    print(" ".join(f"{k}={results.get(k, nan):.2f}" if k.endswith(("ratio", "_us"))
                   else f"{k}={results.get(k, nan):.0f}" for k in keys)
          + f" events={args.events} batch={args.batch} partitions={args.partitions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
