"""Test helpers: a deliberately naive matchmaker to drive PoolSim (the real negotiator is not
part of services.pool), and small builders."""
from __future__ import annotations

import random
from typing import Any

import classad2

from schemas.events import Envelope, Matched
from schemas import classads
from services.pool.scenario import Scenario, parse_scenario
from services.pool.sim import PoolSim


def first_fit(sim: PoolSim, now: float, cycle: int = 1) -> list[Matched]:
    """Match idle jobs in order to the first free slot whose Requirements and START agree
    (symmetric match with classad2; partitionable slots take jobs while they have room)."""
    free = [(a["Name"], bool(a.get("PartitionableSlot")), classad2.ClassAd(_plain(a)))
            for a in sim.slot_ads()
            if a["State"] in ("Unclaimed", "Owner") and a.get("Requirements") is not False]
    room = {name: ad.get("Cpus", 0) for name, part, ad in free if part}
    taken: set[str] = set()
    out: list[Matched] = []
    for job in sim.idle_jobs():
        if len(taken) == len(free):
            break
        jad = _JOBS.get(job.ad["GlobalJobId"], (None, None))
        if jad[0] is not job.ad:
            jad = (job.ad, classad2.ClassAd(_plain(job.ad)))
            _JOBS[job.ad["GlobalJobId"]] = jad
        cad = jad[1]
        assert cad is not None
        for name, part, sad in free:
            if name in taken or not cad.symmetricMatch(sad):
                continue
            if part:
                room[name] -= int(job.ad["RequestCpus"])
                if room[name] < 0:
                    room[name] += int(job.ad["RequestCpus"])
                    continue
                if room[name] == 0:
                    taken.add(name)
            else:
                taken.add(name)
            group = str(job.ad.get("AccountingGroup", "<none>")).rsplit(".", 1)[0]
            out.append(Matched(negotiator="test-negotiator", cycle=cycle, job_id=job.job_id,
                               schedd=job.schedd, submitter=job.submitter, group=group,
                               slot=name, reason="NoPreemption"))
            break
    return out


_JOBS: dict[str, tuple[Any, Any]] = {}


def _plain(ad: dict[str, Any]) -> dict[str, Any]:
    return {k: classads.plain(v) for k, v in classads.attrs_from_json(ad).items()}


def run(sim: PoolSim, until: float | None = None, interval: float | None = None) -> list[Envelope]:
    """Advance the pool to `until`, negotiating every `interval` seconds with `first_fit`."""
    end = sim.end if until is None else until
    step = interval or sim.config.number("NEGOTIATOR_INTERVAL")
    events: list[Envelope] = []
    t = sim.now
    cycle = 0
    while t <= end:
        events += sim.advance_to(t)
        cycle += 1
        for m in first_fit(sim, t, cycle):
            events += sim.apply_match(m, t)
        t += step
    events += sim.advance_to(end)
    return events


def scenario(doc: dict[str, Any], path: str = "test.toml") -> Scenario:
    """A scenario from a dict, with a one-hour default duration."""
    doc = dict(doc)
    doc.setdefault("pool", {}).setdefault("duration", "1h")
    return parse_scenario(doc, path)


def sim_of(doc: dict[str, Any], seed: int = 1) -> PoolSim:
    """A PoolSim of a scenario dict."""
    return PoolSim(scenario(doc), random.Random(seed))


def states(events: list[Envelope], slot: str) -> list[tuple[float, str, str]]:
    """(ts, State, Activity) of every ad a slot published."""
    return [(e.ts, e.data.ad["State"], e.data.ad["Activity"]) for e in events
            if e.type == "ad.updated" and e.data.ad_type == "Machine" and e.data.name == slot]
