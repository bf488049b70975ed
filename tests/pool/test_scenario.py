"""Scenario files: validation errors name file and key; shipped scenarios load and run;
the same seed gives the same events."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from schemas.events import encode
from schemas.settings import DaemonConfig
from services.pool import PoolSim, ScenarioError, load_scenario
from services.pool.scenario import parse_duration, parse_scenario
from tests.pool.helpers import run

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

GOOD = """
[pool]
duration = "1h"
[[machines]]
name = "ep{n}.example.org"
count = 2
cpus = 2
[[submitters]]
user = "alice"
[[submitters.jobs]]
arrival = { kind = "batch", count = 3 }
duration = "10m"
"""


def write(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("replace,key,reason", [
    ('duration = "10m"', "submitters[0].jobs[0].duration.kind",
     "unknown distribution 'normal'"),
    ('cpus = 2', "machines[0].cpus", "expected a number"),
    ('user = "alice"', "submitters[0].colour", "unknown key"),
    ('count = 2', "machines[0].name", "need a {n}"),
    ('[pool]', "pool.duration", "required"),
])
def test_errors_name_file_and_key(tmp_path: Path, replace: str, key: str, reason: str) -> None:
    bad = {
        'duration = "10m"': 'duration = { kind = "normal", mean = 5 }',
        'cpus = 2': 'cpus = "two"',
        'user = "alice"': 'user = "alice"\ncolour = "blue"',
        'count = 2': 'count = 2\nname = "ep.example.org"',
        '[pool]': '[pool]\nname = "x"',
    }[replace]
    text = GOOD.replace(replace, bad, 1)
    if replace == 'count = 2':
        text = text.replace('name = "ep{n}.example.org"\n', "", 1)
    if replace == '[pool]':
        text = text.replace('duration = "1h"\n', "", 1)
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.path == str(path) and err.value.key == key
    assert reason in str(err.value) and str(path) in str(err.value) and key in str(err.value)


def test_more_errors(tmp_path: Path) -> None:
    cases: list[tuple[str, str]] = [
        (GOOD + '[[actions]]\nat = "1h"\nkind = "userprio"\nop = "setfactor"\ntarget = "alice"\nvalue = 2\n',
         "actions[0].target"),
        (GOOD + '[[actions]]\nat = "1h"\nkind = "explode"\n', "actions[0].kind"),
        (GOOD + '[[actions]]\nat = "soon"\nkind = "vacate"\n', "actions[0].at"),
        (GOOD.replace('duration = "10m"', 'duration = "10m"\nrequirements = "TARGET.Cpus >>> 2 ("'),
         "submitters[0].jobs[0].requirements"),
        (GOOD.replace('duration = "10m"', 'duration = "10m"\nconcurrency_limits = "a:b:c"'),
         "submitters[0].jobs[0].concurrency_limits"),
        (GOOD.replace('[pool]', '[pool]\nfoo = 1'), "pool.foo"),
        (GOOD.replace('count = 3', 'count = 0'), "submitters[0].jobs[0].arrival.count"),
        (GOOD.replace('cpus = 2', 'cpus = 2\n[machines.config]\nNUM_SLOTS = 3'),
         "machines[0].config.NUM_SLOTS"),
        (GOOD.replace('cpus = 2', 'cpus = 2\n[machines.config]\nSLOT_TYPE_1 = "60%"\nNUM_SLOTS_TYPE_1 = 2'),
         "machines[0].config.SLOT_TYPE_1"),
        (GOOD.replace('[pool]', '[config]\nSUSPEND = "KeyboardIdle <"\n[pool]'), "config.SUSPEND"),
    ]
    for text, key in cases:
        with pytest.raises(ScenarioError) as err:
            load_scenario(write(tmp_path, text))
        assert err.value.key == key, (key, str(err.value))


def test_syntax_and_format_errors_name_the_file(tmp_path: Path) -> None:
    for name, text, reason in [("x.toml", "[pool\n", "not valid TOML"),
                               ("x.json", "{", "not valid JSON"),
                               ("x.yaml", "a: 1", ".toml or .json")]:
        path = write(tmp_path, text, name)
        with pytest.raises(ScenarioError, match=reason) as err:
            load_scenario(path)
        assert err.value.path == str(path)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


def test_json_scenarios_work_too(tmp_path: Path) -> None:
    import tomllib

    doc = tomllib.loads(GOOD)
    path = write(tmp_path, json.dumps(doc), "good.json")
    s = load_scenario(path)
    assert [m.hosts() for m in s.machines] == [["ep1.example.org", "ep2.example.org"]]
    assert DaemonConfig(s.config).number("NEGOTIATOR_INTERVAL") == 60.0 and s.duration == 3600.0


def test_durations() -> None:
    assert parse_duration("90") == 90 and parse_duration("15m") == 900
    assert parse_duration("1h30m") == 5400 and parse_duration("2d") == 172800
    assert parse_duration(12.5) == 12.5
    assert parse_duration("soon") is None and parse_duration(True) is None


@pytest.mark.parametrize("name", ["small", "fairshare", "groups"])
def test_shipped_scenarios_load(name: str) -> None:
    s = load_scenario(SCENARIOS / f"{name}.toml")
    assert s.machines and s.submitters


def test_shipped_scenario_shapes() -> None:
    fair = load_scenario(SCENARIOS / "fairshare.toml")
    assert sum(m.count * int(m.config.get("NUM_SLOTS", 1)) for m in fair.machines) == 100
    assert [s.user for s in fair.submitters] == ["a", "b"]
    assert fair.submitters[1].jobs[0].arrival.at == 48 * 3600
    assert [(a.params["op"], a.params["value"]) for a in fair.actions] == [("setfactor", 1.0)] * 2
    groups = load_scenario(SCENARIOS / "groups.toml")
    assert sum(m.count * int(m.config.get("NUM_SLOTS", 1)) for m in groups.machines) == 30
    assert groups.config["GROUP_QUOTA_group_physics"] == 20
    assert groups.config["GROUP_QUOTA_group_chemistry"] == 10
    small = load_scenario(SCENARIOS / "small.toml")
    assert sum(m.cpus for m in small.machines) == 20 and len(small.submitters) == 3


def events_of(seed: int, hours: float = 2.0) -> list[bytes]:
    sim = PoolSim(load_scenario(SCENARIOS / "small.toml"), random.Random(seed))
    return [encode(e) for e in run(sim, until=sim.scenario.start + hours * 3600)]


def test_same_seed_same_events_different_seed_different_events() -> None:
    a, b = events_of(11), events_of(11)
    assert a == b and len(a) > 300
    assert events_of(12) != a


def test_small_scenario_runs_end_to_end() -> None:
    sim = PoolSim(load_scenario(SCENARIOS / "small.toml"), random.Random(3))
    events = run(sim)
    by_type: dict[str, int] = {}
    for e in events:
        by_type[e.type] = by_type.get(e.type, 0) + 1
    assert by_type["job.started"] > 50 and by_type["job.history"] > 50
    assert by_type["admin.command"] == 1
    # per-source seq is gap-free and increasing; timestamps never go backwards
    seqs: dict[str, int] = {}
    last = 0.0
    for e in events:
        assert e.seq == seqs.get(e.source, 0) + 1 and e.id == f"{e.source}:{e.seq}"
        seqs[e.source] = e.seq
        assert e.ts >= last
        last = e.ts
    sources = set(seqs)
    assert {"startd@ep1.example.org", "schedd@ap1.example.org", "admin@cm.example.org"} <= sources
    # the desktop (ep3) suspended and then preempted jobs while its owner typed
    ep3 = {(e.data.ad["State"], e.data.ad["Activity"]) for e in events
           if e.type == "ad.updated" and e.data.ad_type == "Machine" and "ep3" in e.data.name}
    assert ("Claimed", "Suspended") in ep3
    # carol's nice-user jobs were removed at 3h30m
    removed = [e for e in events if e.type == "job.history" and e.data.ad["JobStatus"] == 3]
    assert removed and all(e.data.ad["Owner"] == "carol" for e in removed)
    # every event decodes under the contract
    from schemas.events import decode

    for e in events:
        assert decode(encode(e)) == e


def test_advance_and_match_refuse_the_past() -> None:
    from services.pool.errors import ClockError

    sim = PoolSim(load_scenario(SCENARIOS / "small.toml"), random.Random(1))
    sim.advance_to(sim.now + 100)
    with pytest.raises(ClockError):
        sim.advance_to(sim.now - 1)


def test_unknown_slot_or_schedd_in_a_match() -> None:
    from services.pool.errors import MatchError

    sim = PoolSim(load_scenario(SCENARIOS / "small.toml"), random.Random(1))
    sim.advance_to(sim.now)
    base: dict[str, Any] = {"negotiator": "n", "cycle": 1, "job_id": "1.0",
                            "schedd": "schedd@ap1.example.org", "submitter": "a@example.org",
                            "group": "<none>", "slot": "slot1@nowhere.example.org",
                            "reason": "NoPreemption"}
    with pytest.raises(MatchError, match="nowhere"):
        sim.apply_match(base, sim.now)
    with pytest.raises(MatchError, match="ap9"):
        sim.apply_match({**base, "slot": "slot1@ep1.example.org", "schedd": "schedd@ap9"}, sim.now)


def test_cpu_efficiency_puts_htcondors_cpu_times_in_the_history_ads(tmp_path: Path) -> None:
    """A job type with `cpu_efficiency` reports CPU time as the shadow does: 0.75 of each
    core-second running, all user time (RemoteUserCpu: the last attempt; Cumulative*: every
    attempt); the history database's cpu_efficiency is then 0.75. Without it the ads carry no
    CPU time (the simulated log of every shipped scenario is unchanged) and the view has no
    efficiency, not 0."""
    import tomllib

    from adstash.history import connect
    from adstash.history.target import catch_up
    from streams.log.events import EventLog, open_log
    from streams.log.topics import EVENTS, ensure_topics

    doc = tomllib.loads(GOOD.replace('duration = "10m"',
                                     'duration = "10m"\nrequest_cpus = 2\ncpu_efficiency = 0.75'))
    doc["submitters"].append({"user": "bob", "jobs": [
        {"arrival": {"kind": "batch", "count": 1}, "duration": "10m"}]})
    sim = PoolSim(parse_scenario(doc), random.Random(1))
    events = run(sim)
    ads = {e.data.ad["Owner"]: e.data.ad for e in events if e.type == "job.history"}
    alice = ads["alice"]
    assert alice["RemoteWallClockTime"] == 600.0
    assert alice["RemoteUserCpu"] == alice["CumulativeRemoteUserCpu"] == 0.75 * 600 * 2
    assert alice["RemoteSysCpu"] == alice["CumulativeRemoteSysCpu"] == 0.0
    assert not {"RemoteUserCpu", "RemoteSysCpu", "CumulativeRemoteUserCpu",
                "CumulativeRemoteSysCpu"} & set(ads["bob"])
    log = open_log(None, tmp_path)
    ensure_topics(log)
    EventLog(log).append(EVENTS, events)
    catch_up(log, tmp_path / "h.duckdb")
    log.close()
    con = connect(tmp_path / "h.duckdb")
    got = dict(con.execute("SELECT submitter, efficiency FROM cpu_efficiency").fetchall())
    con.close()
    assert got == {"alice@example.org": pytest.approx(0.75), "bob@example.org": None}
