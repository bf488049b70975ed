"""Start-up time of the CLI against the interpreter's own, in one run.

    python bench/startup.py [--repeat 7]

Each is a fresh process, as a user starts it, timed on the wall clock (median of --repeat):
  python:   `python -c pass` (the floor: the interpreter and site);
  help:     `poolledger --help` (every command's parser: what each command costs to import);
  userprio: `poolledger userprio` on a small run's log, answered from the snapshot the run
            left (restoring it and formatting the table; no fold).
The run (`poolledger run small --hours 2`) is made once in a temp directory, not measured.
Beside each wall time, the CPU time (user + system, median) of the same runs: on a shared
machine the wall time moves with the load, the CPU time much less.
Target (issue 26): help and userprio under 0.5 s. The last line is key=value pairs.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    """The median wall time and CPU time of running `argv` `repeat` times (each must exit 0)."""
    times, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(times), statistics.median(cpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("POOLLEDGER_HOME", None)
    cli = [sys.executable, "-m", "services.cli"]
    home = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        subprocess.run([*cli, "run", "small", "--hours", "2", "--quiet", "--no-history",
                        "--out", str(home)], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        python_s, python_cpu = timed([sys.executable, "-c", "pass"], env, args.repeat)
        help_s, help_cpu = timed([*cli, "--help"], env, args.repeat)
        userprio_s, userprio_cpu = timed([*cli, "--home", str(home), "userprio"], env,
                                         args.repeat)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"python -c pass:             {python_s:.3f} s (CPU {python_cpu:.3f} s)")
    print(f"poolledger --help:          {help_s:.3f} s ({help_s / python_s:.1f}x python; "
          f"CPU {help_cpu:.3f} s)")
    print(f"poolledger userprio (snap): {userprio_s:.3f} s ({userprio_s / python_s:.1f}x python; "
          f"CPU {userprio_cpu:.3f} s)")
    print(f"python_s={python_s:.3f} help_s={help_s:.3f} userprio_s={userprio_s:.3f} "
          f"help_over_python={help_s / python_s:.2f} userprio_over_python={userprio_s / python_s:.2f} "
          f"python_cpu_s={python_cpu:.3f} help_cpu_s={help_cpu:.3f} "
          f"userprio_cpu_s={userprio_cpu:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
