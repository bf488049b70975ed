"""The collector endpoint's backend called directly (no wire): updates onto the log, heartbeats
that do not grow it while expiry and update statistics stay exact, private attributes kept out,
queries evaluated by classad2 as condor_collector does, GET_PRIORITY from the ledger."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import classad2
import pytest

from schemas.events import AdsRefreshed, AdUpdated
from schemas.settings import load_settings
from services.collector.backend import LedgerCollector
from services.collector.port import CommandRefusedError, Peer
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS, ensure_topics
from streams.runner import EmbeddedRunner

T0 = 1763800000.0
PEER = Peer("127.0.0.1", 40000, "tcp", None, None, True)


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(tmp: Path, clock: Clock, **knobs: str) -> LedgerCollector:
    log = EmbeddedLog(tmp / "log")
    ensure_topics(log)
    settings = load_settings(config_path=[], env={}, overrides=knobs)
    return LedgerCollector(log, settings, name="collector@cm.example", clock=clock)


def slot(name: str, **attrs: Any) -> classad2.ClassAd:
    ad = classad2.ClassAd({"MyType": "Machine", "Name": name, "Machine": name.split("@")[-1],
                           "Cpus": 4, "Memory": 8192, "State": "Unclaimed", "LoadAvg": 0.0,
                           "DaemonStartTime": int(T0), **attrs})
    ad["Start"] = classad2.ExprTree("TARGET.RequestCpus <= MY.Cpus")
    return ad


def answer(b: LedgerCollector, ad_type: str | None, q: classad2.ClassAd) -> list[classad2.ClassAd]:
    """The backend's answer as the client reads it off the wire."""
    return [r.to_classad() for r in b.query(ad_type, q, PEER)]


def events(b: LedgerCollector) -> list[Any]:
    return [env for _, env in b.elog.read(EVENTS)]


# --- heartbeats ---------------------------------------------------------------------------


def test_heartbeats_do_not_grow_the_log_yet_expiry_and_update_stats_are_exact(tmp_path: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock)
    names = [f"slot{i}@ep{i % 4}.example" for i in range(20)]
    quiet, lossy, restarted, changing = names[0], names[1], names[2], names[3]
    sent: dict[str, list[tuple[int, int]]] = {n: [] for n in names}  # (DaemonStartTime, seq)
    last_ad: dict[str, classad2.ClassAd] = {}
    heard: dict[str, float] = {}
    updates = 0
    useq = dict.fromkeys(names, 0)
    start = dict.fromkeys(names, int(T0))
    for step in range(0, 61):  # one hour in minutes
        clock.t = T0 + 60 * step
        if step % 5 == 0:  # every slot's UPDATE_INTERVAL of 300 s
            for i, n in enumerate(names):
                if n == quiet and clock.t > T0 + 1200:
                    continue  # its startd died after 20 minutes
                useq[n] += 1
                if n == lossy and step in (10, 20, 25):
                    useq[n] += 2  # two updates lost on the way (UDP)
                if n == restarted and step == 30:
                    start[n], useq[n] = int(clock.t), 1  # the startd restarted
                state = "Claimed" if n == changing and step >= 15 else "Unclaimed"
                ad = slot(n, LoadAvg=step / 100 + i, MyCurrentTime=int(clock.t),
                          UpdateSequenceNumber=useq[n], DaemonStartTime=start[n], State=state)
                b.update("Machine", ad, None, PEER)
                sent[n].append((start[n], useq[n]))
                last_ad[n] = ad
                heard[n] = clock.t
                updates += 1
        if step == 35:  # probes of the fold's clock around the quiet slot's deadline
            for t in (T0 + 1200 + 900 - 1, T0 + 1200 + 900 + 1):
                clock.t = t
                b.update("Scheduler", classad2.ClassAd({"MyType": "Scheduler", "Name": "ap@x",
                                                         "TotalIdleJobs": int(t)}), None, PEER)
                b.flush()
                gone = b.ledger.collector_ad("Machine", quiet) is None
                assert gone == (t > T0 + 1200 + 900), (t, gone)  # exactly the collector's
            clock.t = T0 + 60 * step
        b.tick()
    b.close()

    logged = events(b)
    full = [e for e in logged if isinstance(e.data, AdUpdated) and e.data.ad_type == "Machine"]
    refreshes = [r for e in logged if isinstance(e.data, AdsRefreshed) for r in e.data.refreshes]
    assert updates == 20 * 13 - 8
    # one whole ad per slot, plus the changes that matter (the state change, the restart)
    assert len(full) == 20 + 1 + 1, [e.data.name for e in full]
    # the heartbeats: a few entries per slot, not one per heartbeat, in a few events
    assert len(refreshes) <= updates // 2
    assert len(logged) < updates // 4

    ledger = EmbeddedRunner(EventLog(b.elog.log), b.ledger.settings, derived_topic=None,
                            start={0: 0})
    ledger.fold()
    folded = ledger.ledger
    stats = folded.update_stats()
    for n in names:
        # condor_updates_stats' numbers, computed as collector_stats.cpp does
        lost = sum(new - old - 1 for (s0, old), (s1, new) in zip(sent[n], sent[n][1:])
                   if s0 == s1 and new > old + 1)
        st = stats[f"Machine/{n}"]
        assert (st.received, st.lost) == (len(sent[n]), lost), n
        rec = folded.collector_ad("Machine", n)
        if n == quiet:
            assert rec is None
            continue
        assert rec is not None
        # the fold holds each ad as last heard (volatile attributes included) and expires it
        # one lifetime after it was last heard
        assert rec.expires == heard[n] + 900 and rec.updated == heard[n]
        assert {k: rec.ad[k] for k in last_ad[n].keys() if k != "Start"} == \
            {k: last_ad[n][k] for k in last_ad[n].keys() if k != "Start"}, n
    assert stats[f"Machine/{lossy}"].lost == 6


def test_a_restarted_backend_continues_each_ads_sequence(tmp_path: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock)
    for seq in (1, 2, 3):
        clock.t += 300
        b.update("Machine", slot("slot1@r", UpdateSequenceNumber=seq, LoadAvg=seq / 10), None, PEER)
        b.tick()
    b.close()
    b.elog.log.close()
    b = backend(tmp_path, clock)
    clock.t += 300
    b.update("Machine", slot("slot1@r", UpdateSequenceNumber=6, LoadAvg=0.6), None, PEER)
    clock.t += 300  # the startd restarted: numbering starts again, nothing lost
    b.update("Machine", slot("slot1@r", UpdateSequenceNumber=1, DaemonStartTime=int(clock.t)),
             None, PEER)
    b.close()
    st = b.ledger.update_stats()["Machine/slot1@r"]
    assert (st.received, st.lost) == (5, 2)
    ids = [e.id for e in events(b)]
    assert len(ids) == len(set(ids))


# --- private attributes -------------------------------------------------------------------


def test_private_attributes_never_reach_the_log_or_a_query(tmp_path: Path) -> None:
    b = backend(tmp_path, Clock())
    secrets = {"ClaimId": "<10.0.0.1:9618>#1#1#SECRET-claim", "Capability": "SECRET-capability",
               "ClaimIdList": "SECRET-list", "ClaimIds": "SECRET-ids", "ChildClaimIds": "SECRET-child",
               "TransferKey": "SECRET-transfer", "_condor_privAttr": "SECRET-v2", "claimid": None}
    ad = slot("slot1@p", **{k: v for k, v in secrets.items() if v is not None})
    private = classad2.ClassAd({"ClaimId": "SECRET-private-ad", "Capability": "SECRET-pvt"})
    b.update("Machine", ad, private, PEER)
    b.close()
    raw = b"".join(r.value for r in b.elog.log.read(EVENTS, 0, 0))
    assert raw and b"SECRET" not in raw
    assert b"SECRET" not in (tmp_path / "log" / "log.sqlite").read_bytes()
    (found,) = answer(b, "Machine", classad2.ClassAd({}))
    assert not any("secret" in str(v).lower() for v in found.values())
    assert found["Cpus"] == 4


# --- queries --------------------------------------------------------------------------------


@pytest.fixture()
def pool(tmp_path: Path) -> tuple[LedgerCollector, list[classad2.ClassAd]]:
    clock = Clock()
    b = backend(tmp_path, clock)
    sent = []
    for i in range(30):
        ad = slot(f"slot{i}@ep{i % 3}.example", Cpus=1 + i % 8, Memory=1024 * (1 + i % 6),
                  State=("Claimed", "Unclaimed", "Owner")[i % 3], Arch="X86_64" if i % 4 else "aarch64",
                  Path='C:\\Users\\x' if i == 7 else "/home")
        if i % 5 == 0:
            ad["Rank"] = classad2.ExprTree("TARGET.Memory * 2")
        b.update("Machine", ad, None, PEER)
        sent.append(ad)
    for i in range(3):
        sched = classad2.ClassAd({"MyType": "Scheduler", "Name": f"ap{i}.example",
                                  "TotalIdleJobs": 10 * i, "TotalRunningJobs": i})
        b.update("Scheduler", sched, None, PEER)
        sent.append(sched)
    return b, sent


CONSTRAINTS = [
    "Cpus > 2", 'State == "Claimed" && Memory >= 4096', 'regexp("^slot1", Name)',
    "TARGET.Cpus > 1", "Cpus", "NoSuchAttr == 3", 'Arch =!= "X86_64"', "Rank > 0",
    "Memory / Cpus >= 2048 || State == \"Owner\"", "true", 'Path == "C:\\\\Users\\\\x"',
]


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_query_constraints_select_what_classad2_evaluates(pool: Any, constraint: str) -> None:
    b, sent = pool
    query = classad2.ClassAd({"MyType": "Query", "TargetType": "Machine"})
    query["Requirements"] = classad2.ExprTree(constraint)
    got = sorted(ad["Name"] for ad in answer(b, "Machine", query))
    want = []
    for ad in sent:
        if ad["MyType"] != "Machine":
            continue
        value = classad2.ExprTree(constraint).eval(scope=ad)
        if value is True or (type(value) in (int, float) and value != 0):
            want.append(ad["Name"])
    assert got == sorted(want)


def test_projection_limits_and_multiple_types(pool: Any) -> None:
    b, sent = pool
    q = classad2.ClassAd({"Projection": "Name, Cpus Rank NoSuchAttr", "LimitResults": 4})
    q["Requirements"] = classad2.ExprTree("Cpus >= 4")
    got = answer(b, "Machine", q)
    assert len(got) == 4
    for ad in got:
        assert set(ad.keys()) <= {"Name", "Cpus", "Rank"} and ad["Cpus"] >= 4
        if "Rank" in ad:
            assert str(ad.lookup("Rank")) == "TARGET.Memory * 2"
    # QUERY_MULTIPLE_ADS, as condor_status sends it: per-type constraint and projection
    multi = classad2.ClassAd({"TargetType": "Machine,Scheduler",
                              "MachineProjection": "Name State", "SchedulerProjection": "Name",
                              "MachineLimitResults": 5})
    multi["MachineRequirements"] = classad2.ExprTree('State == "Owner"')
    multi["Requirements"] = classad2.ExprTree("TotalIdleJobs > 0")
    got = answer(b, None, multi)
    machines = [dict(a) for a in got if "State" in a]
    scheds = [dict(a) for a in got if "State" not in a]
    assert len(machines) == 5 and all(m["State"] == "Owner" and set(m) == {"Name", "State"}
                                      for m in machines)
    assert sorted(s["Name"] for s in scheds) == ["ap1.example", "ap2.example"]
    # the whole answer under LimitResults, across the types
    multi["LimitResults"] = 6
    assert len(answer(b, None, multi)) == 6
    # "Any" and a projection given as an expression evaluated per ad
    anyq = classad2.ClassAd({})
    anyq["Projection"] = classad2.ExprTree('ifThenElse(MY.X =?= 1, "Name", "Name")')
    assert sorted(a["Name"] for a in answer(b, "Any", anyq)) == sorted(a["Name"] for a in sent)
    with pytest.raises(CommandRefusedError):
        answer(b, None, classad2.ClassAd({}))  # QUERY_MULTIPLE_ADS needs TargetType


def test_queries_see_the_latest_heartbeat(pool: Any) -> None:
    b, sent = pool
    clock = b.clock
    assert isinstance(clock, Clock)
    b.flush()
    before = len(events(b))
    clock.t += 300
    beat = slot("slot0@ep0.example", Cpus=1, Memory=1024, State="Claimed", Arch="aarch64",
                Path="/home", LoadAvg=3.5)
    beat["Rank"] = classad2.ExprTree("TARGET.Memory * 2")
    b.update("Machine", beat, None, PEER)
    q = classad2.ClassAd({})
    q["Requirements"] = classad2.ExprTree("LoadAvg > 3")
    got = answer(b, "Machine", q)
    assert [a["Name"] for a in got] == ["slot0@ep0.example"] and got[0]["LoadAvg"] == 3.5
    assert len(events(b)) == before  # a heartbeat: not logged (yet)


def test_invalidations_by_name_and_by_requirements(pool: Any) -> None:
    b, _ = pool
    b.invalidate("Machine", classad2.ClassAd({"Name": "slot3@ep0.example"}), PEER)
    assert b.ledger.collector_ad("Machine", "slot3@ep0.example") is None
    q = classad2.ClassAd({"MyType": "Query"})
    q["Requirements"] = classad2.ExprTree('State == "Owner"')
    b.invalidate("Machine", q, PEER)
    left = {a["Name"]: a["State"] for a in answer(b, "Machine", classad2.ClassAd({}))}
    assert len(left) == 30 - 1 - 10 and "Owner" not in left.values()
    generic = classad2.ClassAd({"TargetType": "Scheduler", "Name": "ap0.example"})
    b.invalidate("Generic", generic, PEER)
    assert b.ledger.collector_ad("Scheduler", "ap0.example") is None
    with pytest.raises(CommandRefusedError):
        b.invalidate("Machine", classad2.ClassAd({}), PEER)
    with pytest.raises(CommandRefusedError):
        b.update("Machine", classad2.ClassAd({"Cpus": 1}), None, PEER)


# --- GET_PRIORITY ---------------------------------------------------------------------------


def numbered(ad: classad2.ClassAd) -> dict[str, dict[str, Any]]:
    """The numbered attributes as condor_userprio reads them: per entry index, by Name."""
    entries: dict[str, dict[str, Any]] = {}
    for attr in ad.keys():
        m = re.fullmatch(r"([A-Za-z_]+?)(\d+)", attr)
        if m:
            entries.setdefault(m.group(2), {})[m.group(1)] = ad[attr]
    return {e["Name"]: e for e in entries.values()}


def test_priorities_are_the_ledgers(tmp_path: Path, small_run: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock, GROUP_NAMES="group_physics, group_chemistry")
    b.elog.import_jsonl(small_run / "events.jsonl", EVENTS)
    ad = b.priorities(PEER)
    ledger = b.ledger
    rows = ledger.priorities(ledger.now, all_groups=True)
    got = numbered(ad)
    assert set(got) == set(rows) and len(rows) >= 2
    for name, row in rows.items():
        e = got[name]
        assert e["Priority"] == pytest.approx(row["Priority"])
        assert e["PriorityFactor"] == row["PriorityFactor"]
        assert e["WeightedAccumulatedUsage"] == pytest.approx(row["WeightedAccumulatedUsage"])
        assert e["ResourcesUsed"] == row["ResourcesUsed"]
        assert e["IsAccountingGroup"] == row["IsAccountingGroup"]
    indices = [int(a[len("Name"):]) for a in ad.keys() if re.fullmatch(r"Name\d+", a)]
    assert ad["NumSubmittors"] == max(indices)
    assert ad["LastUpdate"] == int(ledger.last_priority_update or 0)


def test_an_ad_past_its_lifetime_comes_back_with_its_next_heartbeat(tmp_path: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock)
    b.update("Machine", slot("slot1@late", UpdateSequenceNumber=1), None, PEER)
    b.update("Machine", slot("slot2@late", UpdateSequenceNumber=1), None, PEER)
    clock.t += 300  # a heartbeat of slot2, then it goes quiet with one pending
    b.update("Machine", slot("slot2@late", UpdateSequenceNumber=2, LoadAvg=0.3), None, PEER)
    clock.t += 700  # slot1's next update comes after its lifetime: the collector dropped it
    b.update("Machine", slot("slot1@late", UpdateSequenceNumber=2, LoadAvg=0.5), None, PEER)
    b.flush()
    rec = b.ledger.collector_ad("Machine", "slot1@late")
    assert rec is not None and rec.ad["LoadAvg"] == 0.5 and rec.expires == clock.t + 900
    # the quiet slot expired 900 s after its last heartbeat, which was counted
    clock.t += 300
    b.invalidate("Machine", classad2.ClassAd({"Name": "slot1@late"}), PEER)
    assert b.ledger.collector_ad("Machine", "slot2@late") is None
    stats = b.ledger.update_stats()
    assert (stats["Machine/slot2@late"].received, stats["Machine/slot2@late"].lost) == (2, 0)
    assert (stats["Machine/slot1@late"].received, stats["Machine/slot1@late"].lost) == (2, 0)


def test_an_invalidation_counts_the_heartbeats_before_it(tmp_path: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock)
    b.update("Machine", slot("slot1@inv", UpdateSequenceNumber=1), None, PEER)
    for seq in (2, 3, 5):
        clock.t += 60
        b.update("Machine", slot("slot1@inv", UpdateSequenceNumber=seq, LoadAvg=seq / 10), None,
                 PEER)
    b.invalidate("Machine", classad2.ClassAd({"Name": "slot1@inv"}), PEER)
    st = b.ledger.update_stats()["Machine/slot1@inv"]
    assert (st.received, st.lost) == (4, 1)
    assert b.ledger.collector_ad("Machine", "slot1@inv") is None


@pytest.mark.kafka
def test_on_kafka_a_query_sees_every_update_and_a_restart_resumes(kafka_bootstrap: str) -> None:
    """The backend on a real Kafka topic: a query right after updates sees them all (the
    fold waits for its own records to come back), heartbeats are kept off the log, and a
    second backend on the topic (a restart) continues each ad's sequence."""
    import uuid

    from streams.log.kafka import KafkaLog
    from streams.log.port import TopicSpec

    topic = f"collsvc-{uuid.uuid4().hex[:8]}.events"
    settings = load_settings(config_path=[], env={}, overrides={})
    clock = Clock()
    log = KafkaLog(kafka_bootstrap)
    try:
        log.create_topic(TopicSpec(topic, 1))
        b = LedgerCollector(log, settings, name="collector@kafka", topic=topic, clock=clock)
        for i in range(20):
            b.update("Machine", slot(f"slot{i}@k", UpdateSequenceNumber=1), None, PEER)
        assert len(answer(b, "Machine", classad2.ClassAd({}))) == 20
        clock.t += 300
        for i in range(20):
            b.update("Machine", slot(f"slot{i}@k", UpdateSequenceNumber=2, LoadAvg=0.7), None,
                     PEER)
        b.close()
        assert b.appended == 21  # 20 ads, one keep-alive of their heartbeats at the close
        again = LedgerCollector(log, settings, name="collector@kafka", topic=topic, clock=clock)
        clock.t += 300
        again.update("Machine", slot("slot0@k", UpdateSequenceNumber=5, LoadAvg=0.9), None, PEER)
        again.close()
        st = again.ledger.update_stats()["Machine/slot0@k"]
        assert (st.received, st.lost) == (3, 2)
        assert again.ledger.collector_ad("Machine", "slot0@k").ad["LoadAvg"] == 0.9  # type: ignore[union-attr]
    finally:
        log.close()


def test_a_repeated_projection_follows_the_ads_changes(pool: Any) -> None:
    b, _sent = pool
    q = classad2.ClassAd({"Projection": "Name LoadAvg State"})
    first = {a["Name"]: dict(a) for a in answer(b, "Machine", q)}
    assert {a["Name"]: dict(a) for a in answer(b, "Machine", q)} == first  # the kept answers
    clock = b.clock
    clock.t += 60
    b.update("Machine", slot("slot5@ep2.example", State="Drained", LoadAvg=1.5), None, PEER)
    clock.t += 60  # a heartbeat (LoadAvg only) of another slot: not logged, yet answered
    beat = slot("slot1@ep1.example", Cpus=2, Memory=2048, State="Unclaimed", Arch="X86_64",
                Path="/home", LoadAvg=2.5)
    b.update("Machine", beat, None, PEER)
    again = {a["Name"]: dict(a) for a in answer(b, "Machine", q)}
    assert again["slot5@ep2.example"] == {"Name": "slot5@ep2.example", "LoadAvg": 1.5,
                                          "State": "Drained"}
    assert again["slot1@ep1.example"]["LoadAvg"] == 2.5
    assert {k: v for k, v in again.items() if k not in ("slot5@ep2.example", "slot1@ep1.example")} \
        == {k: v for k, v in first.items() if k not in ("slot5@ep2.example", "slot1@ep1.example")}


def test_a_late_heartbeat_does_not_take_back_a_newer_one(tmp_path: Path) -> None:
    clock = Clock()
    b = backend(tmp_path, clock)
    b.update("Machine", slot("slot1@udp", UpdateSequenceNumber=1), None, PEER)
    clock.t += 300
    b.update("Machine", slot("slot1@udp", UpdateSequenceNumber=3, LoadAvg=0.3), None, PEER)
    clock.t += 1  # number 2, reordered on the way
    b.update("Machine", slot("slot1@udp", UpdateSequenceNumber=2, LoadAvg=0.2), None, PEER)
    (now,) = answer(b, "Machine", classad2.ClassAd({"Projection": "LoadAvg"}))
    assert now["LoadAvg"] == 0.3
    b.close()
    rec = b.ledger.collector_ad("Machine", "slot1@udp")
    assert rec is not None and rec.ad["LoadAvg"] == 0.3 and rec.ad["UpdateSequenceNumber"] == 3
