"""A simulated pool run for the metrics tests: two schedds, static and partitionable machines,
an accounting group, a concurrency limit, held jobs; started an hour before now so the
services' retention keeps its points at full resolution."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ganglia.gangliad import Gangliad
from ganglia.metrics import Evaluation, GangliadConfig, load_metrics
from schemas.settings import load_settings
from services.mainloop import MainLoop
from services.pool import parse_scenario
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from tests.e2e.helpers import batch, machines

#: whole minutes, an hour ago: boundaries land on the scenario's own minute marks
START = float(int(time.time() // 60) * 60 - 3600)


def scenario_doc(start: float = START) -> dict[str, Any]:
    return {
        "pool": {"start": start, "duration": "40m", "central_manager": "cm.example.org"},
        "config": {"NEGOTIATOR_INTERVAL": 60, "GROUP_NAMES": "group_physics",
                   "GROUP_QUOTA_DYNAMIC_group_physics": 0.5, "GROUP_ACCEPT_SURPLUS": True,
                   "XSW_LIMIT": 3},
        "schedds": [{"name": "ap1.example.org"}, {"name": "ap2.example.org"}],
        "machines": [*machines(3, slots=2),
                     {"name": "big{n}.example.org", "count": 1, "cpus": 8, "memory": 16384,
                      "disk": 10_000_000}],
        "submitters": [
            {"user": "alice", "schedd": "ap1.example.org",
             "jobs": [batch(12, "20m", concurrency_limits="xsw")]},
            {"user": "bob", "schedd": "ap2.example.org", "group": "group_physics",
             "jobs": [batch(10, "15m")]},
        ],
        "actions": [{"at": "10m", "kind": "hold", "user": "bob", "schedd": "ap2.example.org", "count": 2}],
    }


def simulate(home: Path, start: float = START) -> Path:
    """Run the scenario on an embedded log under `home`; returns the log directory."""
    scenario = parse_scenario(scenario_doc(start), "metrics.toml")
    log = EmbeddedLog(home / "log")
    try:
        MainLoop(scenario, seed=3, settings=load_settings(), log=log, record_durations=False).run()
    finally:
        log.close()
    return home / "log"


def evaluations(log_dir: Path, settings: Any = None, metrics_dir: Any = None,
                fast: bool = True) -> tuple[list[Evaluation], Evaluation, Gangliad]:
    """Every boundary evaluation of the log and the one at its end."""
    settings = settings or load_settings()
    defs, problems = load_metrics(metrics_dir)
    assert not problems, problems
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings, fast=fast)
    log = EmbeddedLog(log_dir)
    try:
        evs = [ev for _rec, env in EventLog(log).read(EVENTS) for ev in daemon.feed(env)]
    finally:
        log.close()
    final = daemon.flush()
    assert final is not None
    return evs, final, daemon
