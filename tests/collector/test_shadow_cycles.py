"""The real negotiator's cycles through the collector endpoint: its Negotiator and Accounting
ads become `negotiation.cycle` events at the moment its accountant updated, so PoolLedger in
htcondor accounting mode agrees with the Accounting ads HTCondor's formulas give (within
AGREEMENT relative), where without them (POOLLEDGER_COLLECTOR_CYCLES = False, the old
behaviour) it drifts."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import classad2
import pytest

from schemas.events import Envelope, JobStarted, JobStopped, NegotiationCycled, make_event
from schemas.settings import load_settings
from services.collector.backend import LedgerCollector
from services.collector.port import Peer
from streams.core.reconcile import COMPARED, relative
from streams.log.embedded import EmbeddedLog
from streams.log.topics import EVENTS, ensure_topics

T0 = 1_763_800_000.0
H = 1000.0  # PRIORITY_HALFLIFE: short, so a cycle moves priorities visibly
NEG = "negotiator@cm.example.org"
PEER = Peer("127.0.0.1", 40000, "tcp", "condor@cm.example.org", "FS", True)
ALICE, BOB = "alice@example.org", "bob@example.org"
#: the agreement we state and test: every compared attribute within this relative difference
AGREEMENT = 1e-6
FACTOR = 1000.0


@dataclass
class _Record:
    priority: float = 0.5
    used: int = 0
    weighted_used: float = 0.0
    uncharged: float = 0.0
    weighted_uncharged: float = 0.0
    accumulated: float = 0.0
    weighted_accumulated: float = 0.0
    begin: float = 0.0
    last: float = 0.0


class HTCondorAccountant:
    """Accountant.cpp's AddMatch, RemoveMatch and UpdatePriorities for plain submitters, by
    REFERENCE.md's formulas: what the real negotiator's Accounting ads report."""

    def __init__(self, t: float) -> None:
        self.last_update = t
        self.records: dict[str, _Record] = {}

    def add_match(self, name: str, weight: float, t: float) -> None:
        r = self.records.setdefault(name, _Record())
        r.used += 1
        r.weighted_used += weight
        r.uncharged -= t - self.last_update
        r.weighted_uncharged -= weight * (t - self.last_update)

    def remove_match(self, name: str, weight: float, started: float, t: float) -> None:
        r = self.records[name]
        r.used -= 1
        r.weighted_used -= weight
        since = t - max(started, self.last_update)
        r.uncharged += since
        r.weighted_uncharged += weight * since

    def update_priorities(self, t: float) -> None:
        d = t - self.last_update
        aging = 0.5 ** (d / H)
        for r in self.records.values():
            rho = r.weighted_used + r.weighted_uncharged / d
            r.priority = max(0.5, r.priority * aging + rho * (1 - aging))
            recent = r.used * d + r.uncharged
            had = r.accumulated
            r.accumulated += recent
            r.weighted_accumulated += r.weighted_used * d + r.weighted_uncharged
            if had <= 0 < r.accumulated:
                r.begin = t
            if recent > 0:
                r.last = t
            r.uncharged = r.weighted_uncharged = 0.0
        self.last_update = t

    def ad(self, name: str) -> classad2.ClassAd:
        """The Accounting ad matchmaker.cpp forwardAccountingData sends: Priority is
        GetPriority(name) (real priority x factor), LastUpdate the accountant's."""
        r = self.records[name]
        return classad2.ClassAd({
            "MyType": "Accounting", "Name": name, "NegotiatorName": NEG,
            "Priority": r.priority * FACTOR, "PriorityFactor": FACTOR,
            "ResourcesUsed": r.used, "WeightedResourcesUsed": r.weighted_used,
            "AccumulatedUsage": r.accumulated, "WeightedAccumulatedUsage": r.weighted_accumulated,
            "BeginUsageTime": int(r.begin), "LastUsageTime": int(r.last),
            "IsAccountingGroup": False, "AccountingGroup": "<none>",
            "LastUpdate": int(self.last_update), "Ceiling": -1, "Floor": 0})


def negotiator_ad(cycles: list[tuple[float, float, float]], seq: int) -> classad2.ClassAd:
    """The Negotiator ad (publishNegotiationCycleStats): per cycle, newest first, its start
    (LastNegotiationCycleTime<i>), its phase 1 (fetching ads; UpdatePriorities follows) and its
    end; the phases' sum is the duration."""
    ad = classad2.ClassAd({"MyType": "Negotiator", "Name": NEG, "NegotiatorName": NEG,
                           "Machine": "cm.example.org", "DaemonStartTime": int(T0),
                           "UpdateSequenceNumber": seq})
    for i, (start, phase1, end) in enumerate(cycles):
        ad[f"LastNegotiationCycleTime{i}"] = int(start)
        ad[f"LastNegotiationCycleDurationPhase1{i}"] = int(phase1)
        ad[f"LastNegotiationCycleEnd{i}"] = int(end)
        ad[f"LastNegotiationCycleDuration{i}"] = int(end - start)
        ad[f"LastNegotiationCycleMatches{i}"] = 0
    return ad


class Shadow:
    """The endpoint's backend on a log, a clock, and the schedds' job events appended to the
    same log (as `poolledger follow` would) in event-time order with the ads."""

    def __init__(self, tmp: Path, **knobs: str) -> None:
        self.now = T0
        log = EmbeddedLog(tmp / "log")
        ensure_topics(log)
        settings = load_settings(config_path=[], env={}, overrides={
            "POOLLEDGER_ACCOUNTING_MODE": "htcondor", "PRIORITY_HALFLIFE": str(H),
            "POOLLEDGER_RECONCILE_TOLERANCE": repr(AGREEMENT), **knobs})
        self.backend = LedgerCollector(log, settings, name="collector@cm.example.org",
                                       clock=lambda: self.now)
        self.seq = 0
        self.neg_seq = 0

    def advertise(self, t: float, command: str, ad: classad2.ClassAd) -> None:
        self.now = t
        self.backend.update(command, ad, None, PEER)
        self.backend.flush()

    def job(self, payload: JobStarted | JobStopped, t: float) -> None:
        self.now = t
        self.seq += 1
        self.backend.flush()
        self.backend.elog.append(EVENTS, [make_event(payload, ts=t, source="schedd@ap.example.org",
                                                     seq=self.seq)])
        self.backend.flush()

    def events(self) -> list[Envelope]:
        return [env for _, env in self.backend.elog.read(EVENTS)]


def _started(name: str, slot: str, weight: float) -> JobStarted:
    return JobStarted(job_id=f"1.{slot}", schedd="schedd@ap.example.org", submitter=name,
                      slot=slot, slot_weight=weight)


def _stopped(name: str, slot: str) -> JobStopped:
    return JobStopped(job_id=f"1.{slot}", slot=slot, reason="completed",
                      schedd="schedd@ap.example.org", submitter=name)


def _run(shadow: Shadow) -> list[tuple[float, dict[str, Any]]]:
    """Five cycles of the real negotiator with jobs starting and stopping between them.
    Cycle 1 and 2 are reported by the Negotiator ad (NEGOTIATOR_UPDATE_AFTER_CYCLE) before the
    Accounting ads; cycle 3 only by the Accounting ads (the Negotiator ad comes every
    NEGOTIATOR_UPDATE_INTERVAL); cycle 4's Accounting ads are lost (UDP) and the Negotiator ad
    after cycle 5 reports cycles 5, 4 and 3 (NEGOTIATION_CYCLE_STATS_LENGTH = 3), with cycle
    3's UpdatePriorities a second after its phase 1 ended; a job starting after cycle 4's
    UpdatePriorities is on the log before cycle 4 (a late cycle). After each cycle's
    Accounting ads, (their time, the reconciliation rows by name)."""
    # UpdatePriorities times: cycle start + phase 1 (the accountant's LastUpdate)
    t1, t2, t3, t4, t5 = (T0 + 10 + 300 * k for k in range(5))
    phase1 = 4.0
    real = HTCondorAccountant(t1)
    seen: list[tuple[float, dict[str, Any]]] = []
    history: list[tuple[float, float, float]] = []

    def cycle(t: float, *, negotiator_ad_after: bool, accounting: bool, late: float = 0.0) -> None:
        if t > real.last_update:
            real.update_priorities(t)
        history.insert(0, (t - phase1 - late, phase1, t + 12))
        del history[3:]
        if negotiator_ad_after:
            shadow.neg_seq += 1
            shadow.advertise(t + 15, "Negotiator", negotiator_ad(history, shadow.neg_seq))
        if accounting:
            for name in sorted(real.records):
                shadow.advertise(t + 16, "Accounting", real.ad(name))
            seen.append((t + 16, {r.name: r for r in shadow.backend.ledger.reconciliation()}))

    cycle(t1, negotiator_ad_after=True, accounting=False)
    shadow.job(_started(ALICE, "s1", 2.0), t1 + 50)
    real.add_match(ALICE, 2.0, t1 + 50)
    shadow.job(_started(BOB, "s2", 1.0), t1 + 70)
    real.add_match(BOB, 1.0, t1 + 70)
    cycle(t2, negotiator_ad_after=True, accounting=True)
    shadow.job(_stopped(ALICE, "s1"), t2 + 100)
    real.remove_match(ALICE, 2.0, t1 + 50, t2 + 100)
    shadow.job(_started(ALICE, "s3", 1.0), t2 + 150)
    real.add_match(ALICE, 1.0, t2 + 150)
    cycle(t3, negotiator_ad_after=False, accounting=True, late=1.0)
    shadow.job(_stopped(BOB, "s2"), t3 + 60)
    real.remove_match(BOB, 1.0, t1 + 70, t3 + 60)
    cycle(t4, negotiator_ad_after=False, accounting=False)
    # a match of cycle 4 starts 5 s after its UpdatePriorities: on the log before cycle 4
    shadow.job(_started(BOB, "s4", 4.0), t4 + 5)
    real.add_match(BOB, 4.0, t4 + 5)
    cycle(t5, negotiator_ad_after=True, accounting=True)
    return seen


def test_real_cycles_make_htcondor_mode_agree_with_the_negotiator(tmp_path: Path) -> None:
    shadow = Shadow(tmp_path)
    seen = _run(shadow)
    t1, t2, t3, t4, t5 = (T0 + 10 + 300 * k for k in range(5))
    evs = shadow.events()
    cycles = [(i, e) for i, e in enumerate(evs) if isinstance(e.data, NegotiationCycled)]
    # one event per real cycle, at its accountant's update time, numbered on, the endpoint's own
    assert [e.data.now for _, e in cycles] == [t1, t2, t3, t4, t5]
    assert all(e.ts == e.data.now and e.source == "collector@cm.example.org"
               and e.data.negotiator == NEG and e.data.submitters == {} for _, e in cycles)
    assert [e.data.cycle for _, e in cycles] == [1, 2, 3, 4, 5]
    # each written just before the ad that reported it (cycles 4 and 5 before one ad)
    reporters = [next(e for e in evs[i + 1:] if e.type != "negotiation.cycle") for i, _ in cycles]
    assert [(r.type, r.data.ad_type) for r in reporters] == [
        ("ad.updated", "Negotiator"), ("ad.updated", "Negotiator"), ("ad.updated", "Accounting"),
        ("ad.updated", "Negotiator"), ("ad.updated", "Negotiator")]
    assert evs[cycles[3][0] + 1] is cycles[4][1]
    assert shadow.backend.ledger.last_priority_update == t5
    assert shadow.backend.ledger.rejected == 0

    _assert_agreement(seen)


def _assert_agreement(seen: list[tuple[float, dict[str, Any]]]) -> None:
    assert len(seen) == 3
    for _at, rows in seen:
        assert set(rows) == {ALICE, BOB}
        for name, row in rows.items():
            assert row.drifting == [], (name, row.ours, row.theirs)
            assert row.ours is not None
            for attr in COMPARED:
                assert abs(relative(row.ours[attr], row.theirs[attr])) <= AGREEMENT, (name, attr)
    # the priorities moved: agreement is not both sides standing still
    for name in (ALICE, BOB):
        prios = [rows[name].theirs["Priority"] for _, rows in seen]
        assert min(prios) > 0.5 and len(set(prios)) == 3, (name, prios)
    assert seen[-1][1][ALICE].theirs["WeightedAccumulatedUsage"] > 0


class WireShadow(Shadow):
    """Shadow with the ads sent by the real htcondor2 client (a subprocess) to the CEDAR
    server in front of the backend."""

    def __init__(self, tmp: Path, port: int, **knobs: str) -> None:
        super().__init__(tmp, **knobs)
        from tests.collector.test_backend_client import Client
        self.client = Client(port, tmp)
        self.sent = 0

    def advertise(self, t: float, command: str, ad: classad2.ClassAd) -> None:
        self.now = t
        self.client.ask(command=f"UPDATE_{command.upper()}_AD", ads=[repr(ad)])
        self.sent += 1
        deadline = time.monotonic() + 30
        while self.backend.commands < self.sent and time.monotonic() < deadline:
            time.sleep(0.001)  # advertise has no acknowledgement: the server is still at it
        assert self.backend.commands == self.sent
        self.backend.flush()


def test_through_the_real_client_and_the_cedar_server(tmp_path: Path) -> None:
    """The same run with the ads sent by htcondor2.Collector.advertise over CEDAR (AES-GCM):
    the same cycles on the log, the same agreement."""
    from tests.collector.cedar_harness import Endpoint

    box: list[WireShadow] = []

    class Late:  # the backend exists once the server's port is known
        def __getattr__(self, name: str) -> Any:
            return getattr(box[0].backend, name)

    with Endpoint(tmp_path, backend=Late()) as ep:  # type: ignore[arg-type]
        shadow = WireShadow(tmp_path, ep.port)
        box.append(shadow)
        try:
            seen = _run(shadow)
        finally:
            shadow.client.close()
        assert ep.refusals() == []
    t1, t2, t3, t4, t5 = (T0 + 10 + 300 * k for k in range(5))
    cycles = [e.data for e in shadow.events() if isinstance(e.data, NegotiationCycled)]
    assert [(c.cycle, c.now) for c in cycles] == list(enumerate([t1, t2, t3, t4, t5], 1))
    _assert_agreement(seen)


def test_without_the_cycle_events_htcondor_mode_drifts(tmp_path: Path) -> None:
    """The old behaviour (no cycle events in shadow mode): the accountant never updates, and
    the reconciliation says so."""
    shadow = Shadow(tmp_path, POOLLEDGER_COLLECTOR_CYCLES="False")
    seen = _run(shadow)
    assert not any(isinstance(e.data, NegotiationCycled) for e in shadow.events())
    final = seen[-1][1]
    for name in (ALICE, BOB):
        assert {"Priority", "EffectivePriority", "AccumulatedUsage",
                "WeightedAccumulatedUsage"} <= set(final[name].drifting), name
        assert final[name].since == seen[0][0]  # drifting since the first report


def test_hostile_and_old_cycle_reports_write_no_cycle(tmp_path: Path) -> None:
    """Cycle times that are not numbers, out of the event time range, older than the
    accountant's last update or later than the ad's arrival by more than
    POOLLEDGER_CLOCK_LEAD: the ad is logged as sent, no cycle is written."""
    shadow = Shadow(tmp_path)
    shadow.advertise(T0 + 100, "Negotiator", negotiator_ad([(T0 + 50, 2, T0 + 60)], 1))
    bad = negotiator_ad([], 2)
    bad["LastNegotiationCycleTime0"] = "yesterday"
    shadow.advertise(T0 + 400, "Negotiator", bad)
    for seq, value in ((3, 1e300), (4, -5.0), (5, True)):
        ad = negotiator_ad([], seq)
        ad["LastNegotiationCycleTime0"] = value
        shadow.advertise(T0 + 400 + seq, "Negotiator", ad)
    old = negotiator_ad([(T0 + 10, 2, T0 + 20)], 6)  # before the cycle already folded
    shadow.advertise(T0 + 500, "Negotiator", old)
    acct = HTCondorAccountant(T0 + 30)
    acct.records[ALICE] = _Record()
    shadow.advertise(T0 + 501, "Accounting", acct.ad(ALICE))  # LastUpdate older too
    forged = HTCondorAccountant(T0 + 502 + 901)  # later than the ad by more than the lead
    forged.records[ALICE] = _Record()
    shadow.advertise(T0 + 502, "Accounting", forged.ad(ALICE))
    later = negotiator_ad([(T0 + 600, 2, T0 + 610)], 7)  # does not hide a real cycle after it
    shadow.advertise(T0 + 620, "Negotiator", later)
    evs = shadow.events()
    assert [e.data.now for e in evs if isinstance(e.data, NegotiationCycled)] == [T0 + 52,
                                                                               T0 + 602]
    assert sum(1 for e in evs if e.type == "ad.updated") == 9
    assert shadow.backend.ledger.rejected == 0


@pytest.mark.parametrize("restart", [False, True])
def test_a_cycle_reported_twice_is_written_once(tmp_path: Path, restart: bool) -> None:
    """The same cycle in the next Negotiator ad, in the Accounting ads (its exact LastUpdate a
    second later than the Negotiator ad's estimate), and after a restart of the endpoint."""
    shadow = Shadow(tmp_path)
    shadow.advertise(T0 + 100, "Negotiator", negotiator_ad([(T0 + 50, 2, T0 + 60)], 1))
    if restart:
        shadow.backend.close()
        shadow.backend.elog.log.close()
        shadow = Shadow(tmp_path)
    shadow.advertise(T0 + 200, "Negotiator", negotiator_ad([(T0 + 50, 2, T0 + 60)], 2))
    acct = HTCondorAccountant(T0 + 53)
    acct.records[ALICE] = _Record()
    shadow.advertise(T0 + 201, "Accounting", acct.ad(ALICE))
    shadow.advertise(T0 + 400, "Negotiator",
                     negotiator_ad([(T0 + 350, 2, T0 + 360), (T0 + 50, 2, T0 + 60)], 3))
    cycles = [e.data for e in shadow.events() if isinstance(e.data, NegotiationCycled)]
    assert [(c.cycle, c.now) for c in cycles] == [(1, T0 + 52), (2, T0 + 352)]


def test_a_cycle_folded_after_later_starts_updates_as_if_folded_in_time_order() -> None:
    """htcondor mode: a `negotiation.cycle` at t folded after jobs that started after t (the
    real negotiator's cycle, reported once its matches ran) charges them from their start
    after t, as UpdatePriorities at t did not see them: the same accountant as the events in
    time order, groups and their ancestors included."""
    from schemas.events import Payload
    from streams.core.ledger import Ledger

    settings = load_settings(config_path=[], env={}, overrides={
        "POOLLEDGER_ACCOUNTING_MODE": "htcondor", "PRIORITY_HALFLIFE": str(H),
        "GROUP_NAMES": "group_a, group_a.sub", "GROUP_QUOTA_group_a": "4"})
    user = "group_a.sub.bob@example.org"

    def env(p: Payload, t: float, source: str, seq: int) -> Envelope:
        return make_event(p, ts=t, source=source, seq=seq)

    def cyc(t: float, n: int) -> Envelope:
        return env(NegotiationCycled(negotiator=NEG, cycle=n, now=t), t, "collector", n)

    jobs = [env(_started(ALICE, "s1", 2.0), T0 + 100, "ap", 1),
            env(_started(user, "s2", 3.0), T0 + 410, "ap", 2),
            env(_started(ALICE, "s3", 1.0), T0 + 420, "ap", 3)]
    in_order = [cyc(T0, 1), jobs[0], cyc(T0 + 400, 2), jobs[1], jobs[2], cyc(T0 + 700, 3)]
    late = [cyc(T0, 1), jobs[0], jobs[1], jobs[2], cyc(T0 + 400, 2), cyc(T0 + 700, 3)]
    ledgers = []
    for evs in (in_order, late):
        led = Ledger(settings)
        views = []
        for e in evs:
            led.apply(e)
            if e.type == "negotiation.cycle":
                views.append(led.priorities(e.ts, all_groups=True))
        ledgers.append(views)
    assert len(ledgers[0]) == 3 and ledgers[0][2][user]["ResourcesUsed"] == 1
    charged = ("Priority", "AccumulatedUsage", "WeightedAccumulatedUsage")
    for ours, theirs in zip(*ledgers, strict=True):  # what each cycle charged
        for name in theirs:
            want = ours.get(name, {"Priority": 0.5, "AccumulatedUsage": 0.0,
                                   "WeightedAccumulatedUsage": 0.0})
            for attr in charged:
                assert theirs[name][attr] == pytest.approx(want[attr], rel=1e-12, abs=1e-12), \
                    (name, attr)
    ours, theirs = ledgers[0][-1], ledgers[1][-1]
    assert set(ours) == set(theirs)
    for name in ours:
        for attr in (*charged, "ResourcesUsed", "WeightedResourcesUsed",
                     "HierWeightedResourcesUsed"):
            assert theirs[name].get(attr, 0.0) == pytest.approx(ours[name].get(attr, 0.0),
                                                                rel=1e-12, abs=1e-12), (name, attr)
    assert theirs["group_a"]["Priority"] > 0.5 and theirs[user]["Priority"] > 0.5
