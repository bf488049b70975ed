"""A deterministic mixed event log for tests and benchmarks: ads (with expiry and
invalidation), grouped and nice submitters, concurrency limits, negotiation cycles, admin
edits with leases, a knob change, and redelivered duplicates.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Iterator

from schemas.events import (AdInvalidated, AdminCommanded, AdUpdated, ConfigChanged, Envelope,
                            JobStarted, JobStopped, JobSubmitted, NegotiationCycled, Payload,
                            make_event)

START = 1_763_800_000.0
SCHEDD = "schedd@ap1.example.org"
USERS = ("alice@example.org", "bob@example.org", "group_physics.carol@example.org",
         "group_physics.hep.dave@example.org", "group_chemistry.erin@example.org",
         "nice-user.frank@example.org")
LIMITS = ("", "", "xsw", "fileserver:3", "large.license", "xsw,small.license:2")
MIXED_CONFIG = {
    "GROUP_NAMES": "group_physics, group_physics.hep, group_chemistry",
    "GROUP_QUOTA_group_physics": "20",
    "GROUP_QUOTA_DYNAMIC_group_physics.hep": "0.5",
    "GROUP_QUOTA_group_chemistry": "10",
    "GROUP_ACCEPT_SURPLUS": "true",
    "XSW_LIMIT": "3",
    "CONCURRENCY_LIMIT_DEFAULT_LARGE": "1",
}


def mixed_events(n: int, seed: int = 7, slots: int = 40) -> Iterator[Envelope]:
    """About `n` events of a small pool (deterministic for a seed), duplicates included."""
    rng = random.Random(seed)
    seqs: Counter[str] = Counter()
    emitted = 0
    now = START

    def ev(payload: Payload, source: str) -> Envelope:
        seqs[source] += 1
        return make_event(payload, ts=now, source=source, seq=seqs[source])

    names = [f"slot{i % 4 + 1}@ep{i // 4}.example.org" for i in range(slots)]

    def slot_ad(name: str, state: str) -> Envelope:
        return ev(AdUpdated("Machine", name, {
            "Name": name, "MyType": "Machine", "Cpus": 2 if name.startswith("slot1") else 1,
            "Memory": 4096, "State": state, "Activity": "Idle" if state == "Unclaimed" else "Busy",
            "NETWORK": "infiniband" if "ep1." in name else "ethernet"}),
            f"startd@{name.split('@')[1]}")

    running: dict[str, tuple[str, str, float]] = {}
    job = 0
    cycle = 0
    next_cycle = now + 60
    next_ads = now
    recent: list[Envelope] = []
    while emitted < n:
        now += rng.expovariate(1 / 20)
        batch: list[Envelope] = []
        if now >= next_ads:  # periodic ad refresh; ep9 goes quiet and its ads expire
            for name in names:
                if "@ep9." not in name or now < START + 3600:
                    batch.append(slot_ad(name, "Claimed" if name in running else "Unclaimed"))
            next_ads = now + 600
        if now >= next_cycle:
            cycle += 1
            batch.append(ev(NegotiationCycled("negotiator@cm", cycle, now), "negotiator@cm"))
            next_cycle = now + 60
        roll = rng.random()
        free = [s for s in names if s not in running and "@ep9." not in s]
        if roll < 0.45 and free:
            job += 1
            user = rng.choice(USERS)
            jid = f"{job}.0"
            slot = rng.choice(free)
            limits = rng.choice(LIMITS)
            batch.append(ev(JobSubmitted(jid, SCHEDD, user, {"ClusterId": job, "ProcId": 0,
                                                              "RequestCpus": 1}), SCHEDD))
            weight = 2.0 if slot.startswith("slot1") else 1.0
            batch.append(ev(JobStarted(jid, SCHEDD, user, slot, weight, {"Cpus": int(weight)},
                                       limits), SCHEDD))
            running[slot] = (jid, user, weight)
        elif roll < 0.88 and running:
            slot = rng.choice(sorted(running))
            jid, user, _ = running.pop(slot)
            batch.append(ev(JobStopped(jid, slot, rng.choice(("completed", "completed", "evicted")),
                                       SCHEDD, user), SCHEDD))
        elif roll < 0.94:
            op, value, duration = rng.choice((
                ("setfactor", 2000.0, None), ("setprio", 3.0, None), ("setceil", 4.0, 1800.0),
                ("setfloor", 2.0, None), ("resetusage", None, None), ("setaccum", 10.0, None),
                ("setfactor", 0.5, None)))  # the last one is invalid: logged but changes nothing
            batch.append(ev(AdminCommanded(op, rng.choice(USERS), value, "root", "synthetic",  # type: ignore[arg-type]
                                           duration), "userprio@cm"))
        elif roll < 0.95:
            batch.append(ev(ConfigChanged("PRIORITY_HALFLIFE", rng.choice(("43200", "86400")),
                                          "root"), "config@cm"))
        elif roll < 0.96:
            victim = rng.choice(names)
            batch.append(ev(AdInvalidated("Machine", victim), f"startd@{victim.split('@')[1]}"))
        elif recent:
            batch.append(rng.choice(recent))  # a redelivered duplicate: must change nothing
        for env in batch:
            yield env
            emitted += 1
        recent = (recent + batch)[-50:]


def mixed_config() -> dict[str, Any]:
    """The knobs the mixed log is meant to be folded with."""
    return dict(MIXED_CONFIG)
