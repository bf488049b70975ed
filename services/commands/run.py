"""`poolledger run`: the main job on the configured log (embedded by default)."""
from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from typing import Any, Iterator

from schemas.events import (AdUpdated, Envelope, JobStarted, JobStopped, JobSubmitted,
                            make_event)
from services.commands import broker_url, home_dir
from streams.log.events import EventLog, ensure_topics, open_log
from streams.log.topics import EVENTS


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the pool end to end (embedded log by default)")
    p.add_argument("--events", type=int, default=20_000, help="events to generate (default 20000)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the generated pool")
    p.set_defaults(func=run)


def demo_events(n: int, seed: int, start: float = 1_763_800_000.0) -> Iterator[Envelope]:
    """A small synthetic pool: slot ads, then jobs submitted, started and stopped."""
    rng = random.Random(seed)
    users = ["alice@example.org", "bob@example.org", "group_physics.carol@example.org"]
    seqs: Counter[str] = Counter()

    def ev(payload: Any, ts: float, source: str) -> Envelope:
        seqs[source] += 1
        return make_event(payload, ts=ts, source=source, seq=seqs[source])

    now = start
    slots = [f"slot{i % 8 + 1}@ep{i // 8}.example.org" for i in range(64)]
    emitted = 0
    for slot in slots:
        if emitted >= n:
            return
        yield ev(AdUpdated("Machine", slot, {"Name": slot, "Cpus": 1, "Memory": 2048,
                                              "State": "Unclaimed", "SlotWeight": 1}),
                 now, f"startd@{slot.split('@')[1]}")
        emitted += 1
    free = list(slots)
    running: list[tuple[str, str, str]] = []
    job = 0
    while emitted < n:
        now += rng.expovariate(1 / 30)
        if free and (not running or rng.random() < 0.6):
            job += 1
            user = rng.choice(users)
            jid = f"{job}.0"
            yield ev(JobSubmitted(jid, "schedd@ap1.example.org", user,
                                  {"ClusterId": job, "ProcId": 0, "Owner": user.split("@")[0]}),
                     now, "schedd@ap1.example.org")
            slot = free.pop(rng.randrange(len(free)))
            yield ev(JobStarted(jid, "schedd@ap1.example.org", user, slot, 1.0, {"Cpus": 1}),
                     now, "schedd@ap1.example.org")
            running.append((jid, slot, user))
            emitted += 2
        else:
            jid, slot, user = running.pop(rng.randrange(len(running)))
            yield ev(JobStopped(jid, slot, "completed", "schedd@ap1.example.org", user),
                     now, "schedd@ap1.example.org")
            free.append(slot)
            emitted += 1


def run(args: argparse.Namespace, settings: Any) -> int:
    log = open_log(broker_url(settings), home_dir(settings))
    ensure_topics(log)
    elog = EventLog(log)
    try:
        before = sum(log.end_offsets(EVENTS).values())
        events = list(demo_events(args.events, args.seed))
        t0 = time.perf_counter()
        for i in range(0, len(events), 5000):
            elog.append(EVENTS, events[i:i + 5000])
        t1 = time.perf_counter()
        by_type: Counter[str] = Counter()
        read = 0
        for _, env in elog.read(EVENTS, start_positions={0: before} if before else None):
            by_type[env.type] += 1
            read += 1
        t2 = time.perf_counter()
    finally:
        log.close()
    where = broker_url(settings) or f"embedded log in {home_dir(settings) / 'log'}"
    print(f"PoolLedger demo on {where}")
    print(f"appended {len(events)} events in {t1 - t0:.2f}s, read back {read} in {t2 - t1:.2f}s")
    for type_, count in sorted(by_type.items()):
        print(f"  {type_:16} {count:8}")
    return 0 if read == len(events) else 1
