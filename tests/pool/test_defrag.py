"""condor_defrag (seeds 000/001) and the startd's draining attributes."""
from __future__ import annotations

import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from services.pool.defrag import prorate, split_rate
from services.pool.errors import ScenarioError
from services.pool.scenario import parse_scenario
from services.pool.sim import PoolSim
from tests.pool.helpers import run, sim_of

START = 1763800000  # 08:26:40 UTC: polls at :06:40, :16:40, ... cross the hour at 09:06:40


def test_the_rate_splits_as_condor_defrag_splits_it() -> None:
    assert split_rate(1.0, 600) == (0, 1, 0)  # the seed's 1 per hour: one per clock hour
    assert split_rate(6.0, 600) == (1, 0, 0)  # one per poll
    assert split_rate(0.5, 600) == (0, 0, 12)  # twelve a day
    assert prorate(1, 400, 3600, 600) == 1  # early in the hour: the whole hour's machine
    assert prorate(1, 3000, 3600, 600) == 0  # too late in the hour for it


def _busy_pool(config: dict[str, Any], machines: int = 8, jobs: int = 32,
               duration: str = "6h") -> PoolSim:
    """`machines` 4-core partitionable machines; `jobs` 1-core day-long jobs that retire for
    a day when drained, so a drain stays in progress."""
    return sim_of({
        "pool": {"start": START, "duration": duration},
        "config": {"DAEMON_LIST": "MASTER, DEFRAG", "MAXJOBRETIREMENTTIME": 86400, **config},
        "machines": [{"name": "ep{n}", "count": machines, "cpus": 4}],
        "submitters": [{"user": "u", "jobs": [{"arrival": {"kind": "batch", "count": jobs},
                                               "duration": "24h"}]}]})


def _defrag_ads(events: list[Any]) -> list[dict[str, Any]]:
    return [e.data.ad for e in events if e.type == "ad.updated" and e.data.ad_type == "Defrag"]


def test_one_machine_per_hour_is_drained_at_each_clock_hour() -> None:
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 1.0, "DEFRAG_MAX_WHOLE_MACHINES": 20,
                      "DEFRAG_MAX_CONCURRENT_DRAINING": 10})
    events = run(sim)
    assert sim.defrag is not None
    assert [t - START for t, _ in sim.defrag.drained] == [2400 + 3600 * k for k in range(6)]
    assert len({m for _, m in sim.defrag.drained}) == 6  # a draining machine is not drained again
    ad = _defrag_ads(events)[-1]
    assert (ad["DrainSuccesses"], ad["MachinesDraining"], ad["DrainFailures"]) == (6, 6, 0)
    assert ad["Name"] == "cm.example.org" and ad["MyType"] == "Defrag"
    slots = {a["Machine"]: a for a in sim.slot_ads() if a.get("PartitionableSlot")}
    assert sum(a["Draining"] for a in slots.values()) == 6
    assert {a["DrainReason"] for a in slots.values() if a["Draining"]} == {"Defrag cm.example.org"}


def test_max_concurrent_draining_caps_the_rate() -> None:
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 6.0, "DEFRAG_MAX_CONCURRENT_DRAINING": 2},
                     duration="2h")
    events = run(sim)
    assert sim.defrag is not None
    assert [t - START for t, _ in sim.defrag.drained] == [600, 1200]  # at 0 all are whole; then one per poll up to the cap
    ad = _defrag_ads(events)[-1]
    assert (ad["MachinesDraining"], ad["MachinesDrainingPeak"], ad["DrainSuccesses"]) == (2, 2, 2)


def test_enough_whole_machines_stop_draining() -> None:
    # 8 machines, jobs for 6 of them: 2 whole (empty) machines already meet the limit of 2
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 6.0, "DEFRAG_MAX_WHOLE_MACHINES": 2},
                     jobs=24, duration="1h")
    events = run(sim)
    assert sim.defrag is not None and sim.defrag.drained == []
    assert _defrag_ads(events)[-1]["WholeMachines"] == 2
    # with a limit of 3 it drains one machine per poll until three are whole or draining
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 6.0, "DEFRAG_MAX_WHOLE_MACHINES": 3},
                     jobs=24, duration="1h")
    run(sim)
    assert sim.defrag is not None and len(sim.defrag.drained) == 6


def test_no_rate_no_defrag_daemon() -> None:
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 0}, duration="2h")
    assert sim.defrag is not None
    run(sim)
    assert sim.defrag.drained == []
    sim = _busy_pool({"DAEMON_LIST": "MASTER", "DEFRAG_DRAINING_MACHINES_PER_HOUR": 6}, duration="1h")
    assert sim.defrag is None


def test_a_drained_machine_resumes_and_becomes_whole() -> None:
    # day-long jobs with no retirement: a graceful drain evicts at once; resume-on-completion
    # puts the machine back to work as a whole machine
    sim = _busy_pool({"DEFRAG_DRAINING_MACHINES_PER_HOUR": 6.0, "MAXJOBRETIREMENTTIME": 0},
                     machines=2, jobs=8, duration="15m")
    events = run(sim, until=START + 599)
    events += sim.advance_to(START + 600)  # the second poll, before the next negotiation
    assert sim.defrag is not None and [m for _, m in sim.defrag.drained] == ["ep1"]
    pslot = next(a for a in sim.slot_ads() if a["Name"] == "slot1@ep1")
    assert (pslot["State"], pslot["Draining"], pslot["Cpus"]) == ("Unclaimed", False, 4)
    assert pslot["TotalMachineDrainingBadput"] == 4 * 600  # four 1-cpu jobs killed after 600 s
    assert [e.data.reason for e in events if e.type == "job.stopped"] == ["evicted"] * 4


def test_startd_draining_costs_and_estimates() -> None:
    sim = sim_of({"pool": {"start": START, "duration": "10m"},
                  "machines": [{"name": "ep1", "cpus": 2}],
                  "config": {"MAXJOBRETIREMENTTIME": 500},
                  "submitters": [{"user": "u", "jobs": [{"arrival": {"kind": "batch", "count": 2},
                                                         "duration": "1h"}]}],
                  "actions": [{"at": 100, "kind": "drain", "schedule": "fast"}]})
    run(sim, until=START + 99)
    sim.startds["ep1"].publish_all()
    before = next(a for a in sim.slot_ads() if a.get("PartitionableSlot"))
    # two 1-cpu jobs 99 s in: a quick drain loses 99 s each; a graceful one lets them retire
    # for the 401 s left of MAXJOBRETIREMENTTIME = 500, then loses all 500 s each, and ends
    # after that retirement plus MachineMaxVacateTime (600 s)
    assert (before["ExpectedMachineQuickDrainingBadput"], before["ExpectedMachineGracefulDrainingBadput"],
            before["ExpectedMachineQuickDrainingCompletion"] - START,
            before["ExpectedMachineGracefulDrainingCompletion"] - START) == (198, 1000, 99 + 600,
                                                                            99 + 401 + 600)
    run(sim, until=START + 400)
    sim.startds["ep1"].publish_all()
    ad = next(a for a in sim.slot_ads() if a.get("PartitionableSlot"))
    assert (ad["Draining"], ad["DrainReason"], ad["State"]) == (True, "by command", "Drained")
    assert ad["TotalMachineDrainingBadput"] == 2 * 100  # two 1-cpu jobs killed after 100 s
    assert ad["TotalMachineDrainingUnclaimedTime"] == 2 * 300  # 2 cpus idle for 300 s
    assert ad["ExpectedMachineGracefulDrainingBadput"] == 0


def test_bad_defrag_knobs_are_scenario_errors() -> None:
    with pytest.raises(ScenarioError) as err:
        sim_of({"config": {"DAEMON_LIST": "DEFRAG", "DEFRAG_DRAINING_SCHEDULE": "slow"},
                "machines": [{"name": "ep1"}]})
    assert "config.DEFRAG_DRAINING_SCHEDULE" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        sim_of({"config": {"DAEMON_LIST": "DEFRAG", "DEFRAG_RANK": "Cpus +"},
                "machines": [{"name": "ep1"}]})
    assert "config.DEFRAG_RANK" in str(err.value)


def _alice_starts(defrag: bool) -> int:
    doc = tomllib.loads(Path("scenarios/defrag.toml").read_text())
    doc["pool"]["duration"] = "3h"
    if not defrag:
        doc["config"]["DAEMON_LIST"] = "MASTER, COLLECTOR, NEGOTIATOR"
    sim = PoolSim(parse_scenario(doc, "defrag.toml"), random.Random(1))
    return sum(1 for e in run(sim) if e.type == "job.started" and e.data.submitter.startswith("alice"))


def test_whole_machine_jobs_starve_without_defrag_and_run_with_it() -> None:
    assert _alice_starts(defrag=False) == 0
    assert _alice_starts(defrag=True) >= 2
