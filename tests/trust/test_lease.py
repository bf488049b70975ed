"""Issue 28, item 15: the standby negotiator's lease on the embedded log has a deadline.

A stopped (SIGSTOP) active negotiator stops renewing it, so the standby takes over; resumed,
the ex-leader finds the lease's epoch moved on before it appends (fenced); and a forged
`negotiation.cycle` (cycle 2**63-1, `now` in 9999) is refused by the contract and
dead-lettered instead of making the next cycle due in 9999.
"""
from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from schemas.errors import EventValidationError
from schemas.events import AdInvalidated, NegotiationCycled, decode, encode, make_event
from schemas.settings import load_settings
from services.negotiator.daemon import NegotiatorDaemon
from services.pooldriver import PoolDriver
from streams.log.events import EventLog, open_log
from streams.log.lease import FileLease, LeaseLostError
from streams.log.port import TopicSpec
from streams.log.topics import EVENTS, dlq_topic
from tests.e2e.test_standby import NAME, SCENARIO, Negotiator, start_negotiators, stop

T0 = 1763800000.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_not_renewed_lapses_and_the_old_holder_is_fenced(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "leases" / "n.lease"
    active, standby = FileLease(path, timeout=6, clock=clock), FileLease(path, timeout=6, clock=clock)
    try:
        assert active.held() and not standby.held()
        clock.now += 5  # renewed within the timeout: still the active one's
        assert active.held() and not standby.held()
        clock.now += 6.5  # the active one stopped renewing (SIGSTOP): the lease lapses
        assert standby.held()
        assert standby.epoch == active.epoch + 1 if active.epoch is not None else False
        with standby.fence():
            pass
        with pytest.raises(LeaseLostError, match="was taken over by .* at epoch 2"):
            with active.fence():  # resumed: refused before it appends
                raise AssertionError("a stale holder's append ran")
        assert not active.held()
        standby.release()  # a clean stop hands the lease on at once
        assert active.held()
    finally:
        active.release()
        standby.release()


stopped_at: list[float] = []  # wall clock of the SIGSTOP


def _drive_and_stop_the_active(home: Path, stop_at: int) -> tuple[list[NegotiationCycled],
                                                                     list[Negotiator], Negotiator]:
    log = open_log(None, home)
    log.create_topic(TopicSpec(EVENTS, 1))
    negotiators = start_negotiators(2, ["--home", str(home), "--set",
                                        "POOLLEDGER_LEASE_TIMEOUT=2"], EVENTS)
    stopped: list[Negotiator] = []
    stopped_at.clear()

    def stop_active() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for neg in negotiators:
                if any(f": cycle {stop_at} " in ln for ln in list(neg.lines)):
                    os.kill(neg.proc.pid, signal.SIGSTOP)
                    stopped_at.append(time.monotonic())
                    stopped.append(neg)
                    other = next(n for n in negotiators if n is not neg)
                    while time.monotonic() < deadline and not other.cycles():
                        time.sleep(0.01)
                    time.sleep(0.5)
                    os.kill(neg.proc.pid, signal.SIGCONT)  # resumed while the standby leads
                    return
            time.sleep(0.01)

    try:
        threading.Thread(target=stop_active, daemon=True).start()
        driver = PoolDriver(SCENARIO, seed=0, settings=load_settings(overrides={}), log=log,
                            negotiator=NAME, topic=EVENTS, derived_topic=None, patience=60.0)
        driver.run(0.5)
    finally:
        stop(negotiators)
    try:
        cycles = [e.data for _, e in EventLog(log).read(EVENTS)
                  if isinstance(e.data, NegotiationCycled)]
    finally:
        log.close()
    assert stopped, "no negotiator reached the cycle to stop at"
    return cycles, negotiators, stopped[0]


def test_sigstop_of_the_active_negotiator_hands_the_lease_to_the_standby(tmp_path: Path) -> None:
    cycles, negotiators, stopped = _drive_and_stop_the_active(tmp_path, 5)
    numbers = [c.cycle for c in cycles]
    assert numbers == list(range(1, 32))  # none reused, none skipped, none missing
    standby = next(n for n in negotiators if n is not stopped)
    theirs, mine = stopped.cycles(), standby.cycles()
    assert theirs[:5] == [1, 2, 3, 4, 5] and mine and mine[0] > 5
    assert not set(theirs) & set(mine) and sorted(theirs + mine) == numbers
    since = standby.active_since()
    assert since is not None
    assert since > stopped_at[0]
    print(f"takeover: the standby active {since - stopped_at[0]:.1f} s of wall clock after "
          "the SIGSTOP (POOLLEDGER_LEASE_TIMEOUT=2)")
    # resumed, the ex-leader learnt it had lost the lease and stood by
    assert f"{NAME}: standing by" in stopped.lines[stopped.lines.index(
        next(ln for ln in stopped.lines if ": cycle 5 " in ln)):]


def _forged_cycle() -> bytes:
    return orjson.dumps({"id": "forger:1", "type": "negotiation.cycle", "v": 1, "ts": T0 + 60,
                         "source": NAME, "seq": 1,
                         "data": {"negotiator": NAME, "cycle": 2**63 - 1,
                                  "now": 253402300000.0}})


def test_a_forged_cycle_is_refused_by_the_contract() -> None:
    with pytest.raises(EventValidationError, match="data.cycle"):
        decode(_forged_cycle())
    sane_number = orjson.loads(_forged_cycle())
    sane_number["data"]["cycle"] = 3
    with pytest.raises(EventValidationError, match="data.now.*not its event time"):
        decode(orjson.dumps(sane_number))
    ok = make_event(NegotiationCycled(NAME, 3, T0 + 60), ts=T0 + 60, source=NAME, seq=1)
    assert decode(encode(ok)) == ok


def test_a_forged_cycle_is_dead_lettered_not_followed(tmp_path: Path) -> None:
    log = open_log(None, tmp_path)
    try:
        log.create_topic(TopicSpec(EVENTS, 1))
        elog = EventLog(log)
        elog.append(EVENTS, [make_event(AdInvalidated("Machine", "slot1@ep"), ts=T0,
                                        source="collector@cm", seq=1)])
        log.append(EVENTS, [(None, _forged_cycle(), T0 + 60)])  # raw: as a forger writes it
        daemon = NegotiatorDaemon(log, load_settings(overrides={}),
                                  FileLease(tmp_path / "n.lease"), name=NAME,
                                  record_durations=False)
        daemon.follow()
        assert daemon.last_cycle == 0 and daemon.next_due is None
        assert daemon.due() == T0  # the first cycle at the log's time, not in 9999
        assert log.end_offsets(dlq_topic(EVENTS)) == {0: 1}
    finally:
        log.close()


# --- round 3: a holder stopped inside the guard, and a fold longer than the timeout ---------

def test_a_holder_stopped_inside_the_guard_lock_does_not_block_the_takeover(tmp_path: Path) -> None:
    """The active one is stopped in the milliseconds it holds the lease file's guard lock (a
    flock of its own open file, here another descriptor of this process): the lease still
    lapses and the standby takes it, within the guard's short wait; resumed, the ex-holder is
    fenced."""
    clock = Clock()
    path = tmp_path / "leases" / "n.lease"
    active, standby = FileLease(path, timeout=6, clock=clock), FileLease(path, timeout=6, clock=clock)
    guard = os.open(path, os.O_RDWR)
    try:
        assert active.held()
        fcntl.flock(guard, fcntl.LOCK_EX)  # stopped inside the guard, for good
        clock.now += 6.5
        began = time.monotonic()
        assert standby.held()
        assert time.monotonic() - began < 2.0  # the guard's wait, not for ever
        with standby.fence():
            pass
        fcntl.flock(guard, fcntl.LOCK_UN)  # resumed
        with pytest.raises(LeaseLostError, match="was taken over"):
            with active.fence():
                raise AssertionError("a stale holder's append ran")
    finally:
        os.close(guard)
        active.release()
        standby.release()


def test_a_fold_longer_than_the_lease_timeout_keeps_the_lease(tmp_path: Path) -> None:
    """The active negotiator folds 5,000 events that take 50 s of the lease's clock (timeout
    6 s): it renews the lease as the fold goes, so a standby cannot take it meanwhile."""
    log = open_log(None, tmp_path)
    log.create_topic(TopicSpec(EVENTS, 1))
    EventLog(log).append(EVENTS, [
        make_event(AdInvalidated("Machine", f"s{i % 40}@ep.example.org"), ts=T0 + i,
                   source=f"collector@cm{i % 2}", seq=i // 2 + 1) for i in range(5000)])
    clock = Clock()
    path = tmp_path / "leases" / "n.lease"
    active, standby = FileLease(path, timeout=6, clock=clock), FileLease(path, timeout=6, clock=clock)
    try:
        daemon = NegotiatorDaemon(log, load_settings(overrides={}), active, name=NAME)
        assert active.held()
        fold = daemon._fold

        def slow_fold(env):  # type: ignore[no-untyped-def]
            clock.now += 0.01  # 10 ms of the lease's clock per event
            fold(env)

        daemon._fold = slow_fold  # type: ignore[method-assign]
        assert daemon.follow() == 5000
        assert clock.now >= 1000.0 + 49.0
        assert not standby.held()  # renewed during the fold: still the active one's
        assert active.held()
    finally:
        active.release()
        standby.release()
        log.close()
