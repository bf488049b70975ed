"""Logs for the reconciliation tests: a simulated run (its own negotiator publishes its
Accounting ads at the end of each cycle) and events built by hand."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from schemas.events import (AdUpdated, Envelope, JobStarted, JobStopped, NegotiationCycled,
                            Payload, make_event)
from schemas.settings import load_settings
from services.mainloop import MainLoop
from services.pool import parse_scenario
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from tests.ganglia.helpers import START, scenario_doc

NEGOTIATOR = "negotiator@cm.example.org"
_seq = itertools.count(1)


def simulated(home: Path, **config: Any) -> Path:
    """The metrics tests' scenario (two schedds, a group with a dynamic quota) with `config`
    added to its [config] (recorded on the log, so a replay folds under it); the log dir."""
    doc = scenario_doc(START)
    doc["config"].update(config)
    log = EmbeddedLog(home / "log")
    try:
        MainLoop(parse_scenario(doc, "reconcile.toml"), seed=3, settings=load_settings(), log=log,
                 record_durations=False).run()
    finally:
        log.close()
    return home / "log"


def events_of(log_dir: Path) -> list[Envelope]:
    log = EmbeddedLog(log_dir)
    try:
        return [env for _rec, env in EventLog(log).read(EVENTS)]
    finally:
        log.close()


def ev(payload: Payload, ts: float, source: str = "test") -> Envelope:
    return make_event(payload, ts=ts, source=source, seq=next(_seq))


def start(sub: str, slot: str, ts: float, weight: float = 1.0) -> Envelope:
    return ev(JobStarted(job_id=f"job-{slot}", schedd="schedd@ap", submitter=sub, slot=slot,
                         slot_weight=weight), ts)


def stop(slot: str, ts: float) -> Envelope:
    return ev(JobStopped(job_id=f"job-{slot}", slot=slot, reason="completed"), ts)


def cycle(ts: float) -> Envelope:
    return ev(NegotiationCycled(negotiator=NEGOTIATOR, cycle=0, now=ts), ts, NEGOTIATOR)


def accounting(ad: dict[str, Any], ts: float, source: str = "collector@real") -> Envelope:
    """An Accounting ad as the collector endpoint records one (`ad.updated`)."""
    full = {"MyType": "Accounting", "NegotiatorName": NEGOTIATOR, **ad}
    return ev(AdUpdated(ad_type="Accounting", name=str(ad["Name"]), ad=full), ts, source)


def negotiator_ad(name: str, ts: float, *, last_update: float, rup: float, factor: float,
                  **attrs: Any) -> Envelope:
    """An Accounting ad as condor_negotiator forwards it (matchmaker.cpp forwardAccountingData):
    Priority is GetPriority(name), the EUP, and LastUpdate the accountant's last update."""
    return accounting({"Name": name, "Priority": rup * factor, "PriorityFactor": factor,
                       "LastUpdate": last_update, "IsAccountingGroup": False, **attrs}, ts)
