"""Builders for end-to-end runs: a scenario dict on the embedded log, run by the main loop."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.events import Envelope
from schemas.settings import load_settings
from services.mainloop import MainLoop, RunResult
from services.pool import parse_scenario
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS

HOUR = 3600.0


def machines(n: int, slots: int = 1, name: str = "ep{n:02d}.example.org",
             memory: int = 4096) -> list[dict[str, Any]]:
    """`n` machines of `slots` static one-core slots each."""
    return [{"name": name, "count": n, "cpus": slots, "memory": memory * slots,
             "disk": 10_000_000, "config": {"NUM_SLOTS": slots}}]


def batch(count: int, duration: Any = "1h", at: Any = 0, **job: Any) -> dict[str, Any]:
    """One cluster of `count` jobs submitted at `at`."""
    return {"arrival": {"kind": "batch", "at": at, "count": count}, "duration": duration, **job}


def userprio(op: str, target: str, value: float, at: Any = 0) -> dict[str, Any]:
    return {"at": at, "kind": "userprio", "op": op, "target": target, "value": value}


def run(tmp: Path, doc: dict[str, Any], hours: float | None = None, seed: int = 0,
        home: Path | None = None) -> tuple[MainLoop, RunResult]:
    """Run a scenario dict on an embedded log under `home` (default `tmp`); deterministic."""
    doc = dict(doc)
    pool = dict(doc.get("pool", {}))
    pool.setdefault("duration", f"{hours or 1}h")
    pool.setdefault("uid_domain", "example.org")
    doc["pool"] = pool
    scenario = parse_scenario(doc, "e2e.toml")
    log = EmbeddedLog((home or tmp) / "log")
    loop = MainLoop(scenario, seed=seed, settings=load_settings(), log=log,
                    record_durations=False)
    try:
        result = loop.run(hours)
    finally:
        log.close()
    return loop, result


def events(home: Path) -> Iterator[Envelope]:
    """Every event of the run's log, in log order."""
    log = EmbeddedLog(home / "log")
    try:
        for _rec, env in EventLog(log).read(EVENTS):
            yield env
    finally:
        log.close()


def running_by(evs: list[Envelope], key: Any) -> tuple[dict[Any, int], list[tuple[float, dict[Any, int]]]]:
    """Replay job starts/stops: the maximum running count per `key(JobStarted)` and a
    timeline of counts after each change."""
    slot_of: dict[str, Any] = {}
    now: dict[Any, int] = {}
    peak: dict[Any, int] = {}
    timeline: list[tuple[float, dict[Any, int]]] = []
    for e in evs:
        if e.type == "job.started":
            k = key(e.data)
            slot_of[e.data.slot] = k
            now[k] = now.get(k, 0) + 1
            peak[k] = max(peak.get(k, 0), now[k])
            timeline.append((e.ts, dict(now)))
        elif e.type == "job.stopped" and e.data.slot in slot_of:
            k = slot_of.pop(e.data.slot)
            now[k] -= 1
            timeline.append((e.ts, dict(now)))
    return peak, timeline
