"""Benchmark: one gangliad evaluation of the default metric set over a large collector view,
against the naive per-ad classad2 evaluation of the same definitions, in the same run.

Pool: 20,000 slots (2,500 machines of 8 static slots, 60% claimed, Start/Rank as expressions),
50 schedds, 200 submitters (in 10 accounting groups) with their Accounting ads, a negotiator
with 20 concurrency limits, and the collector. The fast path (ganglia/metrics.py) reads bare
attributes from the ads' dicts and evaluates other expressions with classad2 in small ads of
the attributes they reference, memoised; the naive baseline converts every ad to a classad2
ClassAd and evaluates every attribute of every metric in it, as gangliad does. Both must give
the same metrics (checked). gangliad's interval is 60 s; the target is <= 1 s per evaluation.

Usage: python bench/metrics.py [--slots N] [--schedds N] [--submitters N] [--repeat N]
The last line is machine-readable key=value.
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

from ganglia.metrics import Evaluator, GangliadConfig, load_metrics

STATES = ("Claimed", "Claimed", "Claimed", "Unclaimed", "Unclaimed", "Owner", "Matched",
          "Claimed", "Claimed", "Preempting")


def daemon_ads(slots: int, schedds: int, submitters: int, rng: random.Random
               ) -> list[tuple[str, dict[str, Any]]]:
    ads: list[tuple[str, dict[str, Any]]] = []
    for i in range(slots):
        host = f"exec{i // 8:05d}.example.org"
        sid = i % 8 + 1
        state = STATES[rng.randrange(len(STATES))]
        ads.append(("Machine", {
            "MyType": "Machine", "TargetType": "Job", "Name": f"slot{sid}@{host}", "Machine": host,
            "SlotID": sid, "SlotType": "Static", "PartitionableSlot": False, "State": state,
            "Activity": "Busy" if state == "Claimed" else "Idle", "Cpus": 1, "Memory": 4096,
            "Disk": 10_000_000, "TotalCpus": 8, "TotalMemory": 32768, "TotalDisk": 80_000_000,
            "TotalSlots": 8, "OpSys": "LINUX", "Arch": "X86_64", "UidDomain": "example.org",
            "StartdIpAddr": f"<{host}:9618>", "MyAddress": f"<10.1.{i // 2048}.{i // 8 % 256}:9618>",
            "LoadAvg": round(rng.random(), 3), "CondorLoadAvg": 1.0 if state == "Claimed" else 0.0,
            "KeyboardIdle": rng.randrange(0, 86400), "SlotWeight": 1.0,
            "Start": "/Expr((TARGET.RequestMemory <= MY.Memory) && KeyboardIdle > 900)/",
            "Rank": "/Expr(TARGET.Owner == \"alice\")/", "LastHeardFrom": 1763800000 + rng.randrange(300),
        }))
    users = [f"group_{k % 10}.user{k}@example.org" for k in range(submitters)]
    for s in range(schedds):
        host = f"ap{s:02d}.example.org"
        ads.append(("Scheduler", {
            "MyType": "Scheduler", "Name": host, "Machine": host, "MyAddress": f"<10.2.0.{s}:9618>",
            "TotalRunningJobs": rng.randrange(300), "TotalIdleJobs": rng.randrange(3000),
            "TotalHeldJobs": rng.randrange(20), "TotalJobAds": rng.randrange(4000),
            "MaxJobsRunning": 10000, "NumUsers": submitters // schedds, "JobsSubmitted": rng.randrange(10**5),
            "JobsStarted": rng.randrange(10**5), "JobsCompleted": rng.randrange(10**5),
            "RecentJobsStarted": rng.randrange(100)}))
    for k, user in enumerate(users):
        schedd = f"ap{k % schedds:02d}.example.org"
        running = rng.randrange(100)
        ads.append(("Submitter", {
            "MyType": "Submitter", "Name": user, "ScheddName": schedd, "Machine": schedd,
            "RunningJobs": running, "IdleJobs": rng.randrange(1000), "HeldJobs": rng.randrange(5),
            "WeightedRunningJobs": float(running), "WeightedIdleJobs": 10.0}))
        ads.append(("Accounting", {
            "MyType": "Accounting", "Name": user, "NegotiatorName": "negotiator@cm.example.org",
            "IsAccountingGroup": False, "AccountingGroup": f"group_{k % 10}",
            "Priority": 0.5 + rng.random() * 100, "PriorityFactor": 1000.0,
            "EffectivePriority": 500.0 + rng.random() * 1e5, "WeightedResourcesUsed": float(running)}))
    for g in range(10):
        ads.append(("Accounting", {
            "MyType": "Accounting", "Name": f"group_{g}", "NegotiatorName": "negotiator@cm.example.org",
            "IsAccountingGroup": True, "WeightedResourcesUsed": 100.0, "HierWeightedResourcesUsed": 120.0,
            "EffectiveQuota": 2000.0}))
    negotiator: dict[str, Any] = {
        "MyType": "Negotiator", "Name": "negotiator@cm.example.org", "Machine": "cm.example.org"}
    for stat, value in (("Duration", 3.2), ("Period", 60.0), ("Matches", 812), ("Rejections", 95),
                        ("MatchRate", 250.0), ("MatchRateSustained", 13.5), ("NumSchedulers", schedds),
                        ("ActiveSubmitterCount", submitters), ("NumIdleJobs", 80000),
                        ("NumJobsConsidered", 2000), ("TotalSlots", slots), ("CandidateSlots", slots)):
        for idx in range(3):
            negotiator[f"LastNegotiationCycle{stat}{idx}"] = value
    for lim in range(20):
        negotiator[f"ConcurrencyLimit_lic{lim}"] = float(rng.randrange(50))
    ads.append(("Negotiator", negotiator))
    ads.append(("Collector", {"MyType": "Collector", "Name": "collector@cm.example.org",
                              "Machine": "cm.example.org", "HostsTotal": slots, "HostsClaimed": slots // 2,
                              "HostsUnclaimed": slots // 4, "UpdatesLost": 0}))
    return ads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=20_000)
    parser.add_argument("--schedds", type=int, default=50)
    parser.add_argument("--submitters", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3, help="evaluations timed (each on a fresh evaluator)")
    args = parser.parse_args()
    ads = daemon_ads(args.slots, args.schedds, args.submitters, random.Random(14))
    defs, problems = load_metrics(None)
    assert not problems, problems
    cfg = GangliadConfig()
    print(f"[bench] {len(ads):,} daemon ads ({args.slots:,} slots, {args.schedds} schedds, "
          f"{args.submitters} submitters), {len(defs)} metric definitions", flush=True)

    times = []
    for _ in range(max(1, args.repeat)):
        evaluator = Evaluator(defs, cfg)  # cold: no memo from an earlier evaluation
        t0 = time.perf_counter()
        fast = evaluator.evaluate(ads, 1763800000.0, "cm.example.org")
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    warm = evaluator.evaluate(ads, 1763800060.0, "cm.example.org")
    warm_s = time.perf_counter() - t0
    print(f"[bench] fast path: {len(fast.metrics):,} metrics; cold {', '.join(f'{t:.3f}' for t in times)} s; "
          f"warm (next interval, same view) {warm_s:.3f} s", flush=True)

    t0 = time.perf_counter()
    naive = Evaluator(defs, cfg, fast=False).evaluate(ads, 1763800000.0, "cm.example.org")
    naive_s = time.perf_counter() - t0
    print(f"[bench] naive per-ad classad2: {len(naive.metrics):,} metrics in {naive_s:.3f} s", flush=True)
    assert naive.metrics == fast.metrics and warm.metrics == fast.metrics, "fast path disagrees with classad2"
    best = min(times)
    print(f"[bench] speed-up {naive_s / best:.1f}x; {best / 60.0 * 100:.2f}% of a 60 s GANGLIAD_INTERVAL")
    print(f"eval_seconds={best:.4f} naive_seconds={naive_s:.4f} warm_seconds={warm_s:.4f} "
          f"speedup={naive_s / best:.2f} metrics={len(fast.metrics)} ads={len(ads)}")


if __name__ == "__main__":
    main()
