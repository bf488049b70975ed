"""The main job end to end: `poolledger run scenarios/fairshare.toml`, this tree against a baseline.

    python bench/simulation.py [--baseline DIR] [--hours N] [--repeat N] [--scenario PATH]

Seed 000's fair-share example (100 cores, 10,000 jobs, 72 h of event time, a negotiation cycle
a minute: 4,321 cycles) run as a user runs it: a fresh `python -m services.cli run` process
with the default seed, its embedded log, exported events and history database in a temp
directory (`--quiet`: no progress bar). Per run:
  run_seconds:   the process's wall clock, start to exit (the loop, the export, the history
                 database, the plots);
  loop_seconds:  the loop alone (the run's own "Virtual time: ... in X s");
  cycle_ms_mean: the negotiation cycles' mean duration as the run records it (the snapshot
                 of the ledger plus the matchmaker: `negotiation.cycle`'s `duration`);
  loop_ms_per_cycle: loop_seconds over the cycles, everything a cycle drives included (the
                 pool's reaction, the log appends and folds, the negotiator's ads);
  cpu_seconds:   the process's user + system time (less disturbed by the machine's other work);
  peak_rss_gb:   the process's peak resident set.
`--baseline DIR` runs DIR's tree (another checkout, e.g. /work/wt/base: main with its compiled
core) on the same scenario, alternating with this tree (A B A B over `--repeat`), and checks
that both wrote the same events: the logs are compared with what depends on the wall clock
left out (cycle durations and the Negotiator ad's statistics derived from them).
Target (issue 27): at least 12 times faster than main (72 h in 30 s or less), a 100-slot
cycle in 5 ms or less. `--hours N` shortens the run for quick iterations. The last line is
key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scenarios/fairshare.toml"
#: what the wall clock decides in a run's log: the cycle's duration and the Negotiator ad's
#: statistics computed from it
_WALL_CLOCK_ATTR = re.compile(r"LastNegotiationCycle(End|Period|Duration|MatchRate|MatchRateSustained)\d*")


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Run:
    """One `poolledger run`'s figures."""

    run_seconds: float
    loop_seconds: float
    cpu_seconds: float
    cycles: int
    cycle_ms_mean: float
    peak_rss_gb: float
    events: list[bytes]

    @property
    def loop_ms_per_cycle(self) -> float:
        return 1000.0 * self.loop_seconds / max(1, self.cycles)


def _figure(pattern: str, text: str, tree: Path) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise SystemExit(f"bench: {tree}: the run printed no {pattern!r}; its output:\n{text}")
    return found.group(1)


def normalized_events(path: Path) -> list[bytes]:
    """The run's exported events with what the wall clock decides left out."""
    out = []
    with path.open("rb") as f:
        for line in f:
            event = orjson.loads(line)
            data = event.get("data")
            if isinstance(data, dict):
                data.pop("duration", None)
                ad = data.get("ad")
                if isinstance(ad, dict) and ad.get("MyType") == "Negotiator":
                    for key in [k for k in ad if _WALL_CLOCK_ATTR.fullmatch(k)]:
                        del ad[key]
            out.append(orjson.dumps(event, option=orjson.OPT_SORT_KEYS))
    return out


def run_tree(tree: Path, scenario: str, hours: float | None) -> Run:
    """`poolledger run` of `scenario` with `tree`'s code, in a fresh temp directory."""
    out = Path(tempfile.mkdtemp(prefix="bench-simulation-"))
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("POOLLEDGER_HOME", None)
    argv = [sys.executable, "-m", "services.cli", "run", scenario, "--quiet", "--out", str(out)]
    if hours is not None:
        argv += ["--hours", f"{hours:g}"]
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        text = proc.stdout.read().decode(errors="replace")
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"bench: {tree}: poolledger run exited {proc.returncode}:\n{text}")
        return Run(
            run_seconds=wall,
            loop_seconds=float(_figure(r"Virtual time: [\d.]+ h in ([\d.]+) s", text, tree)),
            cpu_seconds=usage.ru_utime + usage.ru_stime,
            cycles=int(_figure(r"Negotiation cycles: (\d+)", text, tree)),
            cycle_ms_mean=float(_figure(r"cycle duration mean ([\d.]+) ms", text, tree)),
            peak_rss_gb=usage.ru_maxrss / 1e6,  # ru_maxrss is in KiB on Linux
            events=normalized_events(out / "events.jsonl"))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def describe(label: str, runs: list[Run]) -> None:
    r = runs
    print(f"{label:9} run {statistics.median(x.run_seconds for x in r):8.2f} s   "
          f"loop {statistics.median(x.loop_seconds for x in r):8.2f} s   "
          f"cpu {statistics.median(x.cpu_seconds for x in r):8.2f} s   "
          f"cycle {statistics.median(x.cycle_ms_mean for x in r):7.2f} ms   "
          f"loop/cycle {statistics.median(x.loop_ms_per_cycle for x in r):7.2f} ms   "
          f"peak RSS {max(x.peak_rss_gb for x in r):.2f} GB   "
          f"({r[0].cycles} cycles, {len(r[0].events):,} events; runs "
          + ", ".join(f"{x.run_seconds:.1f}" for x in r) + " s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", metavar="DIR", type=Path,
                    help="another checkout to run the same scenario with (e.g. /work/wt/base)")
    ap.add_argument("--hours", type=float, default=None,
                    help="virtual hours to run (default: the scenario's 72)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each tree, alternating")
    ap.add_argument("--scenario", default=SCENARIO)
    args = ap.parse_args()
    if args.baseline is not None and not (args.baseline / "services" / "cli.py").is_file():
        ap.error(f"--baseline {args.baseline}: no services/cli.py there")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    mine: list[Run] = []
    base: list[Run] = []
    for i in range(args.repeat):
        progress(f"run {i + 1}/{args.repeat}: this tree ({ROOT}) ...")
        mine.append(run_tree(ROOT, args.scenario, args.hours))
        progress(f"  {mine[-1].run_seconds:.1f} s")
        if args.baseline is not None:
            progress(f"run {i + 1}/{args.repeat}: the baseline ({args.baseline}) ...")
            base.append(run_tree(args.baseline.resolve(), args.scenario, args.hours))
            progress(f"  {base[-1].run_seconds:.1f} s")
    describe("this tree", mine)
    run_s = statistics.median(x.run_seconds for x in mine)
    cycle_ms = statistics.median(x.cycle_ms_mean for x in mine)
    rss = max(x.peak_rss_gb for x in mine)
    same = all(x.events == mine[0].events for x in mine)
    tail = ""
    if base:
        describe("baseline", base)
        base_s = statistics.median(x.run_seconds for x in base)
        base_cycle = statistics.median(x.cycle_ms_mean for x in base)
        base_cpu = statistics.median(x.cpu_seconds for x in base)
        cpu = statistics.median(x.cpu_seconds for x in mine)
        same = same and all(x.events == mine[0].events for x in base)
        print(f"speed-up: {base_s / run_s:.1f}x end to end ({base_cpu / cpu:.1f}x in CPU time), "
              f"cycles {base_cycle / cycle_ms:.1f}x; same events as the baseline: {same}")
        tail = (f" baseline_run_seconds={base_s:.2f} baseline_cycle_ms_mean={base_cycle:.2f}"
                f" baseline_cpu_seconds={base_cpu:.2f} speedup={base_s / run_s:.2f}"
                f" speedup_cpu={base_cpu / cpu:.2f} cycle_speedup={base_cycle / cycle_ms:.2f}")
    print(f"run_seconds={run_s:.2f} cycle_ms_mean={cycle_ms:.2f}"
          f" loop_ms_per_cycle={statistics.median(x.loop_ms_per_cycle for x in mine):.2f}"
          f" cpu_seconds={statistics.median(x.cpu_seconds for x in mine):.2f}"
          + tail + f" peak_rss_gb={rss:.2f} same_events={same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
