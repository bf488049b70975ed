"""The sink target port's contract (streams/sink.py `Target`), run unchanged on every target.

What the `SinkRunner` relies on, clause by clause (each test names its clause):

1. `name` names the consumer group and DLQ; `topics` is a non-empty tuple of log topics.
2. `deliver` returns once the store holds every item it did not refuse; each item once.
3. Re-delivering items already acknowledged, in the same or any other batching (the runner
   restarts from its last checkpoint, with other batch boundaries), stores each item once.
4. A refusal names one item of the batch and the target's reason; the rest of the batch is
   stored: an item is refused alone, never lost silently.
5. An empty batch is valid (the positions move past dead-lettered records): nothing is
   stored, and a target keeping its own positions keeps the new ones.
6. A target keeping its own positions (`positions()` not None) answers the last `upto` it
   acknowledged.
7. A service that is down makes `deliver` raise `TargetUnavailableError` having
   acknowledged nothing: the store and the positions are as before; the same batch delivered
   once the service is back is stored once.
8. A restarted target (another one over the same store) resumes no further than what was
   acknowledged: its positions never pass an item the store does not hold.
9. `close` leaves no thread of the target running.
10. A `StagedTarget`'s `stage` writes nothing; `deliver_staged` of it stores the batch.
11. On the runner: every event stored once, lag 0; a runner restarted over the same store
    stores nothing twice.
12. On the runner: while the service is down the checkpoint stays where it was.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

import pytest

from schemas.events import Envelope, encode
from streams.log.embedded import EmbeddedLog
from streams.log.events import ensure_topics
from streams.log.topics import EVENTS
from streams.sink import (Positions, Rejection, SinkError, SinkItem, SinkRunner, StagedTarget,
                          Target, TargetUnavailableError, sink_group)
from tests.contract.sink_targets import Subject


def items_of(envs: Sequence[Envelope]) -> list[SinkItem]:
    """The events as the runner hands them over: the events topic, partition 0, offsets from 0."""
    return [SinkItem(EVENTS, 0, k, env) for k, env in enumerate(envs)]


def upto_after(items: Sequence[SinkItem]) -> Positions:
    return {EVENTS: {0: items[-1].offset + 1}} if items else {EVENTS: {0: 0}}


def deliver(target: Target, items: Sequence[SinkItem]) -> list[Rejection]:
    return target.deliver(list(items), upto_after(items))


def own_positions(target: Target) -> Positions | None:
    pos = target.positions()
    return None if pos is None else {t: dict(p) for t, p in pos.items() if p}


def needs_service(subject: Subject) -> None:
    if subject.down is None:
        pytest.skip(f"{subject.kind}: an embedded store, no service to be down")


# --------------------------------------------------------------------------- the target alone


def test_1_names_its_group_and_the_topics_it_reads(subject: Subject) -> None:
    target = subject.make()
    assert isinstance(target.name, str) and target.name and not any(c.isspace() for c in target.name)
    assert sink_group(target.name) == f"poolledger.sink.{target.name}"
    assert isinstance(target.topics, tuple) and target.topics
    assert all(isinstance(t, str) and t for t in target.topics)
    target.close()


def test_2_an_acknowledged_batch_is_in_the_store_once_each(subject: Subject) -> None:
    envs = subject.events(0, 10)
    target = subject.make()
    assert deliver(target, items_of(envs)) == []
    assert subject.stored() == subject.expected(envs) != {}
    target.close()


def test_3_re_delivery_in_any_batching_stores_each_item_once(subject: Subject) -> None:
    envs = subject.events(0, 10)
    items = items_of(envs)
    target = subject.make()
    assert deliver(target, items) == []
    assert deliver(target, items) == []  # the same batch again: a checkpoint lost after the ack
    for lo, hi in ((0, 3), (2, 7), (5, 10)):  # overlapping, other boundaries: a restarted runner
        assert deliver(target, items[lo:hi]) == []
    assert subject.stored() == subject.expected(envs)
    target.close()


def test_4_a_refused_item_is_refused_alone_with_the_targets_reason(subject: Subject) -> None:
    good = subject.events(0, 6)
    hostile = [] if subject.hostile is None else [subject.hostile]
    envs = [*good[:3], *hostile, *good[3:]]
    items = items_of(envs)
    target = subject.make()
    rejections = deliver(target, items)
    for r in rejections:
        assert any(r.item is it for it in items), r  # names an item of the batch
        assert isinstance(r.reason, str) and r.reason.strip(), r
    refused = [r.item.event.id for r in rejections]
    assert refused == ([e.id for e in hostile] if subject.refuses else [])  # alone, once
    kept = [e for e in envs if e.id not in refused]
    assert subject.stored() == subject.expected(kept)
    if hostile and not subject.refuses:  # not refused: then in the store, never dropped
        assert subject.expected(hostile), f"{subject.kind} neither refused nor stored {hostile[0].id}"
    target.close()


def test_5_an_empty_batch_moves_only_the_positions(subject: Subject) -> None:
    envs = subject.events(0, 4)
    target = subject.make()
    assert deliver(target, items_of(envs)) == []
    before = subject.stored()
    assert target.deliver([], {EVENTS: {0: 9}}) == []  # five dead-lettered records passed
    assert subject.stored() == before
    pos = own_positions(target)
    assert pos is None or pos == {EVENTS: {0: 9}}
    target.close()


def test_6_own_positions_are_the_last_upto_acknowledged(subject: Subject) -> None:
    items = items_of(subject.events(0, 8))
    target = subject.make()
    for lo, hi in ((0, 3), (3, 8)):
        assert deliver(target, items[lo:hi]) == []
        pos = own_positions(target)
        assert pos is None or pos == upto_after(items[lo:hi])
    target.close()


def test_7_a_down_service_raises_unavailable_and_acknowledges_nothing(subject: Subject) -> None:
    needs_service(subject)
    assert subject.down is not None
    envs = subject.events(0, 6)
    items = items_of(envs)
    up = subject.make()
    assert deliver(up, items[:2]) == []
    stored, pos = subject.stored(), own_positions(up)
    up.close()
    down = subject.down()
    before = own_positions(down)
    with pytest.raises(TargetUnavailableError) as caught:
        deliver(down, items[2:])
    assert isinstance(caught.value, SinkError) and str(caught.value)
    assert subject.stored() == stored
    assert own_positions(down) == before
    down.close()
    back = subject.make()  # the service is back: delivery resumes where the target says
    own = own_positions(back)
    resume = 2 if own is None else own.get(EVENTS, {}).get(0, 0)
    assert resume <= 2  # never past what was acknowledged (clause 8)
    assert deliver(back, items[resume:]) == []
    assert subject.stored() == subject.expected(envs)
    back.close()


def test_8_a_restarted_target_resumes_no_further_than_acknowledged(subject: Subject) -> None:
    envs = subject.events(0, 8)
    items = items_of(envs)
    first = subject.make()
    assert deliver(first, items[:5]) == []
    first.close()
    again = subject.make()
    pos = own_positions(again)
    if pos is not None:
        resume = pos.get(EVENTS, {}).get(0, 0)
        assert resume <= 5
        assert subject.stored() >= subject.expected(envs[:resume])
    assert deliver(again, items[5:] if pos is not None else items) == []
    again.close()


def test_9_close_leaves_no_thread_of_the_target_running(subject: Subject) -> None:
    before = set(threading.enumerate())
    target = subject.make()
    assert deliver(target, items_of(subject.events(0, 5))) == []
    target.close()
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    for t in left:
        t.join(5)
    assert [t.name for t in left if t.is_alive()] == []


def test_10_a_staged_target_stages_without_writing(subject: Subject) -> None:
    target = subject.make()
    if not isinstance(target, StagedTarget):
        target.close()
        pytest.skip(f"{subject.kind} is not a StagedTarget")
    envs = subject.events(0, 6)
    items = items_of(envs)
    before = subject.stored()
    staged: Any = target.stage(items)
    assert subject.stored() == before
    assert target.deliver_staged(staged, upto_after(items)) == []
    assert subject.stored() == subject.expected(envs)
    target.close()


# --------------------------------------------------------------------------- on the runner


def _log(tmp_path: Path, envs: list[Envelope]) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    ensure_topics(log)
    log.append(EVENTS, [(None, encode(e), e.ts) for e in envs])
    return log


def _runner(log: EmbeddedLog, target: Target, **kw: Any) -> SinkRunner:
    return SinkRunner(log, target, batch=4, progress=False,
                      lean=getattr(target, "LEAN", frozenset()), **kw)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_11_on_the_runner_every_event_is_stored_once(subject: Subject, tmp_path: Path,
                                                     overlap: bool) -> None:
    envs = subject.events(0, 10)
    log = _log(tmp_path, envs)
    try:
        runner = _runner(log, subject.make(), overlap=overlap)
        report = runner.run_once()
        assert (report.delivered, report.rejected, report.lag) == (len(envs), 0, 0)
        runner.close()
        assert subject.stored() == subject.expected(envs)
        again = _runner(log, subject.make(), overlap=overlap)
        assert again.run_once().lag == 0
        again.close()
        assert subject.stored() == subject.expected(envs)
    finally:
        log.close()


def test_12_on_the_runner_the_checkpoint_holds_while_the_service_is_down(
        subject: Subject, tmp_path: Path) -> None:
    needs_service(subject)
    assert subject.down is not None
    envs = subject.events(0, 6)
    log = _log(tmp_path, envs)
    try:
        runner = _runner(log, subject.down(), backoff=0.05, max_backoff=0.1, give_up_after=0.3)
        with pytest.raises(TargetUnavailableError):
            runner.run_once()
        assert runner.positions() == {EVENTS: {}} or runner.positions() == {EVENTS: {0: 0}}
        assert log.committed(runner.group, EVENTS) in ({}, {0: 0})
        assert subject.stored() == {}
        runner.close()
        back = _runner(log, subject.make())
        assert back.run_once().delivered == len(envs)
        back.close()
        assert subject.stored() == subject.expected(envs)
    finally:
        log.close()
