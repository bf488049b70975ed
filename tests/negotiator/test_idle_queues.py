"""The negotiator's idle queues follow the ledger incrementally (`JobAds`, issue 27): a cycle
re-reads only the jobs the demand fold says changed, and offers exactly what a snapshot built
from the whole queue offers, through submissions, starts, stops, holds, resubmissions and
removals; a second reader makes the first one rebuild rather than miss changes."""
from __future__ import annotations

import random
from typing import Any

from schemas.events import (AdUpdated, Envelope, JobStarted, JobStopped, JobSubmitted,
                            StopReason, make_event)
from schemas.settings import load_settings
from services.negotiator.service import JobAds, _snapshot, negotiator_config
from streams.core.ledger import Ledger
from tests.negotiator.ads import job, slot

T0 = 1_763_800_000.0
SCHEDD = "schedd@ap1.example.org"


def _view(ledger: Ledger, ads: JobAds, now: float) -> tuple[Any, ...]:
    """What a cycle is handed and how it accounts for the jobs it held back."""
    snap, offer = _snapshot(ledger, now, 1, ads, negotiator_config(ledger.settings))
    held = {k: [key for _order, key in v] for k, v in offer.held.items()}
    return snap.jobs, held, offer.offered, offer.sig_of, snap.schedd_room


def _events(rng: random.Random) -> list[list[Envelope]]:
    """Batches of events (one batch between two cycles): 3 slots, then jobs of two users
    in two shapes each coming and going."""
    seq = iter(range(1, 10**6))
    out: list[list[Envelope]] = [[make_event(AdUpdated("Machine", f"slot{i}@host{i}.example.org",
                                                       slot(i)), ts=T0, source=f"startd@h{i}",
                                           seq=1) for i in range(3)]]
    out[0].append(make_event(AdUpdated("Scheduler", "ap1.example.org",
                                       {"Name": "ap1.example.org", "MaxJobsRunning": 5}),
                             ts=T0, source=SCHEDD, seq=next(seq)))
    state: dict[str, str] = {}
    t = T0
    for cluster in range(1, 40):
        t += 60.0
        batch: list[Envelope] = []
        for _ in range(rng.randrange(1, 6)):
            user = rng.choice(("a@example.org", "b@example.org"))
            proc = rng.randrange(4)
            jid = f"{cluster}.{proc}"
            ad = job(cluster, proc, RequestMemory=rng.choice((1024, 2048)),
                     JobPrio=rng.randrange(3))
            batch.append(make_event(JobSubmitted(jid, SCHEDD, user, ad), ts=t, source=SCHEDD,
                                    seq=next(seq)))
            state[jid] = user
        for jid, user in sorted(state.items()):
            roll = rng.random()
            if roll < 0.2:
                batch.append(make_event(JobStarted(jid, SCHEDD, user, "slot1@host1.example.org",
                                                   1.0), ts=t, source=SCHEDD, seq=next(seq)))
            elif roll < 0.3:
                reason: StopReason = rng.choice(("completed", "removed", "evicted", "held"))
                batch.append(make_event(JobStopped(jid, "slot1@host1.example.org", reason,
                                                   SCHEDD, user), ts=t, source=SCHEDD,
                                        seq=next(seq)))
                if reason in ("completed", "removed"):
                    del state[jid]
        out.append(batch)
    return out


def test_incremental_queues_offer_what_a_full_rebuild_offers() -> None:
    settings = load_settings(config_path=[], env={})
    live, fresh = Ledger(settings), Ledger(settings)
    ads = JobAds()
    for batch in _events(random.Random(27)):
        for env in batch:
            live.apply(env)
            fresh.apply(env)
        now = batch[-1].ts
        # `fresh` is read by a new JobAds each time (a rebuild from its whole queue); `live`
        # by the same one throughout (the changed jobs only)
        assert _view(live, ads, now) == _view(fresh, JobAds(), now)
    assert ads.queues, "the scenario leaves idle jobs queued"


def test_a_second_reader_makes_the_first_rebuild() -> None:
    settings = load_settings(config_path=[], env={})
    ledger = Ledger(settings)
    first, second = object(), object()
    assert ledger.changed_jobs(first) is None  # its first call: read the whole queue
    ledger.apply(make_event(JobSubmitted("1.0", SCHEDD, "a@example.org", job(1)), ts=T0,
                            source=SCHEDD, seq=1))
    assert ledger.changed_jobs(first) == {f"{SCHEDD}#1.0"}
    assert ledger.changed_jobs(first) == set()
    assert ledger.changed_jobs(second) is None  # another reader took over
    ledger.apply(make_event(JobSubmitted("2.0", SCHEDD, "a@example.org", job(2)), ts=T0,
                            source=SCHEDD, seq=2))
    assert ledger.changed_jobs(first) is None  # so the first one cannot know what changed
    ads = JobAds()
    snap, _offer = _snapshot(ledger, T0, 1, ads, negotiator_config(settings))
    assert [ad["ClusterId"] for ad in snap.jobs["a@example.org"]] == [1, 2]
