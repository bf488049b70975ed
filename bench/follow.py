"""Job event log following throughput: `follow events` against htcondor2's bare reader.

    python bench/follow.py [--jobs 5000] [--queued 0]

A schedd EVENT_LOG as tests/follow writes it (submit, execute, terminate per job, each followed
by its job ad information event: six log events, three job.* events per job) is read
  (a) baseline: `htcondor2.JobEventLog(path).events(0)`, iterated to the end, nothing else;
  (b) the follower: the same reader plus conversion, appends to a fresh embedded log and the
      position stored in the same transaction, in polls of 5,000 events (`Follower.poll`).
`--queued N` first submits N jobs that stay queued, so every commit also stores their carry
(the follower's per-job memory: its cost grows with the queue). The last line is key=value.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import htcondor2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.follow.eventlog import JobEventLogFollower  # noqa: E402
from tests.follow.helpers import event_log, job_lifecycle, submit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--queued", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "EventLog"
        with open(path, "w") as out:
            for n in range(args.queued):
                out.write(submit(f"{900000 + n}.0", "09:00:00"))
            for n in range(args.jobs):
                out.write(job_lifecycle(n))
        t0 = time.perf_counter()
        raw = sum(1 for _ in htcondor2.JobEventLog(str(path)).events(0))
        reader_s = time.perf_counter() - t0
        elog = event_log(Path(tmp) / "home")
        f = JobEventLogFollower(elog, path, schedd="ap1", uid_domain="example.org")
        t0 = time.perf_counter()
        report = f.poll()
        follow_s = time.perf_counter() - t0
        assert report.events == args.queued + 3 * args.jobs, report
        print(f"log events {raw}: reader {reader_s:.2f} s ({raw / reader_s:,.0f}/s), follower "
              f"{follow_s:.2f} s ({raw / follow_s:,.0f} log events/s, "
              f"{report.events / follow_s:,.0f} job events/s), ratio {follow_s / reader_s:.1f}")
        print(f"log_events={raw} reader_per_s={raw / reader_s:.0f} "
              f"follow_per_s={raw / follow_s:.0f} ratio={follow_s / reader_s:.2f} "
              f"queued={args.queued}")


if __name__ == "__main__":
    main()
