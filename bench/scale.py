"""A synthetic week of a 200,000-slot pool's log folded by the embedded runner: events/s, the
ledger's peak memory and `userprio` answered from the snapshot it leaves.

    python bench/scale.py [--slots 200000] [--days 7] [--jobs 500000] [--refresh 86400]
                          [--baseline /work/wt/base] [--baseline-events 1000000]

The week (deterministic, `week_events`): `--slots` static slots, 8 per machine (25,000
machines by default), ~25 attributes each (bench/accounting.py's slot ad); 1,000 submitters
in the mixed config's groups and `<none>`, 20 schedds. What is logged, and why not more:
  - every slot advertised in the first 10 minutes, then on each state change (Claimed when a
    job starts, Unclaimed when it stops) and re-advertised every `--refresh` seconds with
    ClassAdLifetime 3 x refresh. (HTCondor's startd re-sends its ad every UPDATE_INTERVAL,
    300 s: a literal week is 403M updates that change nothing the folds keep; the refresh
    is what keeps the collector's fold from expiring an ad.)
  - each slot runs jobs back to back, `--jobs` lifecycles in the week in all: a job is
    submitted, waits (mean 5 min), runs (exponential, with the mean that fits `--jobs` in:
    ~67 h by default, a pilot-like slot; 4M jobs of 8 h would be ~25M events), stops (85%
    completed, 10% evicted, 5% removed; an evicted one is queued again), and leaves its
    history ad; the slot stays idle a mean 10 min. Each lifecycle is 6 events with the ads.
  - a negotiation cycle every NEGOTIATOR_INTERVAL (60 s).
The log is generated once per parameter set, streamed in batches into an embedded log under
`compose.kafka.cache_root()/bench-scale/` (not measured; the default week is 4,902,710
events, ~4 GB, plus ~1.3 GB for the 4 snapshots kept; ~5 minutes unloaded); only one is kept
(another parameter set replaces it).

Measured, each fold in a fresh process so its memory is the fold's, not the generator's:
  (a) the embedded runner (`streams.runner.EmbeddedRunner.run_once`, as `poolledger run`
      folds: a snapshot every 1,000,000 events and at the end, the stored ones dropped first
      so each run folds from the start; its derived events are not appended, so a rerun does
      not grow the log: bench/log_throughput.py measures appends): events/s, and the fold's
      RSS: peak (ru_maxrss) minus the process's RSS before the fold (`ledger_rss_gb`), and
      what the ledger still holds at the end;
  (b) `userprio` (`services.cli.main`, in this process) from the runner's snapshot: best
      of `--repeat`; it reads and parses only the snapshot's small rows (the submitter
      records), never the collector's 200,000 ads, the queue or the per-slot match records
      (snapshot sections, read on first use: streams/snapshot.py);
  (c) the baseline: the first `--baseline-events` events decoded and folded into a fresh
      `Ledger` (the replay loop, no snapshots) on this tree and on `--baseline`'s (7f7e9c6,
      compiled in place: "today") in the same run; their ratio.
Targets (issue 17): ledger_rss_gb <= 4, userprio_seconds < 2. The last line is key=value.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
# the repository, not bench/ (whose adstash.py would shadow the adstash package the CLI loads)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accounting import GROUP_PREFIXES, _slot_ad, progress  # noqa: E402
from compose.kafka import cache_root  # noqa: E402
from schemas.events import (AdUpdated, Envelope, JobHistory, JobStarted, JobStopped,  # noqa: E402
                            JobSubmitted, NegotiationCycled, Payload, make_event)
from streams.synthetic import LIMITS, START, mixed_config  # noqa: E402

CHUNK = 50_000
CYCLE = 60.0  # NEGOTIATOR_INTERVAL's default
SUBMITTERS = 1000
SCHEDDS = 20
# what happens next on a slot (heap entries: time, slot, step)
_ADVERTISE, _REFRESH, _SUBMIT, _START, _STOP, _CYCLE = range(6)


def week_events(slots: int, days: float, runtime: float, refresh: float,
                seed: int = 17) -> Iterator[Envelope]:
    """The week's events in event-time order (deterministic for a seed)."""
    rng = random.Random(seed)
    end = START + days * 86400.0
    seqs: dict[str, int] = {}
    users = [f"{GROUP_PREFIXES[i % len(GROUP_PREFIXES)]}u{i:04d}@example.org"
             for i in range(SUBMITTERS)]
    schedds = [f"schedd@ap{i:02d}.example.org" for i in range(SCHEDDS)]
    lifetime = int(3 * refresh)
    job: list[tuple[str, str, str, str] | None] = [None] * slots  # jid, user, schedd, limits
    cluster = 0

    def ev(payload: Payload, source: str, ts: float) -> Envelope:
        seqs[source] = seqs.get(source, 0) + 1
        return make_event(payload, ts=ts, source=source, seq=seqs[source])

    def slot_ad(i: int, state: str, ts: float) -> Envelope:
        machine = f"ep{i // 8:05d}.example.org"
        name = f"slot{i % 8 + 1}@{machine}"
        ad = _slot_ad(name, machine, i % 8 + 1, 1 + (i % 3 == 0), state)
        ad["ClassAdLifetime"] = lifetime
        return ev(AdUpdated("Machine", name, ad), f"startd@{machine}", ts)

    heap: list[tuple[float, int, int]] = [(START + 600.0 * i / slots, i, _ADVERTISE)
                                          for i in range(slots)]
    heap.append((START + CYCLE, -1, _CYCLE))
    heapq.heapify(heap)
    cycle = 0
    while heap:
        ts, i, step = heapq.heappop(heap)
        if ts >= end:
            return
        if step == _CYCLE:
            cycle += 1
            yield ev(NegotiationCycled("negotiator@cm", cycle, ts), "negotiator@cm", ts)
            heapq.heappush(heap, (ts + CYCLE, -1, _CYCLE))
        elif step == _ADVERTISE:
            yield slot_ad(i, "Unclaimed", ts)
            heapq.heappush(heap, (ts + refresh, i, _REFRESH))
            heapq.heappush(heap, (ts + rng.expovariate(1 / 600.0), i, _SUBMIT))
        elif step == _REFRESH:
            yield slot_ad(i, "Unclaimed" if job[i] is None else "Claimed", ts)
            heapq.heappush(heap, (ts + refresh, i, _REFRESH))
        elif step == _SUBMIT:
            cluster += 1
            user = users[int(rng.paretovariate(1.2)) % SUBMITTERS]
            schedd = schedds[cluster % SCHEDDS]
            jid = f"{cluster}.0"
            job[i] = (jid, user, schedd, rng.choice(LIMITS))
            yield ev(JobSubmitted(jid, schedd, user, {
                "ClusterId": cluster, "ProcId": 0, "Owner": user.split("@")[0].split(".")[-1],
                "RequestCpus": 1, "RequestMemory": 2048, "JobUniverse": 5, "QDate": int(ts),
                "AccountingGroup": user.split("@")[0],
                "Requirements": "/Expr(TARGET.Memory >= RequestMemory)/"}), schedd, ts)
            heapq.heappush(heap, (ts + rng.expovariate(1 / 300.0), i, _START))
        elif step == _START:
            held = job[i]
            assert held is not None
            jid, user, schedd, limits = held
            cpus = 1 + (i % 3 == 0)
            ad = slot_ad(i, "Claimed", ts)
            yield ev(JobStarted(jid, schedd, user, ad.data.name, float(cpus),  # type: ignore[union-attr]
                                {"Cpus": cpus}, limits), schedd, ts)
            yield ad
            heapq.heappush(heap, (ts + rng.expovariate(1 / runtime), i, _STOP))
        else:  # _STOP
            held = job[i]
            assert held is not None
            jid, user, schedd, _ = held
            machine = f"ep{i // 8:05d}.example.org"
            name = f"slot{i % 8 + 1}@{machine}"
            reason = rng.choices(("completed", "evicted", "removed"), (85, 10, 5))[0]
            yield ev(JobStopped(jid, name, reason, schedd, user), schedd, ts)  # type: ignore[arg-type]
            if reason == "evicted":  # queued again, to start on this slot after a wait
                heapq.heappush(heap, (ts + rng.expovariate(1 / 300.0), i, _START))
            else:
                job[i] = None
                yield ev(JobHistory({
                    "GlobalJobId": f"{schedd.split('@')[1]}#{jid}#{int(START)}",
                    "ClusterId": int(jid.split(".")[0]), "ProcId": 0,
                    "Owner": user.split("@")[0], "JobStatus": 4 if reason == "completed" else 3,
                    "LastRemoteHost": name, "CompletionDate": int(ts)}), schedd, ts)
                heapq.heappush(heap, (ts + rng.expovariate(1 / 600.0), i, _SUBMIT))
            yield slot_ad(i, "Unclaimed", ts)


def prepare(root: Path, params: dict[str, Any]) -> dict[str, int]:
    """The log of `params` under `root` (generated when missing; one kept): events by type."""
    home = root / "-".join(f"{k}{v:g}" for k, v in params.items())
    done = home / "complete.json"
    if done.exists():
        return json.loads(done.read_text())  # type: ignore[no-any-return]
    shutil.rmtree(root, ignore_errors=True)
    home.mkdir(parents=True)
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.log.port import TopicSpec
    from streams.log.topics import DERIVED, EVENTS

    progress(f"generating the week ({params}) in {home} (once) ...")
    t0 = time.perf_counter()
    kinds: dict[str, int] = {}
    with EmbeddedLog(home / "log") as log:
        elog = EventLog(log, batch=CHUNK)
        for topic in (EVENTS, DERIVED):
            log.create_topic(TopicSpec(topic))
        chunk: list[Envelope] = []
        written = 0
        for env in week_events(params["slots"], params["days"], params["runtime"],
                               params["refresh"]):
            chunk.append(env)
            kinds[env.type] = kinds.get(env.type, 0) + 1
            if len(chunk) >= CHUNK:
                elog.append(EVENTS, chunk)
                written += len(chunk)
                chunk = []
                if written % 500_000 == 0:
                    progress(f"  {written:,} events ({written / (time.perf_counter() - t0):,.0f}/s)")
        if chunk:
            elog.append(EVENTS, chunk)
    size = (home / "log" / "log.sqlite").stat().st_size
    progress(f"generated {sum(kinds.values()):,} events in {time.perf_counter() - t0:.0f} s, "
             f"{size / 1e9:.2f} GB")
    done.write_text(json.dumps(kinds))
    return kinds


# --------------------------------------------------------------------------- child folds

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child_runner(home: Path, config: Path) -> dict[str, Any]:
    """(a), in a fresh process: the embedded runner folds the whole log and snapshots."""
    import resource

    from schemas.settings import load_settings
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.runner import EmbeddedRunner

    settings = load_settings(config)
    with EmbeddedLog(home / "log") as log:
        for name in log.state_names():  # a fresh fold each run: no snapshot to resume from
            log.drop_state(name)
        start = _rss_bytes()
        t0 = time.perf_counter()
        runner = EmbeddedRunner(EventLog(log), settings, derived_topic=None)
        n = runner.run_once(every=500_000, progress=lambda k: progress(
            f"  (a) {k:,} events ({k / (time.perf_counter() - t0):,.0f}/s)"))
        seconds = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        held = _rss_bytes()
        return {"events": n, "seconds": seconds, "peak_growth": peak - start,
                "held": held - start, "ads": len(runner.ledger.current_ads("Machine")),
                "jobs": sum(1 for _ in runner.ledger.job_records())}


def _child_prefix(home: Path, config: Path, limit: int) -> dict[str, Any]:
    """(c), in a fresh process with this tree or the baseline's first on the path: the first
    `limit` events decoded and folded into a fresh ledger (APIs both trees have)."""
    from schemas.settings import load_settings
    from streams.core.ledger import Ledger
    from streams.gcpolicy import long_fold
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.log.topics import EVENTS

    ledger = Ledger(load_settings(config))
    n = 0
    with EmbeddedLog(home / "log") as log, long_fold():
        t0 = time.perf_counter()
        for _record, env in EventLog(log).read(EVENTS):
            ledger.apply(env)
            n += 1
            if n >= limit:
                break
        seconds = time.perf_counter() - t0
    compiled = Path(sys.modules[Ledger.__module__].__file__ or "").suffix == ".so"
    return {"events": n, "seconds": seconds, "compiled": compiled}


def _in_child(root: Path, fn: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", fn, *args],
                         env=env, cwd=root, stdout=subprocess.PIPE, check=True)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=200_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--jobs", type=int, default=500_000, help="job lifecycles in the week")
    ap.add_argument("--refresh", type=float, default=86_400.0,
                    help="seconds between a slot's unchanged re-advertisements")
    ap.add_argument("--repeat", type=int, default=3, help="runs of (b); the best counts")
    ap.add_argument("--baseline", type=Path, default=Path("/work/wt/base"),
                    help="a checkout of the baseline commit (compiled in place)")
    ap.add_argument("--baseline-events", type=int, default=1_000_000)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn, *rest = args.child
        if fn == "runner":
            print(json.dumps(_child_runner(Path(rest[0]), Path(rest[1]))))
        else:
            print(json.dumps(_child_prefix(Path(rest[0]), Path(rest[1]), int(rest[2]))))
        return

    root = cache_root() / "bench-scale"
    # the mean runtime that fits --jobs in: a slot's cycle is wait + runtime + idle (900 s)
    runtime = max(60.0, args.slots * args.days * 86400.0 / max(1, args.jobs) - 900.0)
    params = {"slots": args.slots, "days": args.days, "runtime": round(runtime),
              "refresh": args.refresh}
    kinds = prepare(root, params)
    home = root / "-".join(f"{k}{v:g}" for k, v in params.items())
    total = sum(kinds.values())
    progress(f"the week: {total:,} events: " + ", ".join(
        f"{k} {v:,}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    config = home / "mixed.conf"
    config.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))

    progress("(a) the embedded runner folds the week (fresh process) ...")
    run = _in_child(ROOT, "runner", str(home), str(config))
    fold_eps = run["events"] / run["seconds"]
    rss_gb = run["peak_growth"] / 2**30
    progress(f"(a) {run['events']:,} events in {run['seconds']:.1f} s: {fold_eps:,.0f} events/s; "
             f"RSS growth peak {rss_gb:.2f} GB, held at the end {run['held'] / 2**30:.2f} GB; "
             f"{run['ads']:,} slot ads and {run['jobs']:,} queued jobs at the end")

    # imported here: the baseline's child runs this file on the baseline's tree, which may
    # lack what bench.queries imports (streams.snapshot's SECTIONS)
    from bench.queries import userprio
    fast = [userprio(home, config) for _ in range(args.repeat)]
    up_s = min(s for s, _ in fast)
    progress(f"(b) userprio from the snapshot: best {up_s:.3f} s of {args.repeat} "
             f"({len(fast[0][1].splitlines())} lines)")

    n = min(args.baseline_events, total)
    head = _in_child(ROOT, "prefix", str(home), str(config), str(n))
    head_eps = head["events"] / head["seconds"]
    progress(f"(c) this tree ({'compiled' if head['compiled'] else 'plain Python'}): first "
             f"{n:,} events folded at {head_eps:,.0f} events/s")
    base_eps = float("nan")
    if (args.baseline / "streams" / "core").is_dir():
        base = _in_child(args.baseline, "prefix", str(home), str(config), str(n))
        base_eps = base["events"] / base["seconds"]
        progress(f"(c) baseline {args.baseline} ({'compiled' if base['compiled'] else 'plain'}"
                 f"): {base_eps:,.0f} events/s; this tree is {head_eps / base_eps:.2f}x")
    else:
        progress(f"(c) no baseline at {args.baseline}: skipped")
    progress(f"targets: ledger RSS <= 4 GB: {'met' if rss_gb <= 4 else 'NOT met'}; userprio "
             f"< 2 s: {'met' if up_s < 2 else 'NOT met'}")
    print(f"slots={args.slots} days={args.days:g} events={run['events']} fold_eps={fold_eps:.0f} "
          f"fold_seconds={run['seconds']:.1f} ledger_rss_gb={rss_gb:.2f} "
          f"ledger_held_gb={run['held'] / 2**30:.2f} userprio_seconds={up_s:.3f} "
          f"prefix_events={n} prefix_eps={head_eps:.0f} baseline_prefix_eps={base_eps:.0f} "
          f"vs_baseline={head_eps / base_eps:.2f}")


if __name__ == "__main__":
    main()
