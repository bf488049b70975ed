"""Benchmark: one negotiation cycle on a synthetic pool, against a naive classad2 matcher.

Pool: 20,000 slots (static slots of three machine types plus partitionable 8-core slots,
20% claimed), 100,000 idle jobs in 500 autoclusters from 200 submitters. The naive baseline
is what a negotiator without autoclusters, slot classes or column evaluation would do: a
classad2 `symmetricMatch` for every job x slot pair. It is timed on a random sample of pairs
in the same run and extrapolated to all pairs.

Memory: the resident set is sampled while the cycle runs; `peak_rss_gb` is its peak above
the resident set just before the cycle (the synthetic input, built first, is not the
negotiation's), `process_peak_rss_gb` the whole process's peak.

The cycle runs with NEGOTIATOR_WORKERS (`--workers`, default 2): when a core is idle a forked
child sorts half the job queues (`workers` says whether it did), and another builds match
lists ahead of the match phase (`match_workers`; `prefetched` lists it built); the children's
peak resident set is `child_peak_rss_gb` (mostly pages shared with the parent, which the
parent's figure counts already).

Sizes: the default (20,000 slots), the 200,000 x 1,000,000 case (`--slots 200000 --jobs
1000000`, target 30 s on a 2-core machine) and the largest pools' (`--slots 500000 --jobs
2500000 --autoclusters 5000 --submitters 2000`, target 90 s and `peak_rss_gb` <= 6).

`cycle_cpu_seconds` is the CPU time of the cycle (this process and the children), and
`cycle_parent_cpu_seconds` this process's alone (what the children took off it): on a machine
shared with other work they say what the wall clock cannot.

`--baseline DIR` runs DIR's own bench/negotiation.py (another checkout, e.g. today's
algorithm) on the same pool after the cycle, in the same run, and prints
`baseline_cycle_seconds` and `speedup_vs_baseline` (baseline cycle / this cycle), and the
same by CPU time (`baseline_cycle_cpu_seconds`, `speedup_vs_baseline_cpu`: its `negotiate`
timed from outside, so an older bench that prints wall clock only still tells), which the
machine's other work disturbs less than the wall clock.

`--assume-idle-core` forks them whatever the load (on a machine shared with other work the
cycle otherwise stays on one core).

Usage: python bench/negotiation.py [--slots N] [--jobs N] [--autoclusters N]
       [--submitters N] [--sample N] [--workers N] [--assume-idle-core] [--baseline DIR]
The last line is machine-readable key=value: `seconds` (the cycle's wall clock, as
`cycle_seconds`), `peak_rss_gb`, and with `--baseline` `speedup_vs_baseline` (and by CPU).
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from schemas.classads import ad_from_json
from services.negotiator import CycleInput, NegotiatorConfig, SubmitterInput, matchmaker, negotiate

ARCHES = ("X86_64", "X86_64", "X86_64", "aarch64")
STARTS = (
    "/Expr(TARGET.RequestMemory <= MY.Memory)/",
    "/Expr((TARGET.RequestMemory <= MY.Memory) && (KeyboardIdle > 900 || TARGET.NiceUser =!= true))/",
)


T = TypeVar("T")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def progress(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def with_peak_rss(fn: Callable[[], T], every: float = 0.02) -> tuple[T, int, int]:
    """fn(), the resident set before it, and the peak sampled while it ran."""
    before = peak = rss_bytes()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(every):
            peak = max(peak, rss_bytes())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        out = fn()
    finally:
        done.set()
        watcher.join()
    return out, before, max(peak, rss_bytes())


def make_slots(n: int, rng: random.Random, users: list[str]) -> list[dict[str, Any]]:
    slots: list[dict[str, Any]] = []
    n_pslots = n // 40
    for i in range(n):
        host = f"exec{i // 8:05d}.example.org"
        sid = i % 8 + 1
        base: dict[str, Any] = {
            "MyType": "Machine", "Name": f"slot{sid}@{host}", "Machine": host, "SlotID": sid,
            "Arch": ARCHES[(i // 8) % len(ARCHES)], "OpSys": "LINUX",
            "KFlops": 1_000_000 + ((i // 8) % 7) * 150_000, "HasDocker": (i // 8) % 3 != 0,
            "KeyboardIdle": 1200 if (i // 8) % 5 else 30, "Disk": 50_000_000,
            "State": "Unclaimed", "Activity": "Idle", "Rank": 0.0, "CurrentRank": 0.0,
            "Requirements": "/Expr(START)/", "SlotWeight": "/Expr(Cpus)/",
        }
        if i < n_pslots:
            base.update({"Name": f"slot1@pslot{i:05d}.example.org", "Machine": f"pslot{i:05d}",
                         "SlotID": 1, "PartitionableSlot": True, "SlotType": "Partitionable",
                         "Cpus": 8, "Memory": 32768,
                         "START": "/Expr(TARGET.RequestCpus <= MY.Cpus && "
                                  "TARGET.RequestMemory <= MY.Memory)/"})
        else:
            base.update({"Cpus": 1, "Memory": (2048, 4096, 8192)[(i // 8) % 3],
                         "START": STARTS[(i // 8) % 2]})
            if rng.random() < 0.2:
                user = rng.choice(users)
                base.update({"State": "Claimed", "Activity": "Busy", "RemoteUser": user,
                             "RemoteOwner": user, "TotalJobRuntime": rng.randint(10, 10_000)})
        slots.append(base)
    return slots


def make_jobs(n_jobs: int, n_acs: int, users: list[str], rng: random.Random
              ) -> dict[str, list[dict[str, Any]]]:
    jobs: dict[str, list[dict[str, Any]]] = {u: [] for u in users}
    per = n_jobs // n_acs
    for a in range(n_acs):
        user = users[a % len(users)]
        mem = (1024, 1800, 3000, 6000)[a % 4]
        req = "TARGET.OpSys == \"LINUX\" && TARGET.Arch == \"X86_64\" && TARGET.Memory >= RequestMemory"
        if a % 5 == 1:
            req += " && TARGET.HasDocker"
        if a % 50 == 7:   # a per-host attribute read through regexp()
            req += " && regexp(\"^exec0\", TARGET.Machine)"
        rank = ("TARGET.KFlops", "TARGET.Memory", "0")[a % 3]
        for p in range(per):
            jobs[user].append({
                "ClusterId": 1000 + a, "ProcId": p, "QDate": 1_700_000_000 + a,
                "JobPrio": (a * 7) % 5, "RequestCpus": 2 if a % 10 == 3 else 1,
                "RequestMemory": mem, "RequestDisk": 1024, "Owner": user.split("@")[0],
                "JobUniverse": 5, "Requirements": f"/Expr({req})/", "Rank": f"/Expr({rank})/",
            })
    return jobs


def naive_pair_seconds(slots: list[dict[str, Any]], jobs: dict[str, list[dict[str, Any]]],
                       sample: int, rng: random.Random) -> float:
    """Mean seconds per classad2 symmetricMatch over a random sample of job x slot pairs."""
    flat = [j for js in jobs.values() for j in js]
    slot_ads = [ad_from_json(s) for s in rng.sample(slots, min(len(slots), 400))]
    job_ads = [ad_from_json(j) for j in rng.sample(flat, min(len(flat), 400))]
    pairs = [(rng.choice(job_ads), rng.choice(slot_ads)) for _ in range(sample)]
    t0 = time.perf_counter()
    hits = 0
    for j, s in pairs:
        if j.symmetricMatch(s):
            hits += 1
    return (time.perf_counter() - t0) / sample


#: runs a tree's bench/negotiation.py (argv[1:]) with its `negotiate` timed in CPU seconds
#: (an older bench prints wall clock only), printed as a last line of its own
_TIMED_BENCH = """
import os, runpy, sys
import services.negotiator as n
untimed, spent = n.negotiate, []
def negotiate(*a, **k):
    c0 = os.times()
    out = untimed(*a, **k)
    spent.append(sum(os.times()[:4]) - sum(c0[:4]))
    return out
n.negotiate = negotiate
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"cycle_cpu_seconds={sum(spent):.3f}", flush=True)
"""


def baseline_cycle(tree: str, args: argparse.Namespace) -> tuple[float, float]:
    """cycle_seconds of `tree`'s bench/negotiation.py on the same pool (its last line but
    one) and the CPU seconds of its cycle (`_TIMED_BENCH`)."""
    cmd = [sys.executable, "-c", _TIMED_BENCH, os.path.join(tree, "bench", "negotiation.py"),
           "--slots", str(args.slots), "--jobs", str(args.jobs), "--autoclusters",
           str(args.autoclusters), "--submitters", str(args.submitters), "--sample", "100"]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    *_, bench_line, cpu_line = out.stdout.strip().splitlines()
    last = dict(kv.split("=", 1) for kv in bench_line.split())
    return float(last["cycle_seconds"]), float(cpu_line.split("=", 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=20_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--autoclusters", type=int, default=500)
    ap.add_argument("--submitters", type=int, default=200)
    ap.add_argument("--sample", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=NegotiatorConfig.negotiator_workers,
                    help="NEGOTIATOR_WORKERS for the cycle")
    ap.add_argument("--assume-idle-core", action="store_true",
                    help="fork the children even when the load leaves no core idle (to "
                         "measure the two-core path on a shared machine)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="a checkout whose bench/negotiation.py times the same pool first")
    args = ap.parse_args(argv)
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "bench", "negotiation.py")):
        ap.error(f"--baseline {args.baseline}: no bench/negotiation.py there")

    if args.assume_idle_core:
        matchmaker._spare_core = lambda: True
    rng = random.Random(20260101)
    users = [f"user{u:03d}@example.org" for u in range(args.submitters)]
    progress(f"building {args.slots} slots, {args.jobs} jobs in {args.autoclusters} "
             f"autoclusters from {args.submitters} submitters")
    slots = make_slots(args.slots, rng, users)
    jobs = make_jobs(args.jobs, args.autoclusters, users, rng)
    usage: dict[str, float] = {}
    for s in slots:
        if s.get("State") == "Claimed":
            usage[s["RemoteUser"]] = usage.get(s["RemoteUser"], 0.0) + 1.0
    subs = [SubmitterInput(u, eup=0.5 + 1000.0 * (1 + (k % 17)) * (usage.get(u, 0.0) + 0.5),
                           weighted_usage=usage.get(u, 0.0)) for k, u in enumerate(users)]
    snap = CycleInput(now=1_700_000_000.0, cycle=1, submitters=subs, slots=slots, jobs=jobs)
    progress("negotiating one cycle ...")
    t0, cpu0 = time.perf_counter(), os.times()
    cfg = NegotiatorConfig(negotiator_workers=args.workers)
    result, rss_before, rss_peak = with_peak_rss(lambda: negotiate(snap, cfg))
    cycle = time.perf_counter() - t0
    cpu1 = os.times()
    cpu = sum(cpu1[:4]) - sum(cpu0[:4])  # this process's and the child's, user and system
    parent_cpu = sum(cpu1[:2]) - sum(cpu0[:2])  # this process's only
    child_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    c = result.counters
    peak_gb = (rss_peak - rss_before) / 2**30
    progress(f"memory: {rss_before / 2**30:.2f} GB resident before the cycle (the input), "
             f"peak {rss_peak / 2**30:.2f} GB during it: the negotiation took {peak_gb:.2f} GB")
    if c["queue_workers"] > 1 or c.get("match_workers", 1) > 1:
        progress(f"forked children (job queues {c['queue_workers'] > 1}, match lists "
                 f"{c.get('prefetched', 0)}): peak {child_gb:.2f} GB, mostly shared with this one")
    else:
        progress("one process: no idle core (or NEGOTIATOR_WORKERS 1, or a small cycle)")
    progress(f"cycle done in {cycle:.2f}s ({cpu:.2f}s of CPU): {len(result.matches)} matches, "
             f"{len(result.dynamic_slots)} dynamic slots, {c['autoclusters']} autoclusters, "
             f"{c['spins']} spins, {c['rows_column']} rows by columns, "
             f"{c['pairs_classad']} pairs by classad2, {c['rejected_jobs']} rejected jobs")
    base = base_cpu = None
    if args.baseline:
        progress(f"timing the baseline {args.baseline} on the same pool ...")
        try:
            base, base_cpu = baseline_cycle(args.baseline, args)
        except (subprocess.CalledProcessError, KeyError, ValueError) as exc:
            print(f"bench: the baseline {args.baseline} failed: {exc}", file=sys.stderr)
            return 1
        progress(f"baseline cycle: {base:.2f}s, this tree's {cycle:.2f}s: {base / cycle:.2f}x; "
                 f"CPU {base_cpu:.2f}s vs {cpu:.2f}s: {base_cpu / cpu:.2f}x")
    progress(f"timing the naive baseline on {args.sample} sampled pairs ...")
    per_pair = naive_pair_seconds(slots, jobs, args.sample, rng)
    naive = per_pair * args.jobs * args.slots
    progress(f"naive: {per_pair * 1e6:.2f} us/pair x {args.jobs * args.slots:,} pairs "
             f"= {naive:,.0f}s (extrapolated)")
    print(f"seconds={cycle:.3f} cycle_seconds={cycle:.3f} cycle_cpu_seconds={cpu:.3f} "
          f"cycle_parent_cpu_seconds={parent_cpu:.3f} naive_seconds={naive:.1f} "
          f"speedup_vs_naive={naive / cycle:.1f} matches={len(result.matches)} "
          f"slots={args.slots} jobs={args.jobs} autoclusters={c['autoclusters']} "
          f"submitters={args.submitters} pairs_classad={c['pairs_classad']} "
          f"rows_column={c['rows_column']} naive_us_per_pair={per_pair * 1e6:.3f} "
          f"process_peak_rss_gb={rss_peak / 2**30:.3f} peak_rss_gb={peak_gb:.3f} "
          f"workers={c['queue_workers']} match_workers={c.get('match_workers', 1)} "
          f"prefetched={c.get('prefetched', 0)} child_peak_rss_gb={child_gb:.3f}"
          + (f" baseline_cycle_seconds={base:.3f} speedup_vs_baseline={base / cycle:.2f}"
             f" baseline_cycle_cpu_seconds={base_cpu:.3f}"
             f" speedup_vs_baseline_cpu={base_cpu / cpu:.2f}"
             if base is not None and base_cpu is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
