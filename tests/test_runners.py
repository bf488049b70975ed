"""Invariant 2: one log folded by the embedded runner, the replay runner and the faust app on a
real broker ends in byte-identical state; a faust restart mid-stream changes nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from schemas.events import Envelope, JobStopped, JobSubmitted, make_event
from schemas.settings import load_settings
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.faust_adapter import read_state
from streams.faust_tables import (BUCKET, CHUNK, COMMIT, JOB_ADS, SEP, SPLIT_BYTES, TableMirror,
                                  bucket_counts, committed, committed_offset, flatten, from_snapshot_doc, in_order,
                                  resolve, restore, snapshot_doc, unflatten)
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.kafka import KafkaLog
from streams.log.port import TopicSpec
from streams.replay import Until, jsonl_events, replay, replay_log
from streams.runner import EmbeddedRunner
from streams.synthetic import mixed_config, mixed_events
from tests.faust_crash_worker import CRASH_STATUS

N_EVENTS = 10_500
T0 = 1_763_800_000.0


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("conf") / "mixed.conf"
    path.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    return path


@pytest.fixture(scope="module")
def events() -> list[Envelope]:
    evs = list(mixed_events(N_EVENTS))
    kinds = {e.type for e in evs}
    assert {"job.started", "job.stopped", "admin.command", "config.changed", "ad.updated",
            "ad.invalidated", "negotiation.cycle"} <= kinds
    return evs


@pytest.fixture(scope="module")
def replayed(events: list[Envelope], config_file: Path) -> Ledger:
    return replay(events, load_settings(config_file))


@pytest.fixture(scope="module")
def expected(replayed: Ledger) -> str:
    return replayed.to_json()


@pytest.fixture(scope="module")
def expected_snapshot(replayed: Ledger) -> bytes:
    """The replay's state with its job ads (which `to_json`, the golden digest, leaves out)."""
    return replayed.to_snapshot()


def test_mixed_log_exercises_every_fold(events: list[Envelope], config_file: Path) -> None:
    ledger = replay(events, load_settings(config_file))
    doc = ledger.to_doc()
    assert ledger.applied < len(events)  # duplicates were dropped
    assert any(n.startswith("group_physics") for n in doc["accountant"]["Customers"])
    assert doc["limits"]["in_use"]
    assert doc["knobs"]["PRIORITY_HALFLIFE"] in ("43200", "86400")


def test_embedded_runner_matches_replay(tmp_path: Path, events: list[Envelope], config_file: Path,
                                        expected: str) -> None:
    settings = load_settings(config_file)
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec("poolledger.events"))
    elog.log.create_topic(TopicSpec("poolledger.derived"))
    half = len(events) // 2
    elog.append("poolledger.events", events[:half])
    elog.append_raw("poolledger.events", [(None, b'{"id": "broken", "type": "job.started"}', 1.0)])
    first = EmbeddedRunner(elog, settings)
    assert first.run_once() == half  # the broken record went to the DLQ, not into the state
    letters = elog.dead_letters("poolledger.events")
    broken = [d for d in letters if "'broken'" in d.reason]
    rejected = [d for d in letters if " rejected: " in d.reason]  # the log's invalid admin edits
    assert len(broken) == 1 and len(letters) == 1 + len(rejected)
    assert len(rejected) == first.ledger.rejected > 0
    # A second runner process resumes from the snapshot: nothing twice, nothing lost.
    elog.append("poolledger.events", events[half:])
    second = EmbeddedRunner(elog, settings)
    assert second.run_once() == len(events) - half
    assert second.ledger.to_json() == expected
    assert EmbeddedRunner(elog, settings).run_once() == 0


def _assert_same_job_ads(ledger: Ledger, replayed: Ledger) -> None:
    """`ledger` (a runner's) holds `replayed`'s state AND job ads: the queue and each queued
    job's ad through the read API, and byte for byte (`to_snapshot`; `to_json`, the golden
    digest, leaves the ads out)."""
    keys = sorted(k for k, _job in replayed.job_records())
    assert sum(replayed.job_ad(k) is not None for k in keys) > 10  # the log queues jobs
    assert sorted(k for k, _job in ledger.job_records()) == keys
    assert [ledger.job_ad(k) for k in keys] == [replayed.job_ad(k) for k in keys]
    assert ledger.to_snapshot() == replayed.to_snapshot()


def test_job_ads_and_a_restore_midway_agree_on_the_embedded_and_replay_runners(
        tmp_path: Path, events: list[Envelope], config_file: Path) -> None:
    """The job-ad fold is the ledger's: a runner restored from its snapshot midway and a
    replay (from the start, or from that snapshot to a later point) hold the same state AND
    the same job ads (`to_snapshot` covers both; `to_json`, the golden digest, not the ads)."""
    settings = load_settings(config_file)
    full = replay(events, settings)
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    for topic in ("poolledger.events", "poolledger.derived"):
        elog.log.create_topic(TopicSpec(topic))
    half = len(events) // 2
    elog.append("poolledger.events", events[:half])
    EmbeddedRunner(elog, settings).run_once()
    elog.append("poolledger.events", events[half:])
    resumed = EmbeddedRunner(elog, settings)
    assert resumed.events == half  # restored midway, not folded again
    assert resumed.run_once() == len(events) - half
    _assert_same_job_ads(resumed.ledger, full)
    later = Until(position=half + 1000)
    tail = replay_log(elog, settings, later, warn=pytest.fail)
    assert tail.from_snapshot
    assert tail.ledger.to_snapshot() == replay(events, settings, later).to_snapshot()


def test_replay_of_exported_log_matches(tmp_path: Path, events: list[Envelope], config_file: Path,
                                        expected: str) -> None:
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec("poolledger.events"))
    elog.append("poolledger.events", events)
    path = tmp_path / "events.jsonl"
    assert elog.export_jsonl("poolledger.events", path) == len(events)
    skipped: list = []
    ledger = replay(jsonl_events(path, skipped), load_settings(config_file))
    assert not skipped
    assert ledger.to_json() == expected
    cut = replay(events, load_settings(config_file), Until(position=100))
    assert cut.applied <= 100 and cut.to_json() != expected


def _worker(bootstrap: str, app_id: str, topic: str, config: Path, home: Path,
            module: str = "streams.faust_app", **extra: str) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parents[1])  # `tests.faust_crash_worker` from any cwd
    env = dict(os.environ, POOLLEDGER_BROKER=f"kafka://{bootstrap}", POOLLEDGER_FAUST_APP=app_id,
               POOLLEDGER_EVENTS_TOPIC=topic, POOLLEDGER_CONFIG=str(config),
               POOLLEDGER_HOME=str(home), **extra,
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    log = open(home / f"{app_id}-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", module, "worker", "-l", "warn"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)


def test_table_entries_stay_small_and_round_trip(config_file: Path) -> None:
    ledger = replay(mixed_events(6000, slots=600), load_settings(config_file))
    doc = snapshot_doc(ledger)
    assert doc[JOB_ADS]  # the job ads too
    subs, pool = flatten(doc)
    assert max(len(v) for v in pool.values()) < 64_000  # far below Kafka's 1 MB message limit
    assert len(subs) == len(doc["accountant"]["Customers"])
    assert unflatten(subs, pool) == doc


def _fold(ledger: Ledger, env: Envelope) -> None:
    """Fold as the faust worker does: a rejected event (the log's invalid admin edits) is
    dead-lettered there and derives nothing."""
    try:
        ledger.apply(env)
    except EventRejectedError:
        pass


def _seen(ledger: Ledger) -> int:
    """A flush's tag: every event folded or rejected so far."""
    return ledger.applied + ledger.rejected


def test_flushes_write_buckets_not_one_entry_per_job(config_file: Path) -> None:
    """A table that only ever receives the mirror's writes holds the ledger, its job ads and
    job outcomes, while a large section (here the ads of 600 slots, each refreshed, and the
    queued jobs' outcomes) travels as a few buckets, not an entry per child."""
    events = list(mixed_events(8000, slots=600))
    ledger, mirror = Ledger(load_settings(config_file)), TableMirror()
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}
    writes_per_flush = []
    for start in range(0, len(events), 1000):
        for env in events[start:start + 1000]:
            _fold(ledger, env)
        waves = mirror.changes(ledger)
        for name, writes in waves:
            (subs if name == "submitters" else pool).update(writes)
        writes_per_flush.append(sum(len(w) for n, w in waves[:2] if n == "pool"))
        commit = committed(pool)
        assert commit == _seen(ledger)
        assert unflatten(resolve(subs, commit)[0], resolve(pool, commit)[0]) == snapshot_doc(ledger)
    buckets = [k for k in resolve(pool, commit)[0] if k.rsplit(SEP, 1)[-1].startswith(BUCKET)]
    # the slots' ads and the job outcomes' queued jobs (keyed by job id) travel in buckets
    assert {k.rsplit(SEP, 1)[0] for k in buckets} == {f"pool{SEP}ads", f"outcomes{SEP}jobs"}
    assert max(writes_per_flush) < 100  # ~970 of each 1,000 events refresh an ad: ~600 entries


def _job_ad(cluster: int) -> dict[str, Any]:
    """A job ad about the size of a real one (~1 kB)."""
    return {"ClusterId": cluster, "ProcId": 0, "RequestCpus": 1, "Owner": "alice",
            "Requirements": "(TARGET.Arch == \"X86_64\") && (TARGET.OpSys == \"LINUX\")",
            "Environment": " ".join(f"VAR{i}=value{cluster}-{i}" for i in range(40))}


def test_job_ads_travel_in_buckets_and_a_flush_writes_only_the_changed_ones(
        config_file: Path) -> None:
    """The job-ad fold is table entries too: 3,000 queued ads (~3 MB) in bounded buckets,
    not an entry per job; a flush after 10 jobs left rewrites only their buckets; restored
    from the entries, the ledger answers `job_ad` as the one that folded them."""
    settings = load_settings(config_file)
    ledger, mirror = Ledger(settings), TableMirror()
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}
    seq = 0

    def flush() -> list[str]:
        waves = mirror.changes(ledger)
        for name, writes in waves:
            (subs if name == "submitters" else pool).update(writes)
        return [k for name, writes in waves[:2] if name == "pool" for k, _ in writes
                if k.startswith(JOB_ADS)]

    def fold(payload: Any) -> None:
        nonlocal seq
        seq += 1
        ledger.apply(make_event(payload, ts=T0 + seq, source="schedd@ap1", seq=seq))

    for cluster in range(1, 3001):
        fold(JobSubmitted(f"{cluster}.0", "schedd@ap1", "alice@example.org", _job_ad(cluster)))
        if cluster % 500 == 0:
            flush()
    entries = {k: v for k, v in resolve(pool, committed(pool))[0].items() if k.startswith(JOB_ADS)}
    assert all(k.rsplit(SEP, 1)[-1].startswith(BUCKET) for k in entries if k != JOB_ADS + SEP)
    assert 100 < len(entries) < 1000 and max(map(len, entries.values())) <= 2 * SPLIT_BYTES
    for cluster in range(1, 11):
        fold(JobStopped(f"{cluster}.0", "", "removed", "schedd@ap1", "alice@example.org"))
    assert 0 < len(flush()) <= 10
    restored, _ = restore(subs, pool, settings)
    assert restored is not None and restored.to_snapshot() == ledger.to_snapshot()
    assert restored.job_ad("schedd@ap1#1.0") is None
    assert restored.job_ad("schedd@ap1#11.0") == ("schedd@ap1", _job_ad(11))


def test_a_queue_hovering_at_a_bucket_boundary_keeps_its_buckets() -> None:
    """A queue whose size crosses the size at which a fresh split doubles its bucket count, and
    back: the flush after each crossing rewrites the buckets of the jobs that came or went,
    not every bucket (a new count would rehash them all)."""
    def doc(clusters: range) -> dict[str, Any]:
        return {"accountant": {"Customers": {}},
                JOB_ADS: {f"schedd@ap1#{c}.0": {"schedd": "schedd@ap1", "ad": _job_ad(c)}
                          for c in clusters}}

    def buckets(pool: dict[str, bytes]) -> set[str]:
        return {k for k in pool if k.startswith(JOB_ADS + SEP + BUCKET)}

    below = 100
    while bucket_counts(flatten(doc(range(1, below + 5)))[1]) == \
            bucket_counts(flatten(doc(range(1, below)))[1]):
        below += 5  # grow the queue until 5 more jobs double a fresh split's buckets
    small, large = doc(range(1, below)), doc(range(1, below + 5))
    assert len(buckets(flatten(large)[1])) > len(buckets(flatten(small)[1])) > 0  # a fresh split
    _, before = flatten(small)
    _, after = flatten(large, bucket_counts(before))
    changed = {k for k in buckets(after) if before.get(k) != after[k]}
    assert buckets(after) == buckets(before) and 0 < len(changed) <= 5 < len(buckets(before))
    _, back = flatten(small, bucket_counts(after))
    assert back == before
    assert unflatten({}, after) == large


def test_a_value_too_big_for_an_entry_travels_in_chunks(config_file: Path) -> None:
    """A job ad with a 1.5 MB attribute (a huge Environment): its entries stay bounded (each
    also holds the value it replaces, and Kafka refuses messages over 1 MB) and come back
    whole."""
    settings = load_settings(config_file)
    ledger = Ledger(settings)
    huge = {"ClusterId": 7, "ProcId": 0, "Environment": "x" * 1_500_000}
    ledger.apply(make_event(JobSubmitted("7.0", "schedd@ap1", "bob@example.org", huge),
                            ts=T0, source="schedd@ap1", seq=1))
    subs, pool = flatten(snapshot_doc(ledger))
    assert max(len(v) for v in pool.values()) <= 2 * SPLIT_BYTES
    assert sum(k.rsplit(SEP, 1)[-1].startswith(CHUNK) for k in pool) > 1_500_000 / SPLIT_BYTES
    assert unflatten(subs, pool) == snapshot_doc(ledger)
    waves = TableMirror().changes(ledger)
    restored, _ = restore(dict(waves[0][1]), dict(waves[1][1] + waves[2][1]), settings)
    assert restored is not None and restored.job_ad("schedd@ap1#7.0") == ("schedd@ap1", huge)


def test_hostile_attribute_names_of_a_split_ad_round_trip(config_file: Path) -> None:
    """An ad big enough to be split by attribute, whose names are what the key codec uses
    (empty, the separator, a bucket, chunk or escape mark, a name like the dict marker), and
    a job id with the separator in it: the restored ledger holds the same ad."""
    settings = load_settings(config_file)
    ledger = Ledger(settings)
    ad = {"": 1, SEP: 2, f"a{SEP}b": 3, f"{BUCKET}0": {"x": 4}, f"{CHUNK}0": "five",
          "\x1c00": 6, "Pad": "p" * 40_000, "Nested": {"": {SEP: [7]}, "y": "q" * 40_000}}
    ledger.apply(make_event(JobSubmitted(f"8.0{SEP}{BUCKET}1", "schedd@ap1", "bob@example.org", ad),
                            ts=T0, source="schedd@ap1", seq=1))
    subs, pool = flatten(snapshot_doc(ledger))
    assert len(pool) > 10  # split by attribute, not one entry
    waves = TableMirror().changes(ledger)
    restored, _ = restore(dict(waves[0][1]), dict(waves[1][1] + waves[2][1]), settings)
    assert restored is not None and restored.to_snapshot() == ledger.to_snapshot()
    assert restored.job_ad(f"schedd@ap1#8.0{SEP}{BUCKET}1") == ("schedd@ap1", ad)


def test_a_flush_that_did_not_commit_reads_as_the_one_before(config_file: Path) -> None:
    """Entries of a flush whose COMMIT never landed read as the values they replaced, and the
    next flush rewrites them all, so a later COMMIT cannot make the lost flush's values count."""
    events = list(mixed_events(3000))
    ledger, mirror = Ledger(load_settings(config_file)), TableMirror()
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}

    def write(waves: list[tuple[str, list[tuple[str, bytes]]]], *, commit: bool = True) -> None:
        for name, writes in waves if commit else waves[:2]:
            (subs if name == "submitters" else pool).update(writes)

    for env in events[:2000]:
        _fold(ledger, env)
    write(mirror.changes(ledger))
    before, first, snapshot = ledger.to_json(), _seen(ledger), ledger.to_snapshot()
    for env in events[2000:2500]:
        _fold(ledger, env)
    write(mirror.changes(ledger), commit=False)  # the worker died before COMMIT
    lost = _seen(ledger)
    assert COMMIT in pool and committed(pool) == first < _seen(ledger)
    plain_subs, undone_subs = resolve(subs, committed(pool))
    plain_pool, undone_pool = resolve(pool, committed(pool))
    assert undone_pool and Ledger.from_json(
        load_settings(config_file), orjson.dumps(unflatten(plain_subs, plain_pool))).to_json() == before
    # the restarted worker: rebuilt from the resolved tables (job ads too), folds fewer events
    doc = unflatten(plain_subs, plain_pool)
    assert doc is not None
    ledger = from_snapshot_doc(load_settings(config_file), doc)
    assert ledger.to_snapshot() == snapshot
    mirror = TableMirror()
    mirror.load(plain_subs, plain_pool, (undone_subs, undone_pool))
    for env in events[1900:2000]:  # redelivered, already counted: no change but the rewrite
        assert ledger.apply(env) == []
    waves = mirror.changes(ledger)
    assert {k for k, _ in waves[1][1]} == undone_pool and {k for k, _ in waves[0][1]} == undone_subs
    write(waves)
    assert ledger.to_json() == before and ledger.to_snapshot() == snapshot
    assert unflatten(resolve(subs, first)[0], resolve(pool, first)[0]) == snapshot_doc(ledger)
    for env in events[2000:2100]:
        _fold(ledger, env)
    write(mirror.changes(ledger))
    assert committed(pool) == _seen(ledger)
    assert unflatten(resolve(subs, _seen(ledger))[0],
                     resolve(pool, _seen(ledger))[0]) == snapshot_doc(ledger)
    for env in events[2100:]:  # on past the lost flush's tag: its values must not come back
        _fold(ledger, env)
    write(mirror.changes(ledger))
    assert committed(pool) == _seen(ledger) > lost
    assert unflatten(resolve(subs, _seen(ledger))[0],
                     resolve(pool, _seen(ledger))[0]) == snapshot_doc(ledger)


def test_a_child_too_big_for_a_bucket_is_split_on_its_own() -> None:
    big = {f"attr{i}": "x" * 200 for i in range(200)}  # ~45 kB: more than any bucket may hold
    doc = {"accountant": {"Customers": {}},
           "pool": {"ads": {**{f"slot{i}@host": {"Cpus": i, "Name": f"slot{i}"} for i in range(900)},
                            "huge@host": big}}}
    subs, pool = flatten(doc)
    assert max(len(v) for v in pool.values()) <= 2 * SPLIT_BYTES
    assert any(k.startswith(f"pool{SEP}ads{SEP}huge@host{SEP}") for k in pool)
    assert unflatten(subs, pool) == doc


def _deliveries(events: list[Envelope], start: int, stale: list[int],
                seek: list[int]) -> Iterator[list[tuple[int, Envelope]]]:
    """Batches of (offset, event) as a restarted faust worker may see them: first the records
    its fetcher buffered before the seek to `start` (offsets `stale`), then from `start` on,
    300 at a time; a seek (appended to `seek` by the folder) moves the position."""
    yield [(o, events[o]) for o in stale]
    position = start
    while position < len(events):
        if seek:
            position = seek.pop()
        batch = [(o, events[o]) for o in range(position, min(position + 300, len(events)))]
        position += len(batch)
        yield batch


def test_folding_in_offset_order_ends_in_the_replay_state(events: list[Envelope],
                                                           config_file: Path, expected: str) -> None:
    """After a restart faust delivered records buffered before its seek (here 6000..6999)
    ahead of where folding resumes (5000). Folding them as delivered (dedup marks drop only
    the re-reads) ends elsewhere than the replay: usage and ceiling leases (a setceil is
    rejected while a lease is in effect) depend on order. `in_order` folds 5000.. first: the
    stale batch is a gap (seek back), re-reads are skipped; the tables' COMMIT carries the
    offset, so a restart midway resumes exactly there."""
    settings = load_settings(config_file)
    stale = list(range(6000, 7000))

    naive = Ledger(settings)
    for env in events[:5000]:
        _fold(naive, env)
    for batch in _deliveries(events, 5000, stale, []):
        for _, env in batch:
            _fold(naive, env)
    assert naive.to_json() != expected  # the hazard is real on this log

    ledger, mirror = Ledger(settings), TableMirror()
    subs: dict[str, bytes] = {}
    pool: dict[str, bytes] = {}
    for env in events[:5000]:
        _fold(ledger, env)
    for name, writes in mirror.changes(ledger, 5000):
        (subs if name == "submitters" else pool).update(writes)
    restored, mirror = restore(subs, pool, settings)  # the restarted worker
    assert restored is not None and mirror.next_offset == committed_offset(pool) == 5000
    ledger, expect = restored, committed_offset(pool)
    seek: list[int] = []
    seeks: list[int] = []
    for batch in _deliveries(events, 5000, stale, seek):
        take, expect, gap = in_order([o for o, _ in batch], expect)
        if gap:
            assert expect is not None
            seek.append(expect)
            seeks.append(expect)
        for i in take:
            _fold(ledger, batch[i][1])
        for name, writes in mirror.changes(ledger, expect):
            (subs if name == "submitters" else pool).update(writes)
    assert seeks == [5000] and expect == len(events)
    assert ledger.to_json() == expected
    assert committed_offset(pool) == len(events) and committed(pool) == _seen(ledger)


def test_in_order_skips_folded_records_and_stops_at_a_gap() -> None:
    assert in_order([3, 4, 5, 6], 5) == ([2, 3], 7, False)  # 3 and 4 folded already
    assert in_order([5, 7, 8], 5) == ([0], 6, True)  # 6 missing: stop, seek back to 6
    assert in_order([9, 5, 6], 5) == ([], 5, True)  # a buffered record first: nothing folds
    assert in_order([9, 10], None) == ([0, 1], 11, False)  # unknown: the first record starts
    # a COMMIT written before it carried the offset still reads
    assert committed({COMMIT: b"812"}) == 812 and committed_offset({COMMIT: b"812"}) is None
    assert committed({COMMIT: b"812 900"}) == 812 and committed_offset({COMMIT: b"812 900"}) == 900


def _wait_applied(bootstrap: str, config: Path, app_id: str, target: Ledger,
                  timeout: float) -> Ledger | None:
    """Poll the faust tables' changelogs until they reflect every event `target` (a replay)
    applied AND rejected (the ledger read back holds the job ads too): rejected events count apart, and a batch of trailing rejections may
    land after the one that completed `applied` (seen in CI: 32 of 33 rejected)."""
    deadline = time.monotonic() + timeout
    state = None
    seen = None
    while time.monotonic() < deadline:
        state = read_state(bootstrap, load_settings(config), app_id)
        if (state is not None and state.applied >= target.applied
                and state.rejected >= target.rejected):
            if seen == state.to_snapshot():  # settled: two reads a second apart agree
                return state
            seen = state.to_snapshot()
        time.sleep(1.0)
    return state


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture()
def faust_env(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[KafkaLog, str, str]]:
    klog = KafkaLog(kafka_bootstrap)
    app_id = f"pl-{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}.events"
    klog.create_topic(TopicSpec(topic, 1))
    yield klog, app_id, topic
    klog.close()


@pytest.mark.kafka
def test_job_ads_and_a_restore_midway_agree_on_the_faust_runner(
        faust_env: tuple[KafkaLog, str, str], kafka_bootstrap: str, tmp_path: Path,
        events: list[Envelope], config_file: Path, expected: str, replayed: Ledger) -> None:
    """The faust worker folds half the log (and an undecodable record) into its tables, job
    ads included, and stops; a new worker restores the tables from their changelogs midway
    and folds the rest: state and job ads as the replay's, at both points."""
    klog, app_id, topic = faust_env
    elog = EventLog(klog)
    half = len(events) // 2
    elog.append(topic, events[:half])
    elog.append_raw(topic, [(None, b"not json at all", 1.0)])  # must reach the DLQ, not stop it
    first_half = replay(events[:half], load_settings(config_file))
    worker = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path)
    try:
        midway = _wait_applied(kafka_bootstrap, config_file, app_id, first_half, 180)
    finally:
        _stop(worker)
    assert midway is not None and midway.to_json() == first_half.to_json()
    _assert_same_job_ads(midway, first_half)
    _assert_dead_letters(klog, topic, first_half)
    # Restart: the tables are recovered from their changelogs and the stream resumes; events
    # redelivered after the last commit are dropped by the ledger's dedup marks.
    elog.append(topic, events[half:])
    final = _fold_to_end(kafka_bootstrap, app_id, topic, config_file, tmp_path, events)
    assert final is not None and final.to_json() == expected
    _assert_same_job_ads(final, replayed)
    _assert_dead_letters(klog, topic, replayed)


def _assert_dead_letters(klog: KafkaLog, topic: str, replayed: Ledger) -> None:
    """The DLQ holds the undecodable record once and each event the ledger rejected (the
    log's invalid admin edits) once, as many as the replay rejected."""
    letters = [orjson.loads(r.value)["reason"] for r in klog.read(f"{topic}.dlq", 0, 0, 10_000)]
    assert sum("not valid JSON" in r for r in letters) == 1
    rejected = [r for r in letters if " rejected: " in r]
    assert len(letters) == 1 + len(rejected) and len(set(rejected)) == len(rejected) == replayed.rejected


def _fold_to_end(bootstrap: str, app_id: str, topic: str, config: Path, home: Path,
                 events: list[Envelope], module: str = "streams.faust_app") -> Ledger | None:
    """Start a worker, wait until its tables hold all of `events`, stop it: their ledger."""
    final = replay(events, load_settings(config))
    worker = _worker(bootstrap, app_id, topic, config, home, module)
    try:
        state = _wait_applied(bootstrap, config, app_id, final, 180)
    finally:
        _stop(worker)
    return state


@pytest.mark.kafka
@pytest.mark.parametrize("crash_at, writes", [(1, "submitters"), (2, "submitters"), (2, "all")])
def test_faust_crash_midway_through_a_flush_counts_nothing_twice(
        faust_env: tuple[KafkaLog, str, str], kafka_bootstrap: str, tmp_path: Path,
        events: list[Envelope], config_file: Path, expected: str, replayed: Ledger,
        crash_at: int, writes: str) -> None:
    """The worker dies (no clean stop) at its first or second flush, after the submitter
    entries of the batch landed but before the pool entries (dedup marks and job ads
    included) and COMMIT did, or after all of them but COMMIT: the restarted worker reads the
    tables as of the flush before (job ads too), folds the batch again, and ends in the
    replay's state: no usage counted twice, no event skipped."""
    klog, app_id, topic = faust_env
    EventLog(klog).append(topic, events)
    crashed = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path,
                      "tests.faust_crash_worker", POOLLEDGER_FAUST_CRASH_AT=str(crash_at),
                      POOLLEDGER_FAUST_CRASH_WRITES=writes)
    assert crashed.wait(timeout=180) == CRASH_STATUS
    final = _fold_to_end(kafka_bootstrap, app_id, topic, config_file, tmp_path, events)
    assert final is not None and final.to_json() == expected
    _assert_same_job_ads(final, replayed)


@pytest.mark.kafka
def test_faust_folds_batches_delivered_out_of_order_in_offset_order(
        faust_env: tuple[KafkaLog, str, str], kafka_bootstrap: str, tmp_path: Path,
        events: list[Envelope], config_file: Path, expected: str, replayed: Ledger) -> None:
    """faust hands the worker its second batch of events before its first (what a restart
    can do with records fetched before the seek to where folding resumes): the worker folds
    the first batch first, then the second again, and ends in the replay's state."""
    klog, app_id, topic = faust_env
    EventLog(klog).append(topic, events)
    final = _fold_to_end(kafka_bootstrap, app_id, topic, config_file, tmp_path, events,
                         "tests.faust_reorder_worker")
    assert final is not None and final.to_json() == expected
    _assert_same_job_ads(final, replayed)


def _assignments(bootstrap: str, app_id: str) -> dict[str, set[tuple[str, int]]]:
    """The faust app's consumer-group members and the partitions each is assigned."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        group = admin.describe_groups([app_id])[app_id]
    finally:
        admin.close()
    if group.get("group_state") != "Stable":
        return {}
    out: dict[str, set[tuple[str, int]]] = {}
    for member in group["members"]:
        assigned = (member["member_assignment"] or {}).get("assigned_partitions") or []
        out[member["member_id"]] = {(tp["topic"], p) for tp in assigned for p in tp["partitions"]}
    return out


@pytest.mark.kafka
def test_a_standby_faust_worker_takes_over_after_kill_9(
        faust_env: tuple[KafkaLog, str, str], kafka_bootstrap: str, tmp_path: Path,
        events: list[Envelope], config_file: Path, expected: str, replayed: Ledger) -> None:
    """Two workers of one app: the one assigned the events topic folds, the other keeps
    standby replicas of the tables (faust's table_standby_replicas). The active one is
    killed with SIGKILL; the standby takes the partition over and folds the rest of the log
    to the replay's state."""
    klog, app_id, topic = faust_env
    half = len(events) // 2
    EventLog(klog).append(topic, events[:half])
    first = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path)
    second: subprocess.Popen[bytes] | None = None
    try:
        midway = _wait_applied(kafka_bootstrap, config_file, app_id,
                               replay(events[:half], load_settings(config_file)), 180)
        assert midway is not None
        [first_id] = _assignments(kafka_bootstrap, app_id)
        second = _worker(kafka_bootstrap, app_id, topic, config_file, tmp_path)
        deadline = time.monotonic() + 120
        members: dict[str, set[tuple[str, int]]] = {}
        while time.monotonic() < deadline:
            members = _assignments(kafka_bootstrap, app_id)
            if len(members) == 2 and all(members.values()):
                break
            time.sleep(1.0)
        holders = [m for m, parts in members.items() if (topic, 0) in parts]
        assert len(members) == 2 and len(holders) == 1, members
        [standby_id] = [m for m in members if m != holders[0]]
        assert any("changelog" in t for t, _ in members[standby_id])  # a standby replica
        active, standby = (first, second) if holders[0] == first_id else (second, first)
        os.kill(active.pid, signal.SIGKILL)
        assert active.wait(timeout=30) == -signal.SIGKILL
        EventLog(klog).append(topic, events[half:])
        final = _wait_applied(kafka_bootstrap, config_file, app_id,
                              replay(events, load_settings(config_file)), 240)
        assert final is not None and final.to_json() == expected
        _assert_same_job_ads(final, replayed)
        assert standby.poll() is None  # the survivor folded the second half
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                _stop(proc)
