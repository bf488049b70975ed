"""Determinism of the two-core cycle: NEGOTIATOR_WORKERS 2 sorts the job queues of a large
cycle in a forked child too (when a core is idle), and must decide exactly what one core
decides (matches in order, dynamic slots, rejections with their reasons, statistics), and fail
the same way on bad input.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

import pytest

from services.negotiator import (
    CycleInput,
    InvalidInputError,
    NegotiatorConfig,
    negotiate,
)
from services.negotiator import matchmaker
from tests.negotiator.test_golden_matches import generated_cycle, outcome


def big_cycle(seed: int, groups: bool) -> CycleInput:
    """A cycle with enough idle jobs for the two-core path (and groups, preemption, pslots)."""
    return generated_cycle(seed, 600, matchmaker._PARALLEL_MIN_JOBS + 4000, 120, 24, groups)


@pytest.fixture(autouse=True)
def idle_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else runs on the machine: a cycle uses the second core only when one is
    idle, and these tests are about that path."""
    monkeypatch.setattr(matchmaker, "_spare_core", lambda: True)


@pytest.mark.parametrize("groups,preempt", [(False, True), (True, True), (False, False)])
def test_two_cores_decide_exactly_as_one(groups: bool, preempt: bool) -> None:
    """Both the queue sort and the match lists built ahead by the child (with priority
    preemption, and without it, where the claimed slots are one class per list)."""
    snap = big_cycle(17 if groups else 19, groups)
    knobs: dict[str, Any] = {"preemption_requirements": "True"} if preempt else {}
    serial = negotiate(snap, NegotiatorConfig(negotiator_workers=1, **knobs))
    parallel = negotiate(snap, NegotiatorConfig(negotiator_workers=2, **knobs))
    assert serial.counters["queue_workers"] == serial.counters["match_workers"] == 1
    assert parallel.counters["queue_workers"] == parallel.counters["match_workers"] == 2
    assert serial.counters["prefetched"] == 0
    assert len(serial.matches) > 300 and serial.rejections
    if preempt:
        assert {m.reason for m in serial.matches} >= {"NoPreemption", "Priority"}
    else:
        assert {r for x in serial.rejections for r in x.reasons} >= {
            "insufficient priority", "PREEMPTION_REQUIREMENTS == False"}
    want = json.loads(json.dumps(outcome(serial)))
    got = json.loads(json.dumps(outcome(parallel)))
    for key in ("matches", "dynamic_slots", "rejections", "submitters", "pool_size"):
        assert got[key] == want[key], key
    assert [r.attributes for r in parallel.rejections] == \
        [r.attributes for r in serial.rejections]


def test_bad_job_ad_in_the_forked_half_fails_as_on_one_core() -> None:
    """A job ad the cycle cannot read, in the queues the child sorts: the same one-line
    error as one core gives, raised in the parent."""
    snap = big_cycle(23, False)
    jobs = {name: list(ads) for name, ads in snap.jobs.items()}
    last = list(jobs)[-1]
    jobs[last][5] = {**jobs[last][5], "Weird": b"\x00"}
    snap = dataclasses.replace(snap, jobs=jobs)
    errors = []
    for workers in (1, 2):
        with pytest.raises(InvalidInputError) as exc:
            negotiate(snap, NegotiatorConfig(negotiator_workers=workers))
        errors.append(str(exc.value))
    assert errors[0] == errors[1] == "attribute Weird: unsupported value bytes"


def test_unknown_submitter_fails_as_on_one_core() -> None:
    snap = big_cycle(29, False)
    jobs = dict(snap.jobs)
    jobs["nobody@example.org"] = list(jobs[next(iter(jobs))][:3])
    snap = dataclasses.replace(snap, jobs=jobs)
    for workers in (1, 2):
        with pytest.raises(InvalidInputError, match="unknown submitter nobody@example.org"):
            negotiate(snap, NegotiatorConfig(negotiator_workers=workers))


def test_match_list_child_failing_midway_decides_as_one_core(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Each child building match lists ahead dies after a few: this process builds the
    rest (and forks the next child further on), to the same decisions."""
    snap = big_cycle(31, False)
    serial = negotiate(snap, NegotiatorConfig(negotiator_workers=1))
    parent, built = os.getpid(), [0]
    real_build = matchmaker._Engine.build

    def failing(self: matchmaker._Engine, req: Any, submitter: str, eup: float) -> None:
        if os.getpid() == parent:
            threading.Event().wait(0.02)  # slow here: the child's first lists are taken
        else:
            built[0] += 1
            if built[0] > 5:
                raise MemoryError("the child ran out")
        real_build(self, req, submitter, eup)

    monkeypatch.setattr(matchmaker._Engine, "build", failing)
    parallel = negotiate(snap, NegotiatorConfig(negotiator_workers=2))
    assert parallel.counters["match_workers"] == 2
    assert parallel.counters["prefetched"] > 0
    assert json.loads(json.dumps(outcome(parallel))) == json.loads(json.dumps(outcome(serial)))


def test_match_lists_taken_from_the_child_decide_as_one_core(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Builds here made slow (as under a busy core): the child's lists are taken, most of
    them (how many depends on the scheduler), and the decisions are one core's."""
    snap = big_cycle(37, False)
    serial = negotiate(snap, NegotiatorConfig(negotiator_workers=1))
    parent = os.getpid()
    real_build = matchmaker._Engine.build

    def slow_here(self: matchmaker._Engine, req: Any, submitter: str, eup: float) -> None:
        if os.getpid() == parent:
            threading.Event().wait(0.02)
        real_build(self, req, submitter, eup)

    monkeypatch.setattr(matchmaker._Engine, "build", slow_here)
    parallel = negotiate(snap, NegotiatorConfig(negotiator_workers=2))
    assert parallel.counters["prefetched"] > 0
    assert json.loads(json.dumps(outcome(parallel))) == json.loads(json.dumps(outcome(serial)))
