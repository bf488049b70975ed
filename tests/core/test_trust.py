"""Issue 10's reproductions 2, 3, 5 and 6 (config.changed): nothing dropped or bent in silence.

Each event fed to a runner is either applied, a duplicate of one applied (same id), or
dead-lettered with its reason; the seqs a source skipped are reported as lost updates.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest

from schemas.errors import EventValidationError
from schemas.events import (AdInvalidated, AdUpdated, ConfigChanged, Envelope, JobStarted,
                            JobStopped, content_checksum, decode, encode, make_event)
from schemas.settings import load_settings
from streams.core.errors import EventRejectedError
from streams.core.ledger import DIGESTS_KEPT, Dedup, Ledger
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.kafka import KafkaLog
from streams.log.port import TopicSpec
from streams.log.topics import DERIVED, EVENTS, PartitionsError, dlq_topic
from streams.replay import replay
from streams.runner import EmbeddedRunner
from streams.synthetic import SCHEDD, mixed_config, mixed_events
from tests.test_runners import _fold, _stop, _wait_applied, _worker  # the faust harness

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def settings():  # type: ignore[no-untyped-def]
    return load_settings(env={}, overrides=mixed_config())


@pytest.fixture(scope="module")
def log() -> list[Envelope]:
    return [decode(encode(e)) for e in mixed_events(3000)]


def _distinct(events: list[Envelope]) -> int:
    return len({e.id for e in events})


def _runner(tmp_path: Path, settings, events: list[Envelope]) -> EmbeddedRunner:  # type: ignore[no-untyped-def]
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec(EVENTS))
    elog.log.create_topic(TopicSpec(DERIVED))
    elog.append(EVENTS, events)
    runner = EmbeddedRunner(elog, settings)
    runner.run_once()
    return runner


def test_swapped_neighbours_are_both_applied(log: list[Envelope], settings) -> None:  # type: ignore[no-untyped-def]
    ids = [e.id for e in log]
    i, j = ids.index(f"{SCHEDD}:2"), ids.index(f"{SCHEDD}:3")
    swapped = list(log)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    straight, led = replay(log, settings), replay(swapped, settings)
    assert led.applied == straight.applied and led.applied + led.rejected == _distinct(log)
    assert led.lost_updates() == {}


def test_a_far_ahead_seq_hides_nothing(log: list[Envelope], settings) -> None:  # type: ignore[no-untyped-def]
    first = log[0]
    bogus = make_event(first.data, ts=first.ts, source=SCHEDD, seq=999_999_999)
    led = replay([bogus, *log], settings)
    assert led.applied + led.rejected == _distinct(log) + 1  # every real event of the schedd too
    real = max(e.seq for e in log if e.source == SCHEDD)
    assert led.lost_updates() == {SCHEDD: 999_999_998 - real}


def test_dedup_by_identity_with_gaps_round_trips() -> None:
    d = Dedup()

    def seen(seq: int) -> bool:
        return d.seen(make_event(AdInvalidated("Machine", "m"), ts=1.0, source="s", seq=seq))

    assert [seen(s) for s in (1, 5, 3, 3, 9, 4, 2, 1, 7)] == [False] * 3 + [True] + [False] * 3 + [True, False]
    assert d.missing == {"s": [[6, 6], [8, 8]]} and d.lost_updates() == {"s": 2}
    again = Dedup.from_doc(orjson.loads(orjson.dumps(d.to_doc())))
    assert again == d and again.to_doc() == d.to_doc()
    assert not again.seen(make_event(AdInvalidated("Machine", "m"), ts=1.0, source="s", seq=6))
    assert again.lost_updates() == {"s": 1}
    # ids of another form (UUIDs, seq 0) are remembered by the id
    other = make_event(AdInvalidated("Machine", "m"), ts=1.0, source="cli", seq=0, id="u-1")
    assert not d.seen(other) and d.seen(other)


def test_a_conflicting_duplicate_is_rejected_naming_both_across_a_snapshot(
        log: list[Envelope], settings) -> None:  # type: ignore[no-untyped-def]
    """Issue 28 item 8 at the fold: an id folded among the latest DIGESTS_KEPT events comes
    again with other content: rejected with the event id and both content checksums, by a
    ledger that folded it and by one restored from a snapshot after it alike (the checksums
    travel in the snapshot, not in the golden `to_json`); a plain redelivery is dropped; an
    id older than the kept ones is known by its mark only (dropped, as before)."""
    straight = Ledger(settings)
    for env in log[:2000]:
        _fold(straight, env)
    restored = Ledger.from_snapshot(settings, straight.to_snapshot())
    assert restored.to_snapshot() == straight.to_snapshot()
    assert '"digests"' not in straight.to_json()
    held = next(e for e in reversed(log[:2000]) if isinstance(e.data, JobStarted))
    forged = decode(orjson.dumps(dict(held.to_dict(), ts=held.ts + 1)))
    reasons = []
    for led in (straight, restored):
        assert led.apply(held) == []  # a redelivery
        with pytest.raises(EventRejectedError) as exc:
            led.apply(forged)
        reasons.append(str(exc.value))
    assert reasons[0] == reasons[1] == (
        f"event {held.id} rejected: a different event with this id was seen already (content "
        f"checksum {content_checksum(forged):016x}, the one seen {content_checksum(held):016x}): a "
        "conflicting duplicate, not folded")
    assert restored.to_snapshot() == straight.to_snapshot()
    # older than the kept ones: the ledger's driver looks the first version up in the log
    old = next(e for e in log[:2000 - DIGESTS_KEPT - 100] if isinstance(e.data, JobStarted))
    later = decode(orjson.dumps(dict(old.to_dict(), ts=old.ts + 1)))
    assert straight.dedup.held(old.id) is None
    assert straight.apply(later) == []  # no log to ask (a bare ledger): dropped
    straight.first_version = _first_in(log[:2000])
    assert straight.apply(old) == []  # a redelivery, however old
    with pytest.raises(EventRejectedError, match=f"checksum {content_checksum(later):016x}, "
                                                 f"the one seen {content_checksum(old):016x}"):
        straight.apply(later)


def _first_in(events: list[Envelope]) -> Callable[[str], Envelope | None]:
    """A log's `first_version` port over a list of its events."""
    return lambda event_id: next((e for e in events if e.id == event_id), None)


def test_far_future_event_is_dead_lettered_and_moves_no_clock(tmp_path: Path, log: list[Envelope],
                                                               settings) -> None:  # type: ignore[no-untyped-def]
    """Reproduction 3: an ad.invalidated of an unknown machine at ts 1e10."""
    mid = len(log) // 2
    future = make_event(AdInvalidated("Machine", "nowhere@example.org"), ts=1e10,
                        source="collector@cm", seq=1)
    runner = _runner(tmp_path, settings, [*log[:mid], future, *log[mid:]])
    plain = replay(log, settings)
    assert plain.now is not None and runner.ledger.now == plain.now < 1e10
    assert runner.ledger.priorities() == plain.priorities()  # usage unchanged
    letters = runner.elog.dead_letters(EVENTS)
    reasons = [d.reason for d in letters if "collector@cm:1" in d.reason]
    assert len(reasons) == 1 and "POOLLEDGER_MAX_EVENT_SKEW" in reasons[0]
    assert runner.ledger.applied + runner.ledger.rejected == _distinct(log) + 1


def test_huge_time_is_refused_at_validation_and_userprio_works(tmp_path: Path, log: list[Envelope]
                                                               ) -> None:
    """Reproduction 3: ts 1e308 -> DLQ at validation; `userprio -all` still answers."""
    bad = dict(log[5].to_dict(), ts=1e308, id="collector@cm:1", source="collector@cm", seq=1)
    with pytest.raises(EventValidationError, match=r"field 'ts'"):
        decode(orjson.dumps(bad))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in log[:500]) + orjson.dumps(bad) + b"\n")
    conf = tmp_path / "mixed.conf"
    conf.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(tmp_path / "h"),
                           "--config", str(conf), "userprio", "-all", "--json", "--log", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "field 'ts'" in proc.stderr and "Traceback" not in proc.stderr
    assert "Infinity" not in proc.stdout and "NaN" not in proc.stdout
    json.loads(proc.stdout)


def test_huge_slot_weight_is_dead_lettered_and_a_restart_is_unaffected(
        tmp_path: Path, log: list[Envelope], settings) -> None:  # type: ignore[no-untyped-def]
    """Reproduction 5: slot_weight 1e308 (and a `big:1e999` limit) never reach the state."""
    start = next(e for e in log if isinstance(e.data, JobStarted))
    raws = [dict(start.to_dict(), id="schedd@evil:1", source="schedd@evil", seq=1),
            dict(start.to_dict(), id="schedd@evil:2", source="schedd@evil", seq=2)]
    raws[0]["data"] = dict(raws[0]["data"], slot_weight=1e308)
    raws[1]["data"] = dict(raws[1]["data"], concurrency_limits="big:1e999")
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec(EVENTS))
    elog.log.create_topic(TopicSpec(DERIVED))
    elog.append(EVENTS, log[:1000])
    elog.append_raw(EVENTS, [(None, orjson.dumps(r), 1.0) for r in raws])
    runner = EmbeddedRunner(elog, settings)
    runner.run_once()
    reasons = [d.reason for d in elog.dead_letters(EVENTS)]
    assert any("schedd@evil:1" in r and "data.slot_weight" in r for r in reasons)
    assert any("schedd@evil:2" in r and "data.concurrency_limits" in r for r in reasons)
    text = runner.ledger.to_json()
    assert "Infinity" not in text and "NaN" not in text
    elog.append(EVENTS, log[1000:])
    again = EmbeddedRunner(elog, settings)  # the restart reads its snapshot
    again.run_once()
    assert again.ledger.to_json() == replay(log, settings).to_json()


def test_invalid_config_value_is_rejected_and_audited(tmp_path: Path, log: list[Envelope],
                                                      settings) -> None:  # type: ignore[no-untyped-def]
    """Reproduction 6 (the log's part): PRIORITY_HALFLIFE = -1 on the log."""
    bad = make_event(ConfigChanged("PRIORITY_HALFLIFE", "-1", "root"), ts=log[100].ts,
                     source="config@bad", seq=1)
    events = [*log[:100], bad, *log[100:]]
    led = Ledger(settings)
    reasons = []
    for env in events:
        try:
            led.apply(env)
        except EventRejectedError as exc:
            reasons.append((exc.event_id, exc.reason))
    assert ("config@bad:1" in dict(reasons)) and "PRIORITY_HALFLIFE" in dict(reasons)["config@bad:1"]
    assert led.to_json() != "" and led.knobs.get("PRIORITY_HALFLIFE") != "-1"
    assert led.applied == replay(log, settings).applied  # not counted as applied
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    conf = tmp_path / "mixed.conf"
    conf.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(tmp_path / "h"),
                           "--config", str(conf), "audit", "alice@example.org", "--log", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "config@bad:1" in x)
    assert "config PRIORITY_HALFLIFE = -1" in line and "must be" in line


def test_a_multi_partition_events_topic_is_refused(tmp_path: Path, log: list[Envelope],
                                                   settings) -> None:  # type: ignore[no-untyped-def]
    elog = EventLog(EmbeddedLog(tmp_path / "h" / "log"))
    elog.log.create_topic(TopicSpec(EVENTS, 4))
    elog.append(EVENTS, log[:200])
    with pytest.raises(PartitionsError, match=f"{EVENTS} has 4 partitions"):
        EmbeddedRunner(elog, settings).run_once()
    elog.log.close()
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(tmp_path / "h"),
                           "replay"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"poolledger replay: events topic {EVENTS} has 4 partitions: the ledger folds one total order, "
        "so it needs exactly 1 (recreate the topic with one partition)"]


# --- issue 28 (items 5, 6, 9): hostile inputs through the embedded runner and the replay ------

def _hostile(log: list[Envelope]) -> dict[str, tuple[list[bytes], str]]:
    """Each hostile input of issue 28's time and value items, as raw lines inserted into
    `log`, with the text its dead letter's reason holds."""
    t = log[1500].ts
    slot = "slot1@ep77.example.org"

    def ad(seq: int, usn: int, ts: float, **attrs: object) -> bytes:
        return encode(make_event(AdUpdated("Machine", slot, {
            "Name": slot, "Machine": "ep77.example.org", "Cpus": 1, "DaemonStartTime": 1,
            "UpdateSequenceNumber": usn, **attrs}), ts=ts, source="startd@ep77", seq=seq))

    start = next(e for e in log if isinstance(e.data, JobStarted))
    held = next(e for e in reversed(log[:1500]) if isinstance(e.data, JobStarted))
    forged = dict(held.to_dict(), data=dict(held.to_dict()["data"], slot_weight=64))
    # a first version far older than the ledger's window (DIGESTS_KEPT): the log is asked
    old = next(e for e in log[:1500 - 2 * DIGESTS_KEPT] if isinstance(e.data, JobStarted))
    older = dict(old.to_dict(), data=dict(old.to_dict()["data"], slot_weight=32))
    late_start = encode(make_event(start.data, ts=start.ts - 1, source=SCHEDD, seq=10**6))
    stop = encode(make_event(JobStopped(start.data.job_id, start.data.slot, "completed",
                                        start.data.schedd, start.data.submitter),
                             ts=start.ts + 1, source=SCHEDD, seq=10**6 - 1))
    return {
        "clock walk": ([encode(make_event(AdInvalidated("Machine", f"x{i}@evil"), ts=t + 86_000 * i,
                                          source="collector@evil", seq=i)) for i in range(1, 31)],
                       "POOLLEDGER_MAX_EVENT_SKEW"),
        "skew from the log": ([encode(make_event(ConfigChanged("POOLLEDGER_MAX_EVENT_SKEW", "1e300"),
                                                 ts=t, source="config@evil", seq=1))],
                              "administrator's configuration"),
        "late ad": ([ad(2, 9, t), ad(3, 8, t + 1, Cpus=3)], "UpdateSequenceNumber 8 is older"),
        "start after its stop": ([stop, late_start], "a job's lifecycle only moves forward"),
        "huge resource": ([ad(4, 10, t, Memory=1e308)], "data.ad.Memory"),
        # issue 28 item 8: an id already folded, with other content: both versions named
        "conflicting duplicate": ([orjson.dumps(forged)],
                                  f"event {held.id} rejected: a different event with this id was seen "
                                  f"already (content checksum {content_checksum(decode(orjson.dumps(forged))):016x}, "
                                  f"the one seen {content_checksum(held):016x})"),
        "conflicting duplicate beyond the window": (
            [orjson.dumps(older)],
            f"event {old.id} rejected: a different event with this id was seen already (content "
            f"checksum {content_checksum(decode(orjson.dumps(older))):016x}, the one seen "
            f"{content_checksum(old):016x})"),
    }


HOSTILE = ["clock walk", "skew from the log", "late ad", "start after its stop", "huge resource",
           "conflicting duplicate", "conflicting duplicate beyond the window"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_time_and_values_on_the_embedded_runner_and_replay(
        tmp_path: Path, log: list[Envelope], settings, name: str) -> None:  # type: ignore[no-untyped-def]
    lines, why = _hostile(log)[name]
    raw = [encode(e) for e in log]
    raw[1500:1500] = lines
    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec(EVENTS))
    elog.log.create_topic(TopicSpec(DERIVED))
    elog.append_raw(EVENTS, [(None, r, 1.0) for r in raw])
    runner = EmbeddedRunner(elog, settings)
    runner.run_once()
    reasons = [d.reason for d in elog.dead_letters(EVENTS)]
    assert any(why in r for r in reasons), reasons[-3:]
    valid = []
    for r in raw:
        try:
            valid.append(decode(r))
        except EventValidationError:
            pass
    replayed = _replayed(valid, settings)
    assert runner.ledger.to_json() == replayed.to_json()
    assert runner.ledger.now is not None and runner.ledger.now - max(e.ts for e in log) < 86_400
    text = replayed.to_json()
    assert "Infinity" not in text and "NaN" not in text
    elog.log.close()


def _replayed(valid: list[Envelope], settings, **kw: Any) -> Ledger:  # type: ignore[no-untyped-def]
    """`replay` of a log's valid events, its ledger asking them for a first version."""
    ledger = Ledger(settings)
    ledger.first_version = _first_in(valid)
    return replay(valid, settings, ledger=ledger, **kw)


def _every_hostile_input(log: list[Envelope]) -> tuple[list[bytes], list[str]]:
    """One log holding every hostile input of this file (the faust worker takes seconds to
    start, so it folds them all in one run): the mixed log with two neighbours swapped, the
    older reproductions (a far-future event, a huge time, a huge slot weight and limit, an
    invalid knob on the log, a far-ahead seq) and issue 28's inputs. Returns its raw lines
    and the text each input's dead letter holds."""
    raw = [encode(e) for e in log]
    ids = [e.id for e in log]
    i, j = ids.index(f"{SCHEDD}:2"), ids.index(f"{SCHEDD}:3")
    raw[i], raw[j] = raw[j], raw[i]
    whys = []
    for name in HOSTILE:  # issue 28's, one after the other where the log is busy
        lines, why = _hostile(log)[name]
        raw[1500:1500] = lines
        whys.append(why)
    start = next(e for e in log if isinstance(e.data, JobStarted))
    evil = [dict(start.to_dict(), id="schedd@evil:1", source="schedd@evil", seq=1),
            dict(start.to_dict(), id="schedd@evil:2", source="schedd@evil", seq=2)]
    evil[0]["data"] = dict(evil[0]["data"], slot_weight=1e308)
    evil[1]["data"] = dict(evil[1]["data"], concurrency_limits="big:1e999")
    huge_ts = dict(log[5].to_dict(), ts=1e308, id="collector@huge:1", source="collector@huge", seq=1)
    raw[2000:2000] = [orjson.dumps(r) for r in (*evil, huge_ts)]
    whys += ["data.slot_weight", "data.concurrency_limits", "collector@huge:1"]
    future = make_event(AdInvalidated("Machine", "nowhere@example.org"), ts=1e10,
                        source="collector@cm", seq=1)
    raw[1000:1000] = [encode(future)]
    whys.append("event collector@cm:1 rejected: event time 10000000000")
    knob = make_event(ConfigChanged("PRIORITY_HALFLIFE", "-1", "root"), ts=log[100].ts,
                      source="config@bad", seq=1)
    raw[100:100] = [encode(knob)]
    whys.append("event config@bad:1 rejected: ")
    first = log[0]
    raw.append(encode(make_event(first.data, ts=log[-1].ts, source=SCHEDD, seq=999_999_999)))
    return raw, whys


@pytest.mark.kafka
def test_every_hostile_input_folds_alike_on_the_embedded_runner_replay_and_faust(
        kafka_bootstrap: str, tmp_path: Path, log: list[Envelope], settings) -> None:  # type: ignore[no-untyped-def]
    """The whole hostile suite in one log, folded by the embedded runner (restarted midway,
    from its snapshot), the replay and a faust worker on a real broker: byte-identical state
    (`to_json`, the golden digests' document, and `to_snapshot`, the clock's evidence and the
    dedup's content digests included) and the same dead letters, each hostile input's among
    them."""
    raw, whys = _every_hostile_input(log)
    valid, undecodable = [], []
    for r in raw:
        try:
            valid.append(decode(r))
        except EventValidationError as exc:
            undecodable.append(str(exc))
    rejected: list[str] = []
    replayed = _replayed(valid, settings, on_reject=lambda _env, exc: rejected.append(str(exc)))
    assert len(rejected) == replayed.rejected

    elog = EventLog(EmbeddedLog(tmp_path / "log"))
    elog.log.create_topic(TopicSpec(EVENTS))
    elog.log.create_topic(TopicSpec(DERIVED))
    elog.append_raw(EVENTS, [(None, r, 1.0) for r in raw[:1400]])
    EmbeddedRunner(elog, settings).run_once()
    elog.append_raw(EVENTS, [(None, r, 1.0) for r in raw[1400:]])
    embedded = EmbeddedRunner(elog, settings)  # restored from the first one's snapshot
    assert 0 < embedded.events < len(raw)
    embedded.run_once()
    embedded_letters = sorted(d.reason for d in elog.dead_letters(EVENTS))
    elog.log.close()
    assert embedded_letters == sorted(undecodable + rejected)
    for why in whys:
        assert any(why in r for r in embedded_letters), why

    conf = tmp_path / "mixed.conf"
    conf.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    klog = KafkaLog(kafka_bootstrap)
    app_id = f"pl-hostile-{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}.events"
    try:
        klog.create_topic(TopicSpec(topic, 1))
        EventLog(klog).append_raw(topic, [(None, r, 1.0) for r in raw])
        home = tmp_path / "faust"
        home.mkdir()
        worker = _worker(kafka_bootstrap, app_id, topic, conf, home)
        try:
            folded = _wait_applied(kafka_bootstrap, conf, app_id, replayed, 180)
        finally:
            _stop(worker)
        faust_letters = sorted(orjson.loads(r.value)["reason"]
                               for r in klog.read(dlq_topic(topic), 0, 0, 10_000))
    finally:
        klog.close()
    assert folded is not None
    assert folded.to_json() == embedded.ledger.to_json() == replayed.to_json()
    assert folded.to_snapshot() == embedded.ledger.to_snapshot() == replayed.to_snapshot()
    assert faust_letters == embedded_letters
